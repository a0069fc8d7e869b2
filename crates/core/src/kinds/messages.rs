//! Short messages: type names, clipped quotes of caller- or model-supplied text, lists.

use serde_json::Value;

/// How many labels / ids an output violation message lists.
const MAX_LISTED: usize = 10;
/// Longest excerpt of a caller- or model-supplied string quoted in a message, in chars.
const MAX_QUOTE_CHARS: usize = 80;

/// "a string", "an object", … for type errors.
pub(super) fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most `MAX_QUOTE_CHARS` chars of `s`.
pub(super) fn clip(s: &str) -> String {
    clip_to(s, MAX_QUOTE_CHARS)
}

/// At most a few hundred chars of a (library) message that may quote a whole instance.
pub(super) fn clip_long(s: &str) -> String {
    clip_to(s, 4 * MAX_QUOTE_CHARS)
}

pub(super) fn clip_to(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// A short JSON rendering of a value.
pub(super) fn excerpt(value: &Value) -> String {
    clip(&value.to_string())
}

/// "`a`, `b`, … (and N more)".
pub(super) fn list_quoted<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> String {
    let total = names.len();
    let shown: Vec<String> = names
        .take(MAX_LISTED)
        .map(|n| format!("`{}`", clip(n)))
        .collect();
    let mut out = shown.join(", ");
    if total > MAX_LISTED {
        out.push_str(&format!(" (and {} more)", total - MAX_LISTED));
    }
    out
}
