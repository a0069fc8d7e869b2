//! The built-in `dev` provider: offline, deterministic, free. **For development and tests
//! only**: its answers come from keyword heuristics and a hash of the model configuration
//! and the request, not from any understanding of the input — plausible for examples,
//! never a model.
//!
//! | kind | answer |
//! | --- | --- |
//! | `generate_text` | `"[dev provider, <model>] <the prompt's first words> (#<hash>)"`, cut to `max_output_tokens` words |
//! | `classify` | the label whose name, description or cue words (a small built-in list: `spam` ← "free", "win", "prize"…; `complaint` ← "refund", "broken"…; `praise` ← "love", "great"…) occur most in the input; with no cue at all, the label at index `hash mod labels`; confidence `null` |
//! | `classify_many` | one result per item, in item order, each picked as for `classify` |
//! | `extract_data` | the smallest instance the schema allows (required properties only, the first `enum` value, `const`, `minimum`s, `minLength`/`minItems` padding, examples for common formats), with top-level number and integer properties taken from the numbers in the input (the one after the property's name, else the next unused one) and string properties from the word after the property's name, where the result stays valid; a schema it cannot satisfy fails the task clearly |
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
                let mut text = format!("[dev provider, {}]", model.model);
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
                let label = &r.labels[choose_label(&r.input, &r.labels, seed)];
                json!({ "label": label.name(), "confidence": Value::Null })
            }
            TaskRequest::ClassifyMany(r) => {
                let results: Vec<Value> = r
                    .items
                    .iter()
                    .map(|item| {
                        let s = self::seed(&json!([seed.to_string(), item.id, item.input]));
                        let label = &r.labels[choose_label(&item.input, &r.labels, s)];
                        json!({ "id": item.id, "label": label.name() })
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
                let smallest = builder
                    .instance(output_schema, 0)
                    .map_err(|refusal| refused(refusal, max_output_bytes))?;
                // Values found in the input, where the schema still holds with them.
                let instance = match (request, fill_from_input(request, &smallest)) {
                    (TaskRequest::ExtractData(_), Some(filled))
                        if validate_output(request, &filled).is_ok() =>
                    {
                        filled
                    }
                    _ => smallest,
                };
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
            estimated: false,
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

/// Cue words of common label names (lower case).
const CUES: &[(&str, &[&str])] = &[
    (
        "spam",
        &[
            "free",
            "win",
            "winner",
            "prize",
            "cruise",
            "offer",
            "click",
            "lottery",
            "cash",
            "urgent",
            "congratulations",
            "deal",
        ],
    ),
    (
        "ham",
        &[
            "meeting", "report", "invoice", "schedule", "attached", "thanks", "tomorrow", "project",
        ],
    ),
    (
        "complaint",
        &[
            "refund",
            "broken",
            "bad",
            "terrible",
            "angry",
            "late",
            "worst",
            "disappointed",
            "problem",
            "not working",
        ],
    ),
    (
        "praise",
        &[
            "love",
            "great",
            "thanks",
            "thank",
            "excellent",
            "awesome",
            "amazing",
            "perfect",
            "happy",
        ],
    ),
    (
        "positive",
        &[
            "love",
            "great",
            "good",
            "excellent",
            "awesome",
            "amazing",
            "happy",
            "perfect",
        ],
    ),
    (
        "negative",
        &[
            "bad", "terrible", "awful", "hate", "worst", "angry", "broken", "poor",
        ],
    ),
    ("neutral", &["okay", "fine", "average"]),
    (
        "urgent",
        &["urgent", "asap", "immediately", "now", "down", "outage"],
    ),
    (
        "billing",
        &["invoice", "payment", "charge", "refund", "bill", "price"],
    ),
    (
        "support",
        &["help", "error", "issue", "problem", "broken", "bug"],
    ),
];

/// The label the input's words point to: each label scores the words of its name and
/// description, and its cue words, found in the input; ties and no cue at all fall back
/// to the hash pick, so answers stay deterministic.
fn choose_label(input: &str, labels: &[tollgate_core::kinds::Label], seed: u64) -> usize {
    let text = input.to_lowercase();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .collect();
    let has = |cue: &str| {
        if cue.contains(' ') {
            text.contains(cue)
        } else {
            words.contains(&cue)
        }
    };
    let scores: Vec<usize> = labels
        .iter()
        .map(|label| {
            let name = label.name().to_lowercase();
            let own = name
                .split(|c: char| !c.is_alphanumeric())
                .chain(
                    label
                        .description()
                        .unwrap_or_default()
                        .split(|c: char| !c.is_alphanumeric()),
                )
                .filter(|w| w.len() > 3)
                .filter(|w| has(&w.to_lowercase()))
                .count();
            let cues = CUES
                .iter()
                .filter(|(label, _)| *label == name)
                .flat_map(|(_, cues)| cues.iter())
                .filter(|cue| has(cue))
                .count();
            own + cues
        })
        .collect();
    let best = scores.iter().copied().max().unwrap_or(0);
    let leaders: Vec<usize> = (0..labels.len()).filter(|&i| scores[i] == best).collect();
    if best == 0 || leaders.is_empty() {
        pick(seed, labels.len())
    } else {
        leaders[pick(seed, leaders.len())]
    }
}

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
fn fill_from_input(request: &TaskRequest, smallest: &Value) -> Option<Value> {
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
                .starts_with("[dev provider, dev-1] Say hi")
        );
        assert!(text.usage.input_tokens > 0);
    }

    /// The README's examples answer plausibly (a heuristic, said so, never a model).
    #[test]
    fn readme_examples_answer_plausibly() {
        let spam = answer(
            TaskKind::Classify,
            json!({"input": "Win a free cruise!", "labels": ["spam", "ham"]}),
        )
        .unwrap();
        assert_eq!(spam.output["label"], "spam");
        let many = answer(
            TaskKind::ClassifyMany,
            json!({"items": [{"id": "a", "input": "refund please"}, {"id": "b", "input": "love it"}],
                   "labels": ["complaint", "praise"]}),
        )
        .unwrap();
        assert_eq!(
            many.output["results"],
            json!([{"id": "a", "label": "complaint"}, {"id": "b", "label": "praise"}])
        );
        let invoice = answer(
            TaskKind::ExtractData,
            json!({"input": "Invoice 88, total 120.50 EUR",
                   "schema": {"type": "object", "required": ["number", "total"],
                              "properties": {"number": {"type": "integer"}, "total": {"type": "number"}}}}),
        )
        .unwrap();
        assert_eq!(invoice.output, json!({"number": 88, "total": 120.5}));
        let named = answer(
            TaskKind::ExtractData,
            json!({"input": "Order 7 for customer ACME-42, 3 items",
                   "schema": {"type": "object", "required": ["customer", "items"],
                              "properties": {"customer": {"type": "string"}, "items": {"type": "integer", "minimum": 1}}}}),
        )
        .unwrap();
        assert_eq!(named.output["customer"], "ACME-42");
        // An input without cues still answers a valid label, deterministically.
        let plain = json!({"input": "xyzzy", "labels": ["a", "b", "c"]});
        assert_eq!(
            answer(TaskKind::Classify, plain.clone()).unwrap(),
            answer(TaskKind::Classify, plain).unwrap()
        );
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
