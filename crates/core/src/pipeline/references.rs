//! `$from` and `$template` references in a step's request or source: finding them,
//! checking their pointers at registration, and filling them in when a step runs.

use super::err;
use crate::error::InvalidInput;
use crate::ids::StepKey;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};

/// The document references resolve against: `{"input": …, "steps": {key: {"output": …}}}`.
pub(super) fn context(input: &Value, outputs: &BTreeMap<StepKey, Value>) -> Value {
    let steps: Map<String, Value> = outputs
        .iter()
        .map(|(k, v)| (k.to_string(), serde_json::json!({ "output": v })))
        .collect();
    serde_json::json!({ "input": input, "steps": steps })
}

/// Whether a request or source template holds any `$from` or `$template` reference (one
/// without is final as written and can be validated for its kind at registration).
pub fn has_references(template: &Value) -> bool {
    match template {
        Value::Object(m) if m.contains_key("$from") || m.contains_key("$template") => true,
        Value::Object(m) => m.values().any(has_references),
        Value::Array(a) => a.iter().any(has_references),
        _ => false,
    }
}

/// Fills `$from` and `$template` references in a step's request or source.
pub fn resolve(
    template: &Value,
    input: &Value,
    outputs: &BTreeMap<StepKey, Value>,
) -> Result<Value, String> {
    let scope = context(input, outputs);
    fill(template, &scope)
}

fn fill(v: &Value, scope: &Value) -> Result<Value, String> {
    match v {
        Value::Object(m) if m.len() == 1 && m.contains_key("$from") => {
            let p = m["$from"].as_str().unwrap_or_default();
            scope
                .pointer(p)
                .cloned()
                .ok_or_else(|| format!("nothing at {p}"))
        }
        Value::Object(m) if m.len() == 1 && m.contains_key("$template") => {
            let t = m["$template"].as_str().unwrap_or_default();
            render(t, scope).map(Value::String)
        }
        Value::Object(m) => m
            .iter()
            .map(|(k, v)| fill(v, scope).map(|v| (k.clone(), v)))
            .collect::<Result<Map<_, _>, _>>()
            .map(Value::Object),
        Value::Array(a) => a
            .iter()
            .map(|v| fill(v, scope))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        other => Ok(other.clone()),
    }
}

fn render(template: &str, scope: &Value) -> Result<String, String> {
    let mut out = String::new();
    for piece in template_pieces(template) {
        match piece {
            Piece::Text(t) => out.push_str(t),
            Piece::Pointer(p) => match scope.pointer(p) {
                Some(Value::String(s)) => out.push_str(s),
                Some(other) => out.push_str(&other.to_string()),
                None => return Err(format!("nothing at {p}")),
            },
        }
    }
    Ok(out)
}

enum Piece<'a> {
    Text(&'a str),
    Pointer(&'a str),
}

/// Splits `a {/x} b` into text and `{/pointer}` pieces; braces not starting with `{/`
/// are plain text.
fn template_pieces(t: &str) -> Vec<Piece<'_>> {
    let mut pieces = Vec::new();
    let mut rest = t;
    while let Some(start) = rest.find("{/") {
        let Some(len) = rest[start..].find('}') else {
            break;
        };
        if start > 0 {
            pieces.push(Piece::Text(&rest[..start]));
        }
        pieces.push(Piece::Pointer(&rest[start + 1..start + len]));
        rest = &rest[start + len + 1..];
    }
    if !rest.is_empty() {
        pieces.push(Piece::Text(rest));
    }
    pieces
}

pub(super) fn collect_refs(
    v: &Value,
    at: &str,
    out: &mut Vec<(String, String)>,
) -> Result<(), InvalidInput> {
    match v {
        Value::Object(m) if m.contains_key("$from") || m.contains_key("$template") => {
            if m.len() != 1 {
                return Err(err(
                    at,
                    "a `$from` or `$template` object holds nothing else",
                ));
            }
            if let Some(p) = m.get("$from") {
                let p = p
                    .as_str()
                    .ok_or_else(|| err(at, "`$from` must be a JSON Pointer string"))?;
                out.push((at.to_string(), p.to_string()));
            } else {
                let t = m["$template"]
                    .as_str()
                    .ok_or_else(|| err(at, "`$template` must be a string"))?;
                for piece in template_pieces(t) {
                    if let Piece::Pointer(p) = piece {
                        out.push((at.to_string(), p.to_string()));
                    }
                }
            }
            Ok(())
        }
        Value::Object(m) => m
            .iter()
            .try_for_each(|(k, v)| collect_refs(v, &format!("{at}.{k}"), out)),
        Value::Array(a) => a
            .iter()
            .enumerate()
            .try_for_each(|(i, v)| collect_refs(v, &format!("{at}[{i}]"), out)),
        _ => Ok(()),
    }
}

pub(super) fn check_pointer(
    pointer: &str,
    at: &str,
    allowed_steps: Option<&BTreeSet<StepKey>>,
    keys: &BTreeMap<StepKey, usize>,
) -> Result<(), InvalidInput> {
    if pointer == "/input" || pointer.starts_with("/input/") {
        return Ok(());
    }
    let Some(rest) = pointer.strip_prefix("/steps/") else {
        return Err(err(
            at,
            format!("reference {pointer:?} must start with /input or /steps/<key>/output"),
        ));
    };
    let (key, tail) = rest.split_once('/').unwrap_or((rest, ""));
    if !(tail == "output" || tail.starts_with("output/")) {
        return Err(err(
            at,
            format!("reference {pointer:?} must point into /steps/{key}/output"),
        ));
    }
    let key = StepKey::new(key).map_err(|e| err(at, e.to_string()))?;
    if !keys.contains_key(&key) {
        return Err(err(
            at,
            format!("reference {pointer:?} names unknown step `{key}`"),
        ));
    }
    if let Some(allowed) = allowed_steps
        && !allowed.contains(&key)
    {
        return Err(err(
            at,
            format!(
                "reference {pointer:?} needs step `{key}`, which is not among this step's dependencies"
            ),
        ));
    }
    Ok(())
}
