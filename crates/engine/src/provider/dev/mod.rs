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
//! | `chat` | with tools offered and a `tool_choice` that allows calls: one call of the named tool (or the first), its arguments the smallest instance of its `parameters`, id `call_<hash>` — except in `auto` right after tool results, when it answers text; otherwise text: `"[dev provider, <model>] <the last message's first words> (#<hash>)"` |
//! | `extract_data` | the smallest instance the schema allows (required properties only, the first `enum` value, `const`, `minimum`s, `minLength`/`minItems` padding, examples for common formats), with top-level number and integer properties taken from the numbers in the input (the one after the property's name, else the next unused one) and string properties from the word after the property's name, where the result stays valid; a schema it cannot satisfy fails the task clearly |
//!
//! Usage is reported as one token per four bytes of request and output. The model
//! parameter `latency_ms` delays every answer, so cancellation and heartbeats can be
//! exercised; the delay is dropped with the call when a task is canceled. A streamed
//! answer (a task's live readers) comes in small deterministic pieces, `stream_delay_ms`
//! apart (module `stream`).

mod chat;
mod embed;
mod extract;
mod instance;
mod labels;
mod stream;

pub use embed::{DEFAULT_DEV_DIMENSIONS, dev_vector};

use super::{EmbedAnswer, EmbedCall, Provider, ProviderAnswer, ProviderCall, ProviderError};
use crate::cpu::{self, Halt, Stop};
use async_trait::async_trait;
use extract::fill_from_input;
use instance::Builder;
use labels::choose_label;
use serde_json::{Value, json};
use std::time::Duration;
use tollgate_core::canonical::hash_value;
use tollgate_core::{
    DEFAULT_MAX_OUTPUT_BYTES, ModelRef, TaskRequest, Usage, check_output_size, validate_output,
};

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
                if let Some(limit) = r.sampling.max_output_tokens {
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
            TaskRequest::Chat(r) => chat::answer(model, r, seed, max_output_bytes, halt)
                .map_err(|refusal| refused(refusal, max_output_bytes))?,
            TaskRequest::Embed(r) => embed::embed_output(model, r),
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
        let (input_tokens, output_tokens) = match request {
            TaskRequest::Embed(r) => (r.texts().iter().map(|t| tokens(t.len())).sum(), 0),
            _ => (tokens(request_value.to_string().len()), tokens(size)),
        };
        let usage = Usage {
            input_tokens,
            output_tokens,
            // The dev provider knows no price: the model's prices, if configured, say it.
            cost_usd: None,
            cached_input_tokens: None,
            cache_write_input_tokens: None,
            estimated: false,
            cost_nano_usd: None,
        };
        Ok(ProviderAnswer {
            output,
            usage,
            billed_before: false,
        })
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

    async fn complete_streaming(
        &self,
        call: ProviderCall<'_>,
        sink: &crate::stream::StreamSink,
    ) -> Result<ProviderAnswer, ProviderError> {
        let answer = self.complete(call).await?;
        stream::publish(call.model, call.request.kind(), &answer, sink).await;
        Ok(answer)
    }

    async fn embed(&self, call: EmbedCall<'_>) -> Result<EmbedAnswer, ProviderError> {
        if let Some(ms) = call.model.params.get("latency_ms").and_then(Value::as_u64) {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        Ok(embed::embed_answer(&call))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;
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
