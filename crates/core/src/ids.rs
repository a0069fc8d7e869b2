//! Identifier newtypes. Text identifiers are validated once, at construction.

use crate::error::InvalidInput;
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use uuid::Uuid;

/// Longest text identifier accepted, in characters (Unicode scalar values, as JSON
/// Schema's `maxLength` counts them).
pub const MAX_ID_CHARS: usize = 256;

/// Characters that may not appear anywhere in an identifier, as inclusive ranges: control
/// characters (Cc, which includes NUL), format characters (Cf: bidi controls U+202A–202E
/// and U+2066–2069, zero-width U+200B–200F, U+2060–2064, U+FEFF and the rest of the
/// category) and the line and paragraph separators U+2028/U+2029. One table, read by
/// [`check_identifier`] and by [`identifier_pattern`].
const FORBIDDEN_IN_ID: &[(char, char)] = &[
    ('\u{0000}', '\u{001F}'),
    ('\u{007F}', '\u{009F}'),
    ('\u{00AD}', '\u{00AD}'),
    ('\u{0600}', '\u{0605}'),
    ('\u{061C}', '\u{061C}'),
    ('\u{06DD}', '\u{06DD}'),
    ('\u{070F}', '\u{070F}'),
    ('\u{0890}', '\u{0891}'),
    ('\u{08E2}', '\u{08E2}'),
    ('\u{180E}', '\u{180E}'),
    ('\u{200B}', '\u{200F}'),
    ('\u{2028}', '\u{202E}'),
    ('\u{2060}', '\u{2064}'),
    ('\u{2066}', '\u{206F}'),
    ('\u{FEFF}', '\u{FEFF}'),
    ('\u{FFF9}', '\u{FFFB}'),
    ('\u{110BD}', '\u{110BD}'),
    ('\u{110CD}', '\u{110CD}'),
    ('\u{13430}', '\u{1343F}'),
    ('\u{1BCA0}', '\u{1BCA3}'),
    ('\u{1D173}', '\u{1D17A}'),
    ('\u{E0001}', '\u{E0001}'),
    ('\u{E0020}', '\u{E007F}'),
];

/// White space (Unicode `White_Space`, what [`str::trim`] removes) that may not start or
/// end an identifier, as inclusive ranges.
const WHITE_SPACE: &[(char, char)] = &[
    ('\u{0009}', '\u{000D}'),
    ('\u{0020}', '\u{0020}'),
    ('\u{0085}', '\u{0085}'),
    ('\u{00A0}', '\u{00A0}'),
    ('\u{1680}', '\u{1680}'),
    ('\u{2000}', '\u{200A}'),
    ('\u{2028}', '\u{2029}'),
    ('\u{202F}', '\u{202F}'),
    ('\u{205F}', '\u{205F}'),
    ('\u{3000}', '\u{3000}'),
];

fn forbidden_in_id(c: char) -> bool {
    FORBIDDEN_IN_ID
        .iter()
        .any(|&(lo, hi)| (lo..=hi).contains(&c))
}

/// The identifier rule as a regular expression (the OpenAPI document's `pattern` for
/// every identifier), built from the same tables as [`check_identifier`]: no forbidden
/// character anywhere, no white space first or last. The length bound is separate
/// (`maxLength` [`MAX_ID_CHARS`]). Characters beyond the Basic Multilingual Plane appear
/// literally, which regex dialects read alike; the others as `\uXXXX`.
pub fn identifier_pattern() -> String {
    fn push_char(out: &mut String, c: char) {
        if (c as u32) <= 0xFFFF {
            out.push_str(&format!("\\u{:04X}", c as u32));
        } else {
            out.push(c);
        }
    }
    fn class(tables: &[&[(char, char)]]) -> String {
        let mut out = String::from("[^");
        for &(lo, hi) in tables.iter().flat_map(|t| t.iter()) {
            push_char(&mut out, lo);
            if hi != lo {
                out.push('-');
                push_char(&mut out, hi);
            }
        }
        out.push(']');
        out
    }
    let inner = class(&[FORBIDDEN_IN_ID]);
    let edge = class(&[FORBIDDEN_IN_ID, WHITE_SPACE]);
    format!("^{edge}(?:{inner}*{edge})?$")
}

/// The one identifier rule (docs/api.md, "Identifiers"), for every text identifier of
/// the API whichever way it arrives (JSON body, header, path or query): UTF-8 text of 1
/// to [`MAX_ID_CHARS`] characters, without leading or trailing whitespace (so never
/// whitespace only), and without control, format (bidi, zero-width, BOM) or line/paragraph
/// separator characters anywhere. Errors name `field`.
pub fn check_identifier(field: &str, s: &str) -> Result<(), InvalidInput> {
    if s.is_empty() {
        return Err(InvalidInput::field(field, "must not be empty"));
    }
    let chars = s.chars().count();
    if chars > MAX_ID_CHARS {
        return Err(InvalidInput::field(
            field,
            format!("must be at most {MAX_ID_CHARS} characters, got {chars}"),
        ));
    }
    if let Some(c) = s.chars().find(|&c| forbidden_in_id(c)) {
        return Err(InvalidInput::field(
            field,
            format!(
                "must not contain control, bidi, zero-width or other invisible format characters (found U+{:04X})",
                c as u32
            ),
        ));
    }
    if s.trim() != s {
        return Err(InvalidInput::field(
            field,
            "must not start or end with whitespace",
        ));
    }
    Ok(())
}

macro_rules! text_id {
    ($(#[$doc:meta])* $name:ident, $what:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// Validates ([`check_identifier`]) and wraps.
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidInput> {
                let value = value.into();
                check_identifier($what, &value)?;
                Ok(Self(value))
            }

            /// The identifier's text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// Unwraps the text.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $name::new(s).map_err(serde::de::Error::custom)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = InvalidInput;
            fn try_from(s: &str) -> Result<Self, InvalidInput> {
                $name::new(s)
            }
        }
    };
}

text_id!(
    /// A tenant. Every row belongs to exactly one app.
    AppId,
    "app"
);
text_id!(
    /// A budget and cache boundary inside an app.
    ScopeId,
    "scope"
);
text_id!(
    /// The thing a task is about (a document, a mailbox).
    SourceId,
    "source.id"
);
text_id!(
    /// A revision of a source; a new revision is new work.
    SourceRevision,
    "source.revision"
);
text_id!(
    /// The caller's idempotency key, unique per app.
    EffectKey,
    "effect_key"
);
/// The namespaces of the effect keys the engine writes for its own tasks
/// (docs/api.md, "Effect keys"). Callers can never write a key in one: the engine refuses
/// a caller's key that starts with one of these prefixes ([`EffectKey::check_caller_key`]),
/// so a caller can neither take over a pipeline step nor answer a door call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKeySpace {
    /// A pipeline step's task: `run:<run id>:<step>`, `run:<run id>:<step>#<n>`.
    PipelineStep,
    /// A call through the OpenAI-compatible door: `openai-<Idempotency-Key>`.
    OpenAiDoor,
}

impl EngineKeySpace {
    /// Every namespace.
    pub const ALL: [EngineKeySpace; 2] = [EngineKeySpace::PipelineStep, EngineKeySpace::OpenAiDoor];

    /// The prefix every key of the namespace starts with (compared exactly).
    pub const fn prefix(self) -> &'static str {
        match self {
            EngineKeySpace::PipelineStep => "run:",
            EngineKeySpace::OpenAiDoor => "openai-",
        }
    }

    /// What writes the namespace's keys, for messages.
    pub const fn owner(self) -> &'static str {
        match self {
            EngineKeySpace::PipelineStep => "pipeline steps",
            EngineKeySpace::OpenAiDoor => "the OpenAI-compatible door",
        }
    }
}

impl EffectKey {
    /// The engine's namespace this key lies in, if any.
    pub fn engine_space(&self) -> Option<EngineKeySpace> {
        EngineKeySpace::ALL
            .into_iter()
            .find(|space| self.0.starts_with(space.prefix()))
    }

    /// A caller's own key must lie outside the engine's namespaces (docs/api.md,
    /// "Effect keys"); the error names the rule.
    pub fn check_caller_key(&self) -> Result<(), InvalidInput> {
        match self.engine_space() {
            None => Ok(()),
            Some(space) => Err(InvalidInput::field(
                "effect_key",
                format!(
                    "{:?} starts with `{}`: effect keys starting with `{}` or `{}` are reserved \
                     for the engine's own tasks ({} and {}); choose another key",
                    self.0,
                    space.prefix(),
                    EngineKeySpace::PipelineStep.prefix(),
                    EngineKeySpace::OpenAiDoor.prefix(),
                    EngineKeySpace::PipelineStep.owner(),
                    EngineKeySpace::OpenAiDoor.owner(),
                ),
            )),
        }
    }
}

text_id!(
    /// The caller's name for a step.
    StepKey,
    "step"
);
text_id!(
    /// The model name a caller asks for (`"default"`, `"fast-classifier"`).
    ModelId,
    "model"
);
text_id!(
    /// A worker process's identity, recorded on the tasks it claims.
    WorkerId,
    "worker"
);
text_id!(
    /// A named budget policy (docs/conformance.md#budget-policies).
    BudgetName,
    "budget"
);
text_id!(
    /// A registered pipeline's name.
    PipelineName,
    "pipeline"
);
text_id!(
    /// A version of a registered pipeline (the hash of its definition).
    PipelineVersion,
    "version"
);

macro_rules! uuid_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(Uuid);

        impl $name {
            /// A new, time-ordered (UUIDv7) identifier.
            pub fn generate() -> Self {
                Self(Uuid::now_v7())
            }

            /// Wraps an existing UUID.
            pub fn from_uuid(id: Uuid) -> Self {
                Self(id)
            }

            /// The UUID.
            pub fn as_uuid(&self) -> Uuid {
                self.0
            }

            /// Parses the hyphenated text form.
            pub fn parse(s: &str) -> Result<Self, InvalidInput> {
                Uuid::parse_str(s)
                    .map(Self)
                    .map_err(|_| InvalidInput::field("id", format!("{s:?} is not a valid id")))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0.hyphenated(), f)
            }
        }
    };
}

uuid_id!(
    /// A task's identifier.
    TaskId
);
uuid_id!(
    /// A workflow run's identifier.
    RunId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_ids_reject_empty_long_and_control() {
        assert!(AppId::new("").is_err());
        assert!(AppId::new("a".repeat(257)).is_err());
        assert!(AppId::new("a\nb").is_err());
        assert_eq!(AppId::new("acme").unwrap().as_str(), "acme");
        assert!(serde_json::from_str::<ScopeId>("\"\"").is_err());
    }

    #[test]
    fn one_identifier_rule() {
        for ok in [
            "acme",
            "a b",
            "ключ-1",
            "é",
            "日本語",
            "x".repeat(256).as_str(),
        ] {
            assert!(check_identifier("scope", ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            " ",
            "\t",
            " a",
            "a ",
            "a\u{0}b",
            "a\nb",
            "\u{7f}",
            "a\u{202E}b",
            "a\u{2066}",
            "\u{200B}",
            "a\u{200F}",
            "\u{FEFF}a",
            "a\u{2060}",
            "a\u{00AD}b",
            "a\u{2028}b",
            "a\u{E0041}",
            "\u{3000}a",
        ] {
            let e = check_identifier("scope", bad).unwrap_err();
            assert!(e.to_string().starts_with("invalid scope:"), "{bad:?}: {e}");
        }
        // Characters, not bytes (as JSON Schema's maxLength counts).
        assert!(check_identifier("step", &"é".repeat(256)).is_ok());
        assert!(check_identifier("step", &"é".repeat(257)).is_err());
        assert!(EffectKey::new("k\u{202E}").is_err());
        assert!(PipelineVersion::new("\u{0}").is_err());
    }

    #[test]
    fn engine_key_spaces_are_closed_to_callers() {
        for (key, space) in [
            ("run:0190-x:b", Some(EngineKeySpace::PipelineStep)),
            ("run:", Some(EngineKeySpace::PipelineStep)),
            ("openai-X", Some(EngineKeySpace::OpenAiDoor)),
            ("openai-call-1", Some(EngineKeySpace::OpenAiDoor)),
            ("Run:x", None),
            ("runner:x", None),
            ("openai_x", None),
            ("my-openai-x", None),
            ("order-42", None),
        ] {
            let k = EffectKey::new(key).unwrap();
            assert_eq!(k.engine_space(), space, "{key}");
            let checked = k.check_caller_key();
            assert_eq!(checked.is_ok(), space.is_none(), "{key}");
            if let Err(e) = checked {
                let text = e.to_string();
                assert!(text.starts_with("invalid effect_key:"), "{text}");
                assert!(text.contains("reserved"), "{text}");
            }
        }
    }

    #[test]
    fn the_pattern_states_the_same_rule() {
        let pattern = regex::Regex::new(&identifier_pattern()).unwrap();
        let agree = |s: &str| {
            assert_eq!(
                pattern.is_match(s),
                check_identifier("id", s).is_ok(),
                "{s:?} (U+{:04X})",
                s.chars().next().map_or(0, |c| c as u32)
            );
        };
        // Every character alone, first, in the middle and last.
        for c in (0..=0x10FFFFu32).filter_map(char::from_u32) {
            if (c as u32) > 0x3100
                && (c as u32) < 0x10000
                && c as u32 != 0xFEFF
                && !(0xFFF9..=0xFFFB).contains(&(c as u32))
            {
                continue;
            }
            if (c as u32) >= 0x10000
                && !(c as u32).is_multiple_of(7)
                && !FORBIDDEN_IN_ID.iter().any(|&(lo, hi)| c == lo || c == hi)
            {
                continue;
            }
            agree(&c.to_string());
            agree(&format!("a{c}"));
            agree(&format!("{c}a"));
            agree(&format!("a{c}b"));
        }
        for s in ["acme", "a b", " a", "a ", "日本語", "x"] {
            agree(s);
        }
    }

    #[test]
    fn uuid_ids_round_trip() {
        let id = TaskId::generate();
        assert_eq!(TaskId::parse(&id.to_string()).unwrap(), id);
        assert!(TaskId::parse("nope").is_err());
    }
}
