//! The built-in `dev` provider: offline, deterministic, free. **For development and tests
//! only**: its answers are derived from a hash of the model configuration and the request,
//! not from any understanding of the input.
//!
//! | kind | answer |
//! | --- | --- |
//! | `generate_text` | `"[dev:<model>] <the prompt's first words> (#<hash>)"`, cut to `max_output_tokens` words |
//! | `classify` | the label at index `hash mod labels`, confidence `null` |
//! | `classify_many` | one result per item, in item order, each label picked by the hash of the item |
//! | `extract_data` | the smallest instance the schema allows: required properties only, the first `enum` value, `const`, `minimum`s, `minLength`/`minItems` padding, examples for common formats; a schema it cannot satisfy fails the task clearly |
//!
//! Usage is reported as one token per four bytes of request and output. The model
//! parameter `latency_ms` delays every answer, so cancellation and heartbeats can be
//! exercised; the delay is dropped with the call when a task is canceled.

use super::{Provider, ProviderAnswer, ProviderCall, ProviderError};
use async_trait::async_trait;
use serde_json::{Map, Value, json};
use std::time::Duration;
use tollgate_core::canonical::hash_value;
use tollgate_core::{ModelRef, TaskRequest, Usage, validate_output};

/// Deepest schema nesting the instance builder follows.
const MAX_SCHEMA_DEPTH: usize = 32;

/// The offline, deterministic development and test provider.
#[derive(Debug, Clone, Default)]
pub struct DevProvider;

impl DevProvider {
    /// A dev provider.
    pub fn new() -> DevProvider {
        DevProvider
    }

    /// The deterministic answer for a call, without the configured latency.
    pub fn answer(
        model: &ModelRef,
        request: &TaskRequest,
        output_schema: &Value,
    ) -> Result<ProviderAnswer, ProviderError> {
        let request_value = request.to_value();
        let seed = seed(&json!({
            "kind": request.kind().as_str(),
            "model": model,
            "request": request_value,
        }));
        let output = match request {
            TaskRequest::GenerateText(r) => {
                let source = r
                    .prompt
                    .clone()
                    .or_else(|| {
                        r.messages
                            .as_ref()
                            .and_then(|m| m.last())
                            .map(|m| m.content.clone())
                    })
                    .unwrap_or_default();
                let mut words: Vec<&str> = source.split_whitespace().take(12).collect();
                let mut text = format!("[dev:{}]", model.model);
                if let Some(limit) = r.max_output_tokens {
                    words.truncate((limit as usize).saturating_sub(2));
                }
                for w in words {
                    text.push(' ');
                    text.push_str(w);
                }
                text.push_str(&format!(" (#{:08x})", seed as u32));
                json!({ "text": text })
            }
            TaskRequest::Classify(r) => {
                let label = &r.labels[pick(seed, r.labels.len())];
                json!({ "label": label.name(), "confidence": Value::Null })
            }
            TaskRequest::ClassifyMany(r) => {
                let results: Vec<Value> = r
                    .items
                    .iter()
                    .map(|item| {
                        let s = self::seed(&json!([seed.to_string(), item.id, item.input]));
                        json!({ "id": item.id, "label": r.labels[pick(s, r.labels.len())].name() })
                    })
                    .collect();
                json!({ "results": results })
            }
            TaskRequest::ExtractData(_) => {
                let instance = instance(output_schema, output_schema, 0).map_err(|reason| {
                    ProviderError::Failed(format!(
                        "the dev provider cannot build a value for this schema: {reason}"
                    ))
                })?;
                validate_output(request, &instance).map_err(|v| {
                    ProviderError::Failed(format!(
                        "the dev provider cannot build a value for this schema: {}",
                        v.0
                    ))
                })?;
                instance
            }
        };
        let usage = Usage {
            input_tokens: tokens(&request_value.to_string()),
            output_tokens: tokens(&output.to_string()),
            cost_usd: Some(0.0),
        };
        Ok(ProviderAnswer { output, usage })
    }
}

#[async_trait]
impl Provider for DevProvider {
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        if let Some(ms) = call.model.params.get("latency_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        DevProvider::answer(call.model, call.request, call.output_schema)
    }
}

fn seed(value: &Value) -> u64 {
    let hex = hash_value(value).unwrap_or_default();
    hex.get(..16)
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

fn pick(seed: u64, n: usize) -> usize {
    (seed % n.max(1) as u64) as usize
}

fn tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

/// The smallest instance of `schema` (resolved against `root` for `$ref`s).
fn instance(schema: &Value, root: &Value, depth: usize) -> Result<Value, String> {
    if depth > MAX_SCHEMA_DEPTH {
        return Err("the schema nests or refers to itself too deeply".into());
    }
    let map = match schema {
        Value::Bool(true) => return Ok(Value::Null),
        Value::Bool(false) => return Err("the schema `false` accepts no value".into()),
        Value::Object(map) => map,
        _ => return Err("a subschema is neither an object nor a boolean".into()),
    };
    if let Some(Value::String(target)) = map.get("$ref") {
        let resolved = resolve_ref(target, root)?;
        return instance(resolved, root, depth + 1);
    }
    if let Some(value) = map.get("const") {
        return Ok(value.clone());
    }
    if let Some(Value::Array(options)) = map.get("enum") {
        return options
            .first()
            .cloned()
            .ok_or_else(|| "an empty `enum` accepts no value".to_string());
    }
    if let Some(Value::Array(parts)) = map.get("allOf") {
        let mut merged = map.clone();
        merged.remove("allOf");
        for part in parts {
            let part = match part.get("$ref").and_then(Value::as_str) {
                Some(target) => resolve_ref(target, root)?,
                None => part,
            };
            merge_into(&mut merged, part);
        }
        return instance(&Value::Object(merged), root, depth + 1);
    }
    for combinator in ["anyOf", "oneOf"] {
        if let Some(Value::Array(options)) = map.get(combinator) {
            let mut last_error = format!("`{combinator}` has no options");
            for option in options {
                let mut merged = map.clone();
                merged.remove(combinator);
                merge_into(&mut merged, option);
                match instance(&Value::Object(merged), root, depth + 1) {
                    Ok(v) => return Ok(v),
                    Err(e) => last_error = e,
                }
            }
            return Err(last_error);
        }
    }
    let ty = match map.get("type") {
        Some(Value::String(t)) => t.as_str(),
        // Prefer a non-null type: it says more about the shape.
        Some(Value::Array(types)) => types
            .iter()
            .filter_map(Value::as_str)
            .find(|t| *t != "null")
            .or_else(|| types.iter().filter_map(Value::as_str).next())
            .unwrap_or("null"),
        _ => infer_type(map),
    };
    match ty {
        "null" => Ok(Value::Null),
        "boolean" => Ok(Value::Bool(false)),
        "integer" => number(map, true),
        "number" => number(map, false),
        "string" => string(map),
        "array" => array(map, root, depth),
        "object" => object(map, root, depth),
        other => Err(format!("unknown type `{other}`")),
    }
}

fn infer_type(map: &Map<String, Value>) -> &'static str {
    let has = |keys: &[&str]| keys.iter().any(|k| map.contains_key(*k));
    if has(&[
        "properties",
        "required",
        "additionalProperties",
        "minProperties",
    ]) {
        "object"
    } else if has(&["items", "prefixItems", "minItems", "maxItems"]) {
        "array"
    } else if has(&["minLength", "maxLength", "pattern", "format"]) {
        "string"
    } else if has(&[
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
    ]) {
        "number"
    } else {
        "null"
    }
}

fn resolve_ref<'a>(target: &str, root: &'a Value) -> Result<&'a Value, String> {
    let pointer = target
        .strip_prefix('#')
        .ok_or_else(|| format!("reference `{target}` is not local"))?;
    if pointer.is_empty() {
        return Ok(root);
    }
    root.pointer(pointer)
        .ok_or_else(|| format!("reference `{target}` points nowhere"))
}

/// Adds `part`'s keywords to `into`: properties and required lists are united, other
/// keywords already present win.
fn merge_into(into: &mut Map<String, Value>, part: &Value) {
    let Value::Object(part) = part else { return };
    for (key, value) in part {
        match (key.as_str(), into.get_mut(key), value) {
            ("properties", Some(Value::Object(existing)), Value::Object(more)) => {
                for (k, v) in more {
                    existing.entry(k.clone()).or_insert_with(|| v.clone());
                }
            }
            ("required", Some(Value::Array(existing)), Value::Array(more)) => {
                for v in more {
                    if !existing.contains(v) {
                        existing.push(v.clone());
                    }
                }
            }
            (_, Some(_), _) => {}
            (_, None, _) => {
                into.insert(key.clone(), value.clone());
            }
        }
    }
}

fn number(map: &Map<String, Value>, integer: bool) -> Result<Value, String> {
    let get = |k: &str| map.get(k).and_then(Value::as_f64);
    let mut low = get("minimum");
    if let Some(ex) = get("exclusiveMinimum") {
        let above = if integer { ex.floor() + 1.0 } else { ex + 1.0 };
        low = Some(low.map_or(above, |l| l.max(above)));
    }
    let mut high = get("maximum");
    if let Some(ex) = get("exclusiveMaximum") {
        let below = if integer {
            ex.ceil() - 1.0
        } else {
            ex - f64::EPSILON.max(ex.abs() * 1e-9)
        };
        high = Some(high.map_or(below, |h| h.min(below)));
    }
    let mut value = match (low, high) {
        (Some(l), _) => l,
        (None, Some(h)) if h < 0.0 => h,
        _ => 0.0,
    };
    if integer {
        value = value.ceil();
    }
    if let Some(step) = get("multipleOf").filter(|s| *s > 0.0) {
        value = (value / step).ceil() * step;
    }
    if let (Some(l), Some(h)) = (low, high)
        && (l > h || value > h)
    {
        return Err(format!("no number satisfies minimum {l} and maximum {h}"));
    }
    if integer || value.fract() == 0.0 && value.abs() < 9e15 {
        Ok(json!(value as i64))
    } else {
        Ok(json!(value))
    }
}

fn string(map: &Map<String, Value>) -> Result<Value, String> {
    let mut text = match map.get("format").and_then(Value::as_str) {
        Some("date-time") => "2024-01-01T00:00:00Z",
        Some("date") => "2024-01-01",
        Some("time") => "00:00:00Z",
        Some("duration") => "P1D",
        Some("email" | "idn-email") => "dev@example.com",
        Some("hostname" | "idn-hostname") => "example.com",
        Some("ipv4") => "127.0.0.1",
        Some("ipv6") => "::1",
        Some("uri" | "iri" | "url") => "https://example.com/",
        Some("uri-reference" | "iri-reference") => "/",
        Some("uuid") => "00000000-0000-4000-8000-000000000000",
        Some("json-pointer") => "",
        Some("regex") => ".*",
        _ => "",
    }
    .to_string();
    let min = map.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    while text.chars().count() < min {
        text.push('x');
    }
    if let Some(max) = map.get("maxLength").and_then(Value::as_u64)
        && text.chars().count() > max as usize
    {
        return Err(format!("cannot fit an example into maxLength {max}"));
    }
    Ok(Value::String(text))
}

fn array(map: &Map<String, Value>, root: &Value, depth: usize) -> Result<Value, String> {
    let min = map.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
    let mut items = Vec::with_capacity(min);
    if let Some(Value::Array(prefix)) = map.get("prefixItems") {
        for schema in prefix.iter().take(min) {
            items.push(instance(schema, root, depth + 1)?);
        }
    }
    while items.len() < min {
        let schema = map.get("items").unwrap_or(&Value::Bool(true));
        items.push(instance(schema, root, depth + 1)?);
    }
    Ok(Value::Array(items))
}

fn object(map: &Map<String, Value>, root: &Value, depth: usize) -> Result<Value, String> {
    let empty = Map::new();
    let properties = map
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let mut out = Map::new();
    for name in map
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        let schema = properties
            .get(name)
            .or_else(|| map.get("additionalProperties"))
            .unwrap_or(&Value::Bool(true));
        let value =
            instance(schema, root, depth + 1).map_err(|e| format!("property `{name}`: {e}"))?;
        out.insert(name.to_string(), value);
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::TaskKind;

    fn answer(kind: TaskKind, raw: Value) -> Result<ProviderAnswer, ProviderError> {
        let request = TaskRequest::parse(kind, &raw).unwrap();
        let schema = request.output_schema();
        DevProvider::answer(&ModelRef::new("dev", "dev-1"), &request, &schema)
    }

    #[test]
    fn answers_are_deterministic_and_valid() {
        let raw = json!({"input": "hello", "labels": ["a", "b", "c"]});
        let first = answer(TaskKind::Classify, raw.clone()).unwrap();
        assert_eq!(first, answer(TaskKind::Classify, raw).unwrap());
        let many = answer(
            TaskKind::ClassifyMany,
            json!({"items": [{"id": "1", "input": "x"}, {"id": "2", "input": "y"}], "labels": ["a", "b"]}),
        )
        .unwrap();
        assert_eq!(many.output["results"].as_array().unwrap().len(), 2);
        let text = answer(
            TaskKind::GenerateText,
            json!({"prompt": "Say hi to the team"}),
        )
        .unwrap();
        assert!(
            text.output["text"]
                .as_str()
                .unwrap()
                .starts_with("[dev:dev-1] Say hi")
        );
        assert!(text.usage.input_tokens > 0);
    }

    #[test]
    fn extract_builds_the_smallest_valid_instance() {
        let out = answer(
            TaskKind::ExtractData,
            json!({"input": "x", "schema": {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "minLength": 3},
                    "age": {"type": "integer", "minimum": 18, "multipleOf": 5},
                    "kind": {"enum": ["person", "robot"]},
                    "when": {"type": "string", "format": "date"},
                    "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}, "minItems": 2},
                    "optional": {"type": "string"}
                },
                "required": ["name", "age", "kind", "when", "tags"],
                "$defs": {"tag": {"const": "t"}}
            }}),
        )
        .unwrap();
        assert_eq!(
            out.output,
            json!({"name": "xxx", "age": 20, "kind": "person", "when": "2024-01-01", "tags": ["t", "t"]})
        );
        let scalar = answer(
            TaskKind::ExtractData,
            json!({"input": "x", "schema": {"type": "number", "exclusiveMinimum": 2.5}}),
        )
        .unwrap();
        assert_eq!(scalar.output, json!(3.5));
    }

    #[test]
    fn unsatisfiable_schemas_fail_clearly() {
        let err = answer(
            TaskKind::ExtractData,
            json!({"input": "x", "schema": {"type": "string", "pattern": "^[0-9]{4}$"}}),
        )
        .unwrap_err();
        assert!(
            matches!(&err, ProviderError::Failed(m) if m.contains("dev provider cannot")),
            "{err:?}"
        );
    }
}
