//! Posting a body to the endpoint: docs/conformance.md#provider-pace pace and pauses, bounded retries with
//! backoff, bounded reading of the answer, and provider headers read defensively.

use super::OpenAiProvider;
use crate::metrics as m;
use crate::provider::ProviderError;
use crate::provider::pace::PaceTicket;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;
use std::time::Duration;

/// Longest excerpt of an error body kept in a message, in characters.
const MAX_BODY_EXCERPT: usize = 500;

impl OpenAiProvider {
    /// POSTs `body`, retrying what may succeed later. Returns the answer's JSON and, when
    /// paced, the ticket to settle with its usage. An answer body longer than
    /// `max_answer_bytes` is not read further.
    pub(super) async fn post(
        &self,
        body: &Value,
        estimate: u64,
        max_answer_bytes: usize,
    ) -> Result<(Value, Option<PaceTicket>), ProviderError> {
        let text = serde_json::to_string(body)
            .map_err(|e| ProviderError::Failed(format!("cannot encode the request: {e}")))?;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut attempt: u32 = 0;
        loop {
            let ticket = match &self.pace {
                Some(pace) => Some(pace.wait_turn(model, estimate).await),
                None => None,
            };
            let mut request = self
                .client
                .post(&self.endpoint)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(text.clone());
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let (message, retry_after) = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    match read_bounded(response, max_answer_bytes).await {
                        Ok(bytes) => return Ok((parse_json_body(bytes).await?, ticket)),
                        Err(ReadError::TooLarge) => {
                            return Err(ProviderError::OutputTooLarge(format!(
                                "the provider's answer is longer than {max_answer_bytes} bytes, \
                                 more than any output within the output limit needs \
                                 (max_output_bytes)"
                            )));
                        }
                        Err(ReadError::Http(e)) if is_transient(&e) => (describe(&e), None),
                        Err(ReadError::Http(e)) => return Err(ProviderError::Failed(describe(&e))),
                    }
                }
                Ok(response) => {
                    let status = response.status();
                    let retry_after = retry_after(response.headers());
                    let text = response.text().await.unwrap_or_default();
                    let message = format!("HTTP {status}: {}", excerpt(&text));
                    if status == StatusCode::TOO_MANY_REQUESTS {
                        metrics::counter!(m::PROVIDER_429S_TOTAL, "provider" => self.name.clone())
                            .increment(1);
                        if let Some(pace) = &self.pace {
                            // docs/conformance.md#provider-pace: every provider's 429 pauses it on every replica
                            // (cut to `max_pause`). A paced call then waits for its turn
                            // again; an unpaced one retries as below (its retry waits the
                            // pause out first).
                            let pause = retry_after.unwrap_or_else(|| self.backoff(attempt));
                            let pause = pace.pause(pause).await;
                            tracing::info!(provider = %self.name, ?pause, "429: provider paused");
                            if pace.is_paced() {
                                continue;
                            }
                        }
                    }
                    if !is_retryable_status(status) {
                        return Err(ProviderError::Failed(message));
                    }
                    (message, retry_after)
                }
                Err(e) if is_transient(&e) => (describe(&e), None),
                Err(e) => return Err(ProviderError::Failed(describe(&e))),
            };
            if attempt >= self.max_retries {
                return Err(ProviderError::Unavailable {
                    message: format!("{message} (gave up after {} attempts)", attempt + 1),
                    retry_after,
                });
            }
            let delay = match retry_after {
                Some(wait) if wait > self.max_retry_delay => {
                    return Err(ProviderError::Unavailable {
                        retry_after: Some(wait),
                        message: format!(
                            "{message}; the provider asked to retry after {} s, longer than \
                         max_retry_delay ({} s)",
                            wait.as_secs_f64(),
                            self.max_retry_delay.as_secs_f64()
                        ),
                    });
                }
                Some(wait) => wait,
                None => self.backoff(attempt),
            };
            tracing::debug!(provider = %self.name, attempt, ?delay, %message, "retrying");
            metrics::counter!(m::PROVIDER_RETRIES_TOTAL, "provider" => self.name.clone())
                .increment(1);
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }
}

enum ReadError {
    TooLarge,
    Http(reqwest::Error),
}

/// The body, chunk by chunk, stopping past `limit` bytes.
async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Http)? {
        if bytes.len() + chunk.len() > limit {
            return Err(ReadError::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Parses an answer body off the async runtime (it may be megabytes).
async fn parse_json_body(bytes: Vec<u8>) -> Result<Value, ProviderError> {
    crate::cpu::run(None, move |_| {
        serde_json::from_slice::<Value>(&bytes).map_err(|e| {
            ProviderError::Failed(format!(
                "the provider's answer is not JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(
                    &bytes[..bytes.len().min(4 * MAX_BODY_EXCERPT)]
                ))
            ))
        })
    })
    .await
    .map_err(|panic| {
        ProviderError::Failed(format!("reading the provider's answer failed: {panic}"))
    })?
}

fn is_retryable_status(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

fn is_transient(e: &reqwest::Error) -> bool {
    e.is_timeout() || e.is_connect() || e.is_request() || e.is_body()
}

/// The longest wait a header can ask for, before any configured cap: a day. Anything
/// longer reads as a day (and is then cut to `max_pause` or refused by
/// `max_retry_delay`).
const LONGEST_HEADER_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The wait a provider asks for: `retry-after-ms` (OpenAI's, in milliseconds), else
/// `Retry-After` in seconds or as an HTTP date. Read defensively, as anything a
/// provider (or a proxy before it) sends: values that are not text, not a number or a
/// date, negative, NaN or infinite are ignored (as if absent); a date in the past is 0;
/// a huge value reads as [`LONGEST_HEADER_WAIT`]. Never panics.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, std::time::SystemTime::now())
}

fn retry_after_at(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
    };
    let seconds = |n: f64| -> Option<Duration> {
        (n.is_finite() && n >= 0.0)
            .then(|| Duration::from_secs_f64(n.min(LONGEST_HEADER_WAIT.as_secs_f64())))
    };
    if let Some(wait) = text("retry-after-ms")
        .and_then(|t| t.parse::<f64>().ok())
        .and_then(|ms| seconds(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = text("retry-after")?;
    match value.parse::<f64>() {
        Ok(n) => seconds(n),
        Err(_) => httpdate::parse_http_date(value).ok().map(|at| {
            at.duration_since(now)
                .unwrap_or(Duration::ZERO)
                .min(LONGEST_HEADER_WAIT)
        }),
    }
}

/// An error and its causes, e.g. "error sending request: connection refused".
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        format!("timed out: {e}")
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

pub(super) fn excerpt(text: &str) -> String {
    match text.char_indices().nth(MAX_BODY_EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_both_headers() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
    }

    /// Issue 26 item 13: hostile values never panic, never ask for more than a day, and
    /// an unreadable `retry-after-ms` falls back to `Retry-After`.
    #[test]
    fn retry_after_reads_hostile_headers_defensively() {
        use reqwest::header::HeaderValue;
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let day = LONGEST_HEADER_WAIT;
        let read = |ms: Option<&[u8]>, secs: Option<&[u8]>| {
            let mut h = HeaderMap::new();
            if let Some(v) = ms {
                h.insert("retry-after-ms", HeaderValue::from_bytes(v).unwrap());
            }
            if let Some(v) = secs {
                h.insert("retry-after", HeaderValue::from_bytes(v).unwrap());
            }
            retry_after_at(&h, now)
        };
        // Huge, in every notation: capped at a day (1e23 ms panicked before).
        for huge in [
            &b"1e23"[..],
            b"1e308",
            b"18446744073709551616",
            b"99999999999999999999999999",
        ] {
            assert_eq!(read(Some(huge), None), Some(day), "{huge:?}");
            assert_eq!(read(None, Some(huge)), Some(day), "{huge:?}");
        }
        assert_eq!(read(None, Some(b"1000000000")), Some(day));
        // Not a usable number: ignored.
        for bad in [
            &b"NaN"[..],
            b"nan",
            b"inf",
            b"-inf",
            b"infinity",
            b"-1",
            b"-0.5",
            b"1e400x",
            b"soon",
            b"",
            b"   ",
            b"0x10",
            b"\xff\xfe",
        ] {
            assert_eq!(read(Some(bad), None), None, "{bad:?}");
            assert_eq!(read(None, Some(bad)), None, "{bad:?}");
        }
        // A bad `retry-after-ms` falls back to a good `Retry-After`.
        assert_eq!(read(Some(b"NaN"), Some(b"3")), Some(Duration::from_secs(3)));
        // Fractions, zero and surrounding space.
        assert_eq!(
            read(Some(b" 250.5 "), None),
            Some(Duration::from_micros(250_500))
        );
        assert_eq!(read(None, Some(b"0")), Some(Duration::ZERO));
        // HTTP dates: in the future, in the past, far away, malformed.
        let in_90s = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            read(None, Some(in_90s.as_bytes())),
            Some(Duration::from_secs(90))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(read(None, Some(past.as_bytes())), Some(Duration::ZERO));
        assert_eq!(
            read(None, Some(b"Fri, 31 Dec 9999 23:59:59 GMT")),
            Some(day)
        );
        assert_eq!(read(None, Some(b"Fri, 32 Dec 2025 25:61:61 GMT")), None);
    }
}
