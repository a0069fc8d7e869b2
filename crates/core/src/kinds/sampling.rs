//! The sampling fields `generate_text`, `extract_data` and `chat` share
//! (`max_output_tokens`, `temperature`, `top_p`, `stop`, `seed`): one statement of the
//! fields, their parsing, their ranges and their published JSON Schemas for all three.
//!
//! Each kind's request holds them as its `sampling` part, flattened into the request
//! object: the wire shape is the same as if each kind listed them itself, and each field
//! is absent from the stored request (and so from its hash) unless set.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::parse::{ROOT, optional};
use super::{MAX_SEED, MAX_STOP_SEQUENCES, MAX_TEMPERATURE};
use crate::error::InvalidInput;

/// The names of the sampling fields, in the order every kind lists them (last).
pub(super) const SAMPLING_FIELDS: [&str; 5] =
    ["max_output_tokens", "temperature", "top_p", "stop", "seed"];

/// How a model samples its answer: the fields `generate_text`, `extract_data` and `chat`
/// share (flattened into their request objects).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sampling {
    /// Cap on generated tokens (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature, finite, in `[0, 2]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling: the probability mass considered, in `(0, 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Up to [`MAX_STOP_SEQUENCES`] non-empty sequences where generation stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// A seed for providers that sample deterministically with one (within ±2^53).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
}

impl Sampling {
    /// Reads the sampling fields of a request object (types only; absent and `null` are
    /// unset). Their ranges are [`check`](Self::check)ed separately, so each kind keeps
    /// its own order of checks.
    pub(super) fn read(map: &Map<String, Value>) -> Result<Sampling, InvalidInput> {
        Ok(Sampling {
            max_output_tokens: optional(map, "max_output_tokens", ROOT)?,
            temperature: optional(map, "temperature", ROOT)?,
            top_p: optional(map, "top_p", ROOT)?,
            stop: optional(map, "stop", ROOT)?,
            seed: optional(map, "seed", ROOT)?,
        })
    }

    /// The ranges of the sampling fields.
    pub(super) fn check(&self) -> Result<(), InvalidInput> {
        if self.max_output_tokens == Some(0) {
            return Err(InvalidInput::field(
                "request.max_output_tokens",
                "must be at least 1",
            ));
        }
        if let Some(t) = self.temperature
            && !(t.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&t))
        {
            return Err(InvalidInput::field(
                "request.temperature",
                format!("must be a number from 0 to {MAX_TEMPERATURE}, got {t}"),
            ));
        }
        if let Some(p) = self.top_p
            && !(p.is_finite() && p > 0.0 && p <= 1.0)
        {
            return Err(InvalidInput::field(
                "request.top_p",
                format!("must be a number above 0 and at most 1, got {p}"),
            ));
        }
        if let Some(stop) = &self.stop {
            if stop.is_empty() || stop.len() > MAX_STOP_SEQUENCES {
                return Err(InvalidInput::field(
                    "request.stop",
                    format!(
                        "must hold 1 to {MAX_STOP_SEQUENCES} sequences, got {}",
                        stop.len()
                    ),
                ));
            }
            if let Some(i) = stop.iter().position(String::is_empty) {
                return Err(InvalidInput::field(
                    format!("request.stop[{i}]"),
                    "must not be empty",
                ));
            }
        }
        if let Some(seed) = self.seed
            && !(-MAX_SEED..=MAX_SEED).contains(&seed)
        {
            return Err(InvalidInput::field(
                "request.seed",
                format!("must be within ±2^53, got {seed}"),
            ));
        }
        Ok(())
    }
}

/// A kind's allowed request fields: its own, then the sampling fields.
pub(super) fn with_sampling_fields(own: &[&'static str]) -> Vec<&'static str> {
    [own, &SAMPLING_FIELDS[..]].concat()
}

/// A kind's published request schema with the JSON Schemas of the sampling fields added
/// to its `properties` (after the kind's own).
pub(super) fn with_sampling_schemas(mut schema: Value) -> Value {
    let properties = [
        (
            "max_output_tokens",
            json!({ "type": ["integer", "null"], "minimum": 1, "maximum": u32::MAX }),
        ),
        (
            "temperature",
            json!({ "type": ["number", "null"], "minimum": 0, "maximum": MAX_TEMPERATURE }),
        ),
        (
            "top_p",
            json!({ "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1 }),
        ),
        (
            "stop",
            json!({
                "type": ["array", "null"],
                "minItems": 1,
                "maxItems": MAX_STOP_SEQUENCES,
                "items": { "type": "string", "minLength": 1 },
                "description": "Sequences where generation stops."
            }),
        ),
        (
            "seed",
            json!({ "type": ["integer", "null"], "minimum": -MAX_SEED, "maximum": MAX_SEED }),
        ),
    ];
    for (key, property) in properties {
        schema["properties"][key] = property;
    }
    schema
}

#[cfg(test)]
mod tests {
    use crate::kinds::TaskKind;
    use crate::kinds::test_support::*;
    use serde_json::{Value, json};

    #[test]
    fn sampling_fields_are_checked_for_every_kind_that_has_them() {
        for (kind, base) in [
            (TaskKind::GenerateText, json!({ "prompt": "p" })),
            (TaskKind::ExtractData, json!({ "input": "x", "schema": {} })),
            (
                TaskKind::Chat,
                json!({ "messages": [{ "role": "user", "content": "u" }] }),
            ),
        ] {
            let with = |key: &str, value: Value| {
                let mut v = base.clone();
                v[key] = value;
                v
            };
            accepts(kind, with("top_p", json!(1)));
            accepts(kind, with("stop", json!(["\n\n", "END"])));
            accepts(kind, with("seed", json!(-42)));
            rejects(kind, with("top_p", json!(0)), "request.top_p", "above 0");
            rejects(
                kind,
                with("top_p", json!(1.5)),
                "request.top_p",
                "at most 1",
            );
            rejects(kind, with("stop", json!([])), "request.stop", "1 to 4");
            rejects(
                kind,
                with("stop", json!(["a", "b", "c", "d", "e"])),
                "request.stop",
                "1 to 4",
            );
            rejects(
                kind,
                with("stop", json!(["a", ""])),
                "request.stop[1]",
                "empty",
            );
            rejects(
                kind,
                with("seed", json!(1_i64 << 54)),
                "request.seed",
                "2^53",
            );
            rejects(
                kind,
                with("temperature", json!(3)),
                "request.temperature",
                "from 0 to 2",
            );
        }
        // Unset, they are absent from the stored request, so older hashes hold.
        let r = accepts(TaskKind::ExtractData, json!({ "input": "x", "schema": {} }));
        assert_eq!(r.to_value(), json!({ "input": "x", "schema": {} }));
    }
}
