//! Authentication: `Authorization: Bearer <api key>` decides the app and the subject.
//! Subjects come from here, never from a request body.

use crate::error::ApiError;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
#[cfg(test)]
use tollgate_core::SubjectKind;
use tollgate_core::{AppId, Subject, Visibility};

/// Header a key allowed to do so uses to name the subject it acts for.
pub const SUBJECT_HEADER: &str = "x-tollgate-subject";

/// One configured key: a plain string, or a table with its own subject and whether it
/// may assert another subject per request.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum KeyConfig {
    /// A key with no subject of its own.
    Plain(String),
    /// A key with options.
    Detailed {
        /// The secret.
        key: String,
        /// The key's own subject, `user:<id>` or `service:<id>`.
        #[serde(default)]
        subject: Option<String>,
        /// Whether `X-Tollgate-Subject` may name the subject per request.
        #[serde(default)]
        may_assert_subject: bool,
    },
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The app the key belongs to.
    pub app: AppId,
    /// The subject the call acts for.
    pub subject: Option<Subject>,
    /// What the caller may see in its app: a key bound to a subject (that may not assert
    /// others) sees only that subject's tasks and runs; any other key the app's.
    pub visibility: Visibility,
}

#[derive(Debug, Clone)]
struct KeyEntry {
    app: AppId,
    subject: Option<Subject>,
    may_assert_subject: bool,
}

/// The key table. Keys are held as SHA-256 digests, so lookups compare digests, not
/// secrets, and a timing difference reveals nothing about a key.
#[derive(Debug, Clone, Default)]
pub struct Auth {
    keys: HashMap<[u8; 32], KeyEntry>,
}

/// Parses `user:<id>` or `service:<id>`; the id follows the identifier rule
/// ([`tollgate_core::check_identifier`]).
pub fn parse_subject(text: &str) -> Result<Subject, String> {
    Subject::parse(text).map_err(|e| e.to_string())
}

/// The one value of a header, UTF-8 decoded (`None` when absent). Two of it are refused
/// (which one would count is ambiguous), and so are bytes that are not UTF-8.
pub fn single_header<'h>(headers: &'h HeaderMap, name: &str) -> Result<Option<&'h str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(ApiError::ambiguous(format!(
            "two {name} headers: send it once"
        )));
    }
    std::str::from_utf8(value.as_bytes())
        .map(Some)
        .map_err(|_| ApiError::malformed(format!("the {name} header is not UTF-8 text")))
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Whether `given` is `secret`, compared by digest (no early exit on the secret's bytes).
pub(crate) fn same_secret(given: &str, secret: &str) -> bool {
    digest(given) == digest(secret)
}

impl Auth {
    /// Builds the table; every problem names the setting (`apps.<app>.api_keys[i]`).
    pub fn new(apps: &[(AppId, Vec<KeyConfig>)]) -> Result<Auth, String> {
        let mut keys = HashMap::new();
        for (app, configured) in apps {
            for (i, k) in configured.iter().enumerate() {
                let at = format!("apps.{app}.api_keys[{i}]");
                let (secret, subject, may_assert) = match k {
                    KeyConfig::Plain(s) => (s.clone(), None, false),
                    KeyConfig::Detailed {
                        key,
                        subject,
                        may_assert_subject,
                    } => (
                        key.clone(),
                        subject
                            .as_deref()
                            .map(parse_subject)
                            .transpose()
                            .map_err(|e| format!("{at}.subject: {e}"))?,
                        *may_assert_subject,
                    ),
                };
                if secret.len() < 16 {
                    return Err(format!("{at}: an API key must be at least 16 characters"));
                }
                if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(format!("{at}: an API key must not contain spaces"));
                }
                let entry = KeyEntry {
                    app: app.clone(),
                    subject,
                    may_assert_subject: may_assert,
                };
                if keys.insert(digest(&secret), entry).is_some() {
                    return Err(format!("{at}: the same key is configured twice"));
                }
            }
        }
        Ok(Auth { keys })
    }

    /// Whether no key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// The caller of a request, or 401 (no key, unknown key) / 403 (a subject the key
    /// may not assert) / 400 (a malformed subject).
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let text = single_header(headers, header::AUTHORIZATION.as_str())
            .map_err(|e| match e.status() {
                StatusCode::BAD_REQUEST if e.body().error.code == "ambiguous_request" => e,
                _ => ApiError::unauthorized("the Authorization header is not text"),
            })?
            .ok_or_else(|| ApiError::unauthorized("missing Authorization: Bearer <api key>"))?;
        let key = text
            .strip_prefix("Bearer ")
            .or_else(|| text.strip_prefix("bearer "))
            .map(str::trim)
            .ok_or_else(|| ApiError::unauthorized("use Authorization: Bearer <api key>"))?;
        let entry = self
            .keys
            .get(&digest(key))
            .ok_or_else(|| ApiError::unauthorized("unknown API key"))?;
        let subject = match single_header(headers, SUBJECT_HEADER)? {
            None => entry.subject.clone(),
            Some(text) => {
                if !entry.may_assert_subject {
                    return Err(ApiError::new(
                        StatusCode::FORBIDDEN,
                        "subject_not_allowed",
                        "this API key may not assert a subject (X-Tollgate-Subject)",
                    ));
                }
                Some(parse_subject(text).map_err(ApiError::malformed)?)
            }
        };
        let visibility = match &entry.subject {
            Some(own) if !entry.may_assert_subject => Visibility::Subject(own.clone()),
            _ => Visibility::App,
        };
        Ok(Caller {
            app: entry.app.clone(),
            subject,
            visibility,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn auth() -> Auth {
        Auth::new(&[
            (
                AppId::new("acme").unwrap(),
                vec![KeyConfig::Plain("acme-key-0123456789".into())],
            ),
            (
                AppId::new("beta").unwrap(),
                vec![KeyConfig::Detailed {
                    key: "beta-key-0123456789".into(),
                    subject: Some("service:billing".into()),
                    may_assert_subject: true,
                }],
            ),
        ])
        .unwrap()
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn keys_decide_app_and_subject() {
        let a = auth();
        let c = a
            .authenticate(&headers(&[("authorization", "Bearer acme-key-0123456789")]))
            .unwrap();
        assert_eq!(c.app.as_str(), "acme");
        assert_eq!(c.subject, None);
        let c = a
            .authenticate(&headers(&[("authorization", "Bearer beta-key-0123456789")]))
            .unwrap();
        assert_eq!(c.subject.unwrap().id, "billing");
        let c = a
            .authenticate(&headers(&[
                ("authorization", "Bearer beta-key-0123456789"),
                ("x-tollgate-subject", "user:alice"),
            ]))
            .unwrap();
        assert_eq!(c.subject.unwrap().kind, SubjectKind::User);
    }

    #[test]
    fn visibility_follows_the_key() {
        let a = Auth::new(&[(
            AppId::new("acme").unwrap(),
            vec![
                KeyConfig::Plain("acme-key-0123456789".into()),
                KeyConfig::Detailed {
                    key: "alice-key-0123456789".into(),
                    subject: Some("user:alice".into()),
                    may_assert_subject: false,
                },
                KeyConfig::Detailed {
                    key: "svc-key-0123456789".into(),
                    subject: Some("service:svc".into()),
                    may_assert_subject: true,
                },
            ],
        )])
        .unwrap();
        let of = |key: &str| {
            a.authenticate(&headers(&[("authorization", &format!("Bearer {key}"))]))
                .unwrap()
                .visibility
        };
        assert_eq!(of("acme-key-0123456789"), Visibility::App);
        assert_eq!(
            of("alice-key-0123456789"),
            Visibility::Subject(Subject::parse("user:alice").unwrap())
        );
        assert_eq!(of("svc-key-0123456789"), Visibility::App);
    }

    #[test]
    fn repeated_headers_are_ambiguous_and_headers_are_utf8() {
        let a = auth();
        let mut h = HeaderMap::new();
        for _ in 0..2 {
            h.append(
                header::AUTHORIZATION,
                HeaderValue::from_static("Bearer acme-key-0123456789"),
            );
        }
        let e = a.authenticate(&h).unwrap_err();
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert!(e.body().error.message.contains("authorization"), "{e:?}");
        let mut h = headers(&[("authorization", "Bearer beta-key-0123456789")]);
        h.insert(
            SUBJECT_HEADER,
            HeaderValue::from_bytes("user:zoë".as_bytes()).unwrap(),
        );
        assert_eq!(a.authenticate(&h).unwrap().subject.unwrap().id, "zoë");
        h.insert(
            SUBJECT_HEADER,
            HeaderValue::from_bytes("user:a\u{202E}b".as_bytes()).unwrap(),
        );
        assert_eq!(
            a.authenticate(&h).unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn bad_keys_and_subjects_are_refused() {
        let a = auth();
        assert_eq!(
            a.authenticate(&headers(&[])).unwrap_err().status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            a.authenticate(&headers(&[("authorization", "Bearer nope-nope-nope-nope")]))
                .unwrap_err()
                .status(),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            a.authenticate(&headers(&[
                ("authorization", "Bearer acme-key-0123456789"),
                ("x-tollgate-subject", "user:alice"),
            ]))
            .unwrap_err()
            .status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            a.authenticate(&headers(&[
                ("authorization", "Bearer beta-key-0123456789"),
                ("x-tollgate-subject", "robot:alice"),
            ]))
            .unwrap_err()
            .status(),
            StatusCode::BAD_REQUEST
        );
        assert!(
            Auth::new(&[(
                AppId::new("x").unwrap(),
                vec![KeyConfig::Plain("short".into())]
            )])
            .is_err()
        );
    }
}
