//! `extract_data`: the smallest instance's top-level properties filled from the input.

use serde_json::{Value, json};
use tollgate_core::TaskRequest;

/// The numbers written in `text`, in order, with where each ends.
fn numbers_in(text: &str) -> Vec<(usize, usize, Value)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i].is_ascii_digit() && (i == 0 || !bytes[i - 1].is_ascii_alphanumeric()) {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b',') {
                i += 1;
            }
            if i + 1 < bytes.len() && bytes[i] == b'.' && bytes[i + 1].is_ascii_digit() {
                i += 1;
                while i < bytes.len() && bytes[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let literal: String = text[start..i].chars().filter(|c| *c != ',').collect();
            let literal = literal.trim_end_matches('.');
            let value = if literal.contains('.') {
                literal.parse::<f64>().ok().map(|f| json!(f))
            } else {
                literal.parse::<i64>().ok().map(|n| json!(n))
            };
            if let Some(v) = value {
                found.push((start, i, v));
            }
        } else {
            i += 1;
        }
    }
    found
}

/// The smallest instance with its top-level number, integer and string properties taken
/// from the input where it holds them (see the module's table); `None` when nothing was
/// found.
pub(super) fn fill_from_input(request: &TaskRequest, smallest: &Value) -> Option<Value> {
    let TaskRequest::ExtractData(r) = request else {
        return None;
    };
    let properties = r.schema.get("properties")?.as_object()?;
    let input = r.input.as_deref()?;
    let mut out = smallest.as_object()?.clone();
    // ASCII lower case keeps byte offsets, so positions found in it index `input`.
    let lower = input.to_ascii_lowercase();
    let numbers = numbers_in(input);
    let mut used = vec![false; numbers.len()];
    let mut changed = false;
    for (name, schema) in properties {
        if !out.contains_key(name) {
            continue;
        }
        let ty = schema.get("type").and_then(Value::as_str).unwrap_or("");
        let after_name = lower
            .find(&name.to_ascii_lowercase())
            .map(|at| at + name.len());
        match ty {
            "integer" | "number" => {
                let fits = |v: &Value| ty == "number" || v.is_i64();
                let at_name = after_name.and_then(|at| {
                    (0..numbers.len())
                        .find(|&k| !used[k] && numbers[k].0 >= at && fits(&numbers[k].2))
                });
                let next = at_name
                    .or_else(|| (0..numbers.len()).find(|&k| !used[k] && fits(&numbers[k].2)));
                if let Some(k) = next {
                    used[k] = true;
                    out.insert(name.clone(), numbers[k].2.clone());
                    changed = true;
                }
            }
            "string" if schema.get("enum").is_none() && schema.get("format").is_none() => {
                if let Some(at) = after_name {
                    let word: String = input[at.min(input.len())..]
                        .trim_start_matches(|c: char| !c.is_alphanumeric())
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'))
                        .collect();
                    if !word.is_empty() {
                        out.insert(name.clone(), json!(word));
                        changed = true;
                    }
                }
            }
            _ => {}
        }
    }
    changed.then_some(Value::Object(out))
}
