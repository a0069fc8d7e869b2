//! Field-by-field parsing helpers: every error names the exact path that is wrong.

use serde::de::{DeserializeOwned, IgnoredAny};
use serde_json::{Map, Value};

use super::ChatMessage;
use super::messages::{clip, describe};
use crate::error::InvalidInput;

/// Root path of every request field error.
pub(super) const ROOT: &str = "request";

/// Deserializes `value` with serde, reporting serde's message at `path`.
pub(super) fn de<T: DeserializeOwned>(value: &Value, path: &str) -> Result<T, InvalidInput> {
    T::deserialize(value).map_err(|e| InvalidInput::field(path, e.to_string()))
}

/// The JSON object at `path`, refusing keys outside `allowed`.
pub(super) fn object<'a>(
    value: &'a Value,
    path: &str,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, InvalidInput> {
    let Value::Object(map) = value else {
        return Err(InvalidInput::field(
            path,
            format!("must be a JSON object, not {}", describe(value)),
        ));
    };
    if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        let expected: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
        return Err(InvalidInput::field(
            path,
            format!(
                "unknown field `{}`, expected one of {}",
                clip(key),
                expected.join(", ")
            ),
        ));
    }
    Ok(map)
}

/// A required field; a missing one is reported like serde does.
pub(super) fn required<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<(&'a Value, String), InvalidInput> {
    match map.get(key) {
        Some(value) => Ok((value, format!("{path}.{key}"))),
        None => Err(InvalidInput::field(path, format!("missing field `{key}`"))),
    }
}

/// An optional field; absent and `null` are both `None`.
pub(super) fn optional<T: DeserializeOwned>(
    map: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<T>, InvalidInput> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => de(value, &format!("{path}.{key}")).map(Some),
    }
}

/// An array of at most `max` elements, each deserialized at `path[i]`.
pub(super) fn list<T: DeserializeOwned>(
    value: &Value,
    path: &str,
    max: usize,
    what: &str,
) -> Result<Vec<T>, InvalidInput> {
    let Value::Array(elements) = value else {
        // Let serde word the type error ("invalid type: …, expected a sequence").
        return Err(de::<Vec<IgnoredAny>>(value, path)
            .err()
            .unwrap_or_else(|| InvalidInput::field(path, "must be an array")));
    };
    if elements.len() > max {
        return Err(InvalidInput::field(
            path,
            format!("has {} {what}, over the limit of {max}", elements.len()),
        ));
    }
    elements
        .iter()
        .enumerate()
        .map(|(i, e)| de(e, &format!("{path}[{i}]")))
        .collect()
}

/// A chat list at `path`: present, non-empty.
pub(super) fn parse_messages(value: &Value, path: &str) -> Result<Vec<ChatMessage>, InvalidInput> {
    let messages: Vec<ChatMessage> = list(value, path, usize::MAX, "messages")?;
    if messages.is_empty() {
        return Err(InvalidInput::field(
            path,
            "must contain at least one message",
        ));
    }
    Ok(messages)
}
