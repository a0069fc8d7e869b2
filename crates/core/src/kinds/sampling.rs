//! The sampling fields `generate_text` and `extract_data` share (`max_output_tokens`,
//! `temperature`, `top_p`, `stop`, `seed`): one statement of their ranges for both kinds.

use super::{MAX_SEED, MAX_STOP_SEQUENCES, MAX_TEMPERATURE};
use crate::error::InvalidInput;

/// The sampling fields `generate_text` and `extract_data` share, borrowed for checking.
pub(super) struct Sampling<'a> {
    pub(super) max_output_tokens: Option<u32>,
    pub(super) temperature: Option<f64>,
    pub(super) top_p: Option<f64>,
    pub(super) stop: Option<&'a [String]>,
    pub(super) seed: Option<i64>,
}

/// The ranges of the shared sampling fields (one statement of them for both kinds).
pub(super) fn check_sampling(s: Sampling<'_>) -> Result<(), InvalidInput> {
    if s.max_output_tokens == Some(0) {
        return Err(InvalidInput::field(
            "request.max_output_tokens",
            "must be at least 1",
        ));
    }
    if let Some(t) = s.temperature
        && !(t.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&t))
    {
        return Err(InvalidInput::field(
            "request.temperature",
            format!("must be a number from 0 to {MAX_TEMPERATURE}, got {t}"),
        ));
    }
    if let Some(p) = s.top_p
        && !(p.is_finite() && p > 0.0 && p <= 1.0)
    {
        return Err(InvalidInput::field(
            "request.top_p",
            format!("must be a number above 0 and at most 1, got {p}"),
        ));
    }
    if let Some(stop) = s.stop {
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
    if let Some(seed) = s.seed
        && !(-MAX_SEED..=MAX_SEED).contains(&seed)
    {
        return Err(InvalidInput::field(
            "request.seed",
            format!("must be within ±2^53, got {seed}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::kinds::TaskKind;
    use crate::kinds::test_support::*;
    use serde_json::{Value, json};

    #[test]
    fn sampling_fields_are_checked_for_both_kinds() {
        for (kind, base) in [
            (TaskKind::GenerateText, json!({ "prompt": "p" })),
            (TaskKind::ExtractData, json!({ "input": "x", "schema": {} })),
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
