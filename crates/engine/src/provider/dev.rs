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
use crate::cpu::{self, Halt, Stop};
use async_trait::async_trait;
use serde_json::{Map, Value, json};
use std::time::Duration;
use tollgate_core::canonical::hash_value;
use tollgate_core::{
    DEFAULT_MAX_OUTPUT_BYTES, ModelRef, TaskRequest, Usage, check_output_size, validate_output,
};

/// Deepest schema nesting the instance builder follows.
const MAX_SCHEMA_DEPTH: usize = 32;
/// How long building one answer may take unless the model's `time_limit_ms` says
/// otherwise. A sane schema takes milliseconds; this bounds pathological ones.
pub const DEFAULT_TIME_LIMIT: Duration = Duration::from_secs(30);

/// The offline, deterministic development and test provider.
#[derive(Debug, Clone, Default)]
pub struct DevProvider;

/// Why no instance was built.
#[derive(Debug)]
enum Refusal {
    /// The schema allows no value the builder can find.
    Unsatisfiable(String),
    /// The instance would pass the byte budget.
    TooLarge,
    /// The caller went away, or the time limit passed.
    Halted(Stop),
}

impl From<String> for Refusal {
    fn from(reason: String) -> Refusal {
        Refusal::Unsatisfiable(reason)
    }
}

impl DevProvider {
    /// A dev provider.
    pub fn new() -> DevProvider {
        DevProvider
    }

    /// The deterministic answer for a call, without the configured latency, within the
    /// default output limit. Runs on the calling thread: async callers should prefer
    /// [`Provider::complete`], which builds the answer off the runtime.
    pub fn answer(
        model: &ModelRef,
        request: &TaskRequest,
        output_schema: &Value,
    ) -> Result<ProviderAnswer, ProviderError> {
        Self::answer_within(
            model,
            request,
            output_schema,
            DEFAULT_MAX_OUTPUT_BYTES,
            &Halt::never(),
        )
    }

    /// The answer, never building an output larger than `max_output_bytes`, stopping
    /// when `halt` says so.
    fn answer_within(
        model: &ModelRef,
        request: &TaskRequest,
        output_schema: &Value,
        max_output_bytes: usize,
        halt: &Halt,
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
                let mut builder = Builder {
                    root: output_schema,
                    budget: max_output_bytes,
                    halt,
                };
                let instance = builder
                    .instance(output_schema, 0)
                    .map_err(|refusal| refused(refusal, max_output_bytes))?;
                if let Some(stop) = halt.check() {
                    return Err(refused(Refusal::Halted(stop), max_output_bytes));
                }
                validate_output(request, &instance).map_err(|v| {
                    ProviderError::Failed(format!(
                        "the dev provider cannot build a value for this schema: {}",
                        v.0
                    ))
                })?;
                instance
            }
        };
        let size = check_output_size(&output, max_output_bytes).map_err(|e| {
            ProviderError::OutputTooLarge(format!("the dev provider's answer: {e}"))
        })?;
        let usage = Usage {
            input_tokens: tokens(request_value.to_string().len()),
            output_tokens: tokens(size),
            // The dev provider knows no price: the model's prices, if configured, say it.
            cost_usd: None,
            cached_input_tokens: None,
        };
        Ok(ProviderAnswer { output, usage })
    }
}

fn refused(refusal: Refusal, max_output_bytes: usize) -> ProviderError {
    match refusal {
        Refusal::Unsatisfiable(reason) => ProviderError::Failed(format!(
            "the dev provider cannot build a value for this schema: {reason}"
        )),
        Refusal::TooLarge => ProviderError::OutputTooLarge(format!(
            "the dev provider stopped building the output: the smallest value it finds for \
             this schema is larger than the output limit of {max_output_bytes} bytes \
             (max_output_bytes)"
        )),
        Refusal::Halted(Stop::TimedOut) => ProviderError::Failed(
            "the dev provider gave up building a value for this schema: it took longer than \
             its time limit (model parameter `time_limit_ms`)"
                .to_string(),
        ),
        Refusal::Halted(Stop::Abandoned) => {
            ProviderError::Failed("the dev provider's call was abandoned".to_string())
        }
    }
}

#[async_trait]
impl Provider for DevProvider {
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        if let Some(ms) = call.model.params.get("latency_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let time_limit = call
            .model
            .params
            .get("time_limit_ms")
            .and_then(Value::as_u64)
            .map_or(DEFAULT_TIME_LIMIT, Duration::from_millis);
        let limit = call.max_output_bytes;
        let answered = if cpu::is_small(call.request, None) {
            cpu::inline(Some(time_limit), |halt| {
                DevProvider::answer_within(
                    call.model,
                    call.request,
                    call.output_schema,
                    limit,
                    halt,
                )
            })
        } else {
            // Off the runtime, bounded in time and size; dropping this future (a cancel, a
            // shutdown) stops the builder at its next check.
            let model = call.model.clone();
            let request = call.request.clone();
            let schema = call.output_schema.clone();
            cpu::run(Some(time_limit), move |halt| {
                DevProvider::answer_within(&model, &request, &schema, limit, halt)
            })
            .await
        };
        answered
            .map_err(|panic| ProviderError::Failed(format!("the dev provider failed: {panic}")))?
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

fn tokens(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(4)
}

/// Bytes of a value as compact JSON (the form outputs are measured in).
fn json_len(value: &Value) -> usize {
    check_output_size(value, usize::MAX).unwrap_or(usize::MAX)
}

/// Builds the smallest instance of a schema, charging every byte it adds to a budget
/// (so it never builds more than the output limit) and checking its halt at every step.
struct Builder<'a> {
    root: &'a Value,
    /// Bytes the output may still take.
    budget: usize,
    halt: &'a Halt,
}

impl Builder<'_> {
    /// Takes `bytes` from the budget, or refuses.
    fn charge(&mut self, bytes: usize) -> Result<(), Refusal> {
        if bytes > self.budget {
            return Err(Refusal::TooLarge);
        }
        self.budget -= bytes;
        Ok(())
    }

    fn check(&self) -> Result<(), Refusal> {
        match self.halt.check() {
            Some(stop) => Err(Refusal::Halted(stop)),
            None => Ok(()),
        }
    }

    /// The smallest instance of `schema` (resolved against the root for `$ref`s).
    fn instance(&mut self, schema: &Value, depth: usize) -> Result<Value, Refusal> {
        self.check()?;
        if depth > MAX_SCHEMA_DEPTH {
            return Err("the schema nests or refers to itself too deeply"
                .to_string()
                .into());
        }
        let map = match schema {
            Value::Bool(true) => {
                self.charge(4)?;
                return Ok(Value::Null);
            }
            Value::Bool(false) => {
                return Err("the schema `false` accepts no value".to_string().into());
            }
            Value::Object(map) => map,
            _ => {
                return Err("a subschema is neither an object nor a boolean"
                    .to_string()
                    .into());
            }
        };
        if let Some(Value::String(target)) = map.get("$ref") {
            let resolved = resolve_ref(target, self.root)?;
            return self.instance(resolved, depth + 1);
        }
        if let Some(value) = map.get("const") {
            self.charge(json_len(value))?;
            return Ok(value.clone());
        }
        if let Some(Value::Array(options)) = map.get("enum") {
            let first = options
                .first()
                .ok_or_else(|| "an empty `enum` accepts no value".to_string())?;
            self.charge(json_len(first))?;
            return Ok(first.clone());
        }
        if let Some(Value::Array(parts)) = map.get("allOf") {
            let mut merged = map.clone();
            merged.remove("allOf");
            for part in parts {
                let part = match part.get("$ref").and_then(Value::as_str) {
                    Some(target) => resolve_ref(target, self.root)?,
                    None => part,
                };
                merge_into(&mut merged, part);
            }
            return self.instance(&Value::Object(merged), depth + 1);
        }
        for combinator in ["anyOf", "oneOf"] {
            if let Some(Value::Array(options)) = map.get(combinator) {
                let mut last = Refusal::Unsatisfiable(format!("`{combinator}` has no options"));
                let budget = self.budget;
                for option in options {
                    let mut merged = map.clone();
                    merged.remove(combinator);
                    merge_into(&mut merged, option);
                    match self.instance(&Value::Object(merged), depth + 1) {
                        Ok(v) => return Ok(v),
                        Err(Refusal::Halted(stop)) => return Err(Refusal::Halted(stop)),
                        Err(refusal) => {
                            // A refused option's bytes were never used.
                            self.budget = budget;
                            if !matches!(last, Refusal::TooLarge) {
                                last = refusal;
                            }
                        }
                    }
                }
                return Err(last);
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
        let value = match ty {
            "null" => Value::Null,
            "boolean" => Value::Bool(false),
            "integer" => number(map, true)?,
            "number" => number(map, false)?,
            "string" => return self.string(map),
            "array" => return self.array(map, depth),
            "object" => return self.object(map, depth),
            other => return Err(format!("unknown type `{other}`").into()),
        };
        self.charge(json_len(&value))?;
        Ok(value)
    }

    fn string(&mut self, map: &Map<String, Value>) -> Result<Value, Refusal> {
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
        let min = map
            .get("minLength")
            .and_then(Value::as_u64)
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        // The examples are ASCII: one byte per character. Counted once, padded at once
        // (linear in the length), and charged before anything is allocated.
        let have = text.len();
        let pad = min.saturating_sub(have);
        self.charge(have.saturating_add(pad).saturating_add(2))?;
        text.extend(std::iter::repeat_n('x', pad));
        if let Some(max) = map.get("maxLength").and_then(Value::as_u64)
            && text.len() as u64 > max
        {
            return Err(format!("cannot fit an example into maxLength {max}").into());
        }
        Ok(Value::String(text))
    }

    fn array(&mut self, map: &Map<String, Value>, depth: usize) -> Result<Value, Refusal> {
        let min = map
            .get("minItems")
            .and_then(Value::as_u64)
            .map_or(0, |n| usize::try_from(n).unwrap_or(usize::MAX));
        // Brackets and commas.
        self.charge(2usize.saturating_add(min.saturating_sub(1)))?;
        // Every element takes at least one byte: refuse an impossible count before
        // reserving anything.
        if min > self.budget {
            return Err(Refusal::TooLarge);
        }
        let mut items = Vec::with_capacity(min);
        if let Some(Value::Array(prefix)) = map.get("prefixItems") {
            for schema in prefix.iter().take(min) {
                items.push(self.instance(schema, depth + 1)?);
            }
        }
        if items.len() < min {
            // The builder is deterministic: build the repeated element once, then copy
            // it, charging each copy.
            let schema = map.get("items").unwrap_or(&Value::Bool(true));
            let before = self.budget;
            let first = self.instance(schema, depth + 1)?;
            let size = before - self.budget;
            items.push(first.clone());
            while items.len() < min {
                self.check()?;
                self.charge(size)?;
                items.push(first.clone());
            }
        }
        Ok(Value::Array(items))
    }

    fn object(&mut self, map: &Map<String, Value>, depth: usize) -> Result<Value, Refusal> {
        let empty = Map::new();
        let properties = map
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&empty);
        self.charge(2)?;
        let mut out = Map::new();
        for name in map
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            if out.contains_key(name) {
                continue;
            }
            let schema = properties
                .get(name)
                .or_else(|| map.get("additionalProperties"))
                .unwrap_or(&Value::Bool(true));
            // "name": and a comma.
            self.charge(json_len(&Value::String(name.to_string())) + 2)?;
            let value = self.instance(schema, depth + 1).map_err(|e| match e {
                Refusal::Unsatisfiable(reason) => {
                    Refusal::Unsatisfiable(format!("property `{name}`: {reason}"))
                }
                other => other,
            })?;
            out.insert(name.to_string(), value);
        }
        Ok(Value::Object(out))
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

    fn extract_within(
        schema: Value,
        limit: usize,
        halt: &Halt,
    ) -> Result<ProviderAnswer, ProviderError> {
        let request = TaskRequest::parse(
            TaskKind::ExtractData,
            &json!({"input": "x", "schema": schema}),
        )
        .unwrap();
        let schema = request.output_schema();
        DevProvider::answer_within(
            &ModelRef::new("dev", "dev-1"),
            &request,
            &schema,
            limit,
            halt,
        )
    }

    #[test]
    fn long_strings_are_built_in_linear_time() {
        // Quadratic padding took about 25 s for a million characters.
        let started = std::time::Instant::now();
        let out = extract_within(
            json!({"type": "string", "minLength": 1_000_000}),
            2_000_000,
            &Halt::never(),
        )
        .unwrap();
        assert_eq!(out.output.as_str().unwrap().len(), 1_000_000);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn nothing_is_built_past_the_output_limit() {
        // Without a `type`, so the submit-time floor does not apply: the builder must stop.
        let started = std::time::Instant::now();
        for schema in [
            json!({"minLength": 2_000_000_000u64}),
            json!({"minItems": 100_000_000}),
            json!({"minItems": 1000, "items": {"minItems": 1000, "items": {"minItems": 1000}}}),
            json!({"type": "object", "required": ["a", "b"], "properties": {
                "a": {"minLength": 600}, "b": {"minLength": 600}}}),
        ] {
            let err = extract_within(schema.clone(), 1000, &Halt::never()).unwrap_err();
            assert!(
                matches!(&err, ProviderError::OutputTooLarge(m) if m.contains("1000 bytes")),
                "{schema}: {err:?}"
            );
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        // One option too large, the next fits: the budget of the refused one comes back.
        let out = extract_within(
            json!({"anyOf": [{"type": "string", "minLength": 5000}, {"type": "string", "minLength": 900}]}),
            1000,
            &Halt::never(),
        )
        .unwrap();
        assert_eq!(out.output.as_str().unwrap().len(), 900);
    }

    /// Four options per level, fifteen levels, nothing at the bottom: 4^15 dead ends.
    pub(crate) fn endless_schema() -> Value {
        let mut defs = Map::new();
        for i in 0..15 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"anyOf": [{"$ref": next}, {"$ref": next}, {"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d15".into(), json!(false));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pathological_schema_stops_at_the_time_limit() {
        let request = TaskRequest::parse(
            TaskKind::ExtractData,
            &json!({"input": "x", "schema": endless_schema()}),
        )
        .unwrap();
        let schema = request.output_schema();
        let mut model = ModelRef::new("dev", "dev-1");
        model.params.insert("time_limit_ms".into(), json!(200));
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: None,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        };
        let started = std::time::Instant::now();
        let err = DevProvider.complete(call).await.unwrap_err();
        assert!(
            matches!(&err, ProviderError::Failed(m) if m.contains("time limit")),
            "{err:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
}
