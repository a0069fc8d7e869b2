//! Identifier newtypes. Text identifiers are validated once, at construction.

use crate::error::InvalidInput;
use serde::{Deserialize, Deserializer, Serialize};
use std::fmt;
use uuid::Uuid;

/// Longest text identifier accepted, in bytes.
pub const MAX_ID_BYTES: usize = 256;

fn check_text_id(what: &str, s: &str) -> Result<(), InvalidInput> {
    if s.is_empty() {
        return Err(InvalidInput::field(what, "must not be empty"));
    }
    if s.len() > MAX_ID_BYTES {
        return Err(InvalidInput::field(
            what,
            format!("must be at most {MAX_ID_BYTES} bytes, got {}", s.len()),
        ));
    }
    if s.chars().any(char::is_control) {
        return Err(InvalidInput::field(
            what,
            "must not contain control characters",
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
            /// Validates and wraps: non-empty, at most 256 bytes, no control characters.
            pub fn new(value: impl Into<String>) -> Result<Self, InvalidInput> {
                let value = value.into();
                check_text_id($what, &value)?;
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
    /// A named budget policy (SPEC §10).
    BudgetName,
    "budget"
);
text_id!(
    /// A registered pipeline's name.
    PipelineName,
    "pipeline"
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
    fn uuid_ids_round_trip() {
        let id = TaskId::generate();
        assert_eq!(TaskId::parse(&id.to_string()).unwrap(), id);
        assert!(TaskId::parse("nope").is_err());
    }
}
