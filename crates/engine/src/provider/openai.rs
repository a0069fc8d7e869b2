//! An OpenAI-compatible chat completions provider (OpenAI, vLLM, Ollama, llama.cpp
//! server, …): `POST {base_url}/chat/completions`.
//!
//! - `classify`, `classify_many` and `extract_data` ask for structured output with
//!   `response_format: {"type": "json_schema", "json_schema": {"name", "schema",
//!   "strict"}}` (the nested form). An `extract_data` schema whose root is not an object
//!   is wrapped as `{"value": <schema>}` (structured outputs need an object root) and
//!   unwrapped from the answer. `strict` is on when the schema satisfies strict mode's
//!   rules (every property required, no additional properties), which the built-in
//!   classify schemas always do.
//! - `generate_text` sends the chat as given and returns `{"text": <content>}`.
//! - An `extract_data` request given as a chat (`messages`, what the OpenAI-compatible
//!   door sends for `response_format: json_schema`) is sent as given, the schema only in
//!   `response_format`; the schema `{"type": "object"}` (the door's `json_object`) is
//!   sent as `response_format: {"type": "json_object"}`.
//! - The model's `params` are merged into the request body (`temperature`, `top_p`,
//!   `seed`, …); the request's own `temperature`, `top_p`, `stop`, `seed` and
//!   `max_output_tokens` (sent as `max_tokens`) take precedence.
//! - Failures are retried a bounded number of times (`max_retries`) with exponential
//!   backoff and jitter, on HTTP 408, 409, 429 and 5xx, timeouts and connection errors.
//!   `retry-after-ms` and `Retry-After` (seconds) are honoured; a wait longer than
//!   `max_retry_delay` fails the call at once instead of holding a worker.
//! - Usage comes from `usage.prompt_tokens` and `usage.completion_tokens`; an answer
//!   without them is marked `estimated` (the worker counts the attempt at its bound).
//! - SPEC §14 pause ([`super::pace`]): a 429 pauses the provider on every replica for
//!   its `Retry-After` (or the backoff), at most `max_pause`, paced or not; every HTTP
//!   request first waits until no pause is in force.
//! - SPEC §14 pace: with `requests_per_minute` / `tokens_per_minute` configured, every
//!   HTTP request first waits for its turn on the schedules all replicas share; after a
//!   429 the call waits and tries again — such waits never count against `max_retries`
//!   or `max_retry_delay`, so pacing never fails a task. Without a pace, a 429 is retried
//!   like a 5xx (it counts against `max_retries`; a `Retry-After` longer than
//!   `max_retry_delay` fails the call at once, the pause still holds for other calls).
//! - Provider headers are read defensively ([`retry_after`]): nothing they say can panic
//!   or pause a provider longer than `max_pause`.

use super::pace::{DEFAULT_PACE_OUTPUT_TOKENS, PaceTicket, ProviderPace};
use super::{Provider, ProviderAnswer, ProviderCall, ProviderError, task_instructions};
use crate::config::ProviderKind;
use crate::config::{ConfigError, OPENAI_BASE_URL, ProviderConfig};
use crate::cost::{TokenCounter, body_input_tokens, output_bound};
use crate::metrics as m;
use async_trait::async_trait;
use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::{Map, Value, json};
use std::fmt;
use std::time::Duration;
use tollgate_core::{TaskRequest, Usage};

/// Longest excerpt of an error body kept in a message, in characters.
const MAX_BODY_EXCERPT: usize = 500;

/// An OpenAI-compatible chat completions endpoint.
pub struct OpenAiProvider {
    name: String,
    endpoint: String,
    api_key: Option<String>,
    client: reqwest::Client,
    max_retries: u32,
    retry_backoff: Duration,
    max_retry_delay: Duration,
    pace: Option<ProviderPace>,
}

impl fmt::Debug for OpenAiProvider {
    // Never print the API key.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("max_retries", &self.max_retries)
            .field("pace", &self.pace)
            .finish_non_exhaustive()
    }
}

impl OpenAiProvider {
    /// Builds the provider `[providers.<name>]`, reading its API key from the environment
    /// variable `api_key_env` now.
    pub fn new(name: &str, config: &ProviderConfig) -> Result<OpenAiProvider, ConfigError> {
        let base = config
            .base_url
            .as_deref()
            .unwrap_or(OPENAI_BASE_URL)
            .trim_end_matches('/');
        let api_key = match &config.api_key_env {
            Some(var) => Some(std::env::var(var).map_err(|_| {
                ConfigError::at(
                    format!("providers.{name}.api_key_env"),
                    format!("the environment variable {var} is not set"),
                )
            })?),
            None => None,
        };
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("tollgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                ConfigError::at(
                    format!("providers.{name}"),
                    format!("cannot build an HTTP client: {e}"),
                )
            })?;
        Ok(OpenAiProvider {
            name: name.to_string(),
            endpoint: format!("{base}/chat/completions"),
            api_key,
            client,
            max_retries: config.max_retries,
            retry_backoff: config.retry_backoff,
            max_retry_delay: config.max_retry_delay,
            pace: None,
        })
    }

    /// SPEC §14: paces this provider's calls with the schedules every replica shares.
    pub fn with_pace(mut self, pace: Option<ProviderPace>) -> OpenAiProvider {
        self.pace = pace;
        self
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// POSTs `body`, retrying what may succeed later. Returns the answer's JSON and, when
    /// paced, the ticket to settle with its usage. An answer body longer than
    /// `max_answer_bytes` is not read further.
    async fn post(
        &self,
        body: &Value,
        estimate: u64,
        max_answer_bytes: usize,
    ) -> Result<(Value, Option<PaceTicket>), ProviderError> {
        let text = serde_json::to_string(body)
            .map_err(|e| ProviderError::Failed(format!("cannot encode the request: {e}")))?;
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let mut attempt: u32 = 0;
        loop {
            let ticket = match &self.pace {
                Some(pace) => Some(pace.wait_turn(model, estimate).await),
                None => None,
            };
            let mut request = self
                .client
                .post(&self.endpoint)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(text.clone());
            if let Some(key) = &self.api_key {
                request = request.bearer_auth(key);
            }
            let (message, retry_after) = match request.send().await {
                Ok(response) if response.status().is_success() => {
                    match read_bounded(response, max_answer_bytes).await {
                        Ok(bytes) => return Ok((parse_json_body(bytes).await?, ticket)),
                        Err(ReadError::TooLarge) => {
                            return Err(ProviderError::OutputTooLarge(format!(
                                "the provider's answer is longer than {max_answer_bytes} bytes, \
                                 more than any output within the output limit needs \
                                 (max_output_bytes)"
                            )));
                        }
                        Err(ReadError::Http(e)) if is_transient(&e) => (describe(&e), None),
                        Err(ReadError::Http(e)) => return Err(ProviderError::Failed(describe(&e))),
                    }
                }
                Ok(response) => {
                    let status = response.status();
                    let retry_after = retry_after(response.headers());
                    let text = response.text().await.unwrap_or_default();
                    let message = format!("HTTP {status}: {}", excerpt(&text));
                    if status == StatusCode::TOO_MANY_REQUESTS {
                        metrics::counter!(m::PROVIDER_429S_TOTAL, "provider" => self.name.clone())
                            .increment(1);
                        if let Some(pace) = &self.pace {
                            // SPEC §14: every provider's 429 pauses it on every replica
                            // (cut to `max_pause`). A paced call then waits for its turn
                            // again; an unpaced one retries as below (its retry waits the
                            // pause out first).
                            let pause = retry_after.unwrap_or_else(|| self.backoff(attempt));
                            let pause = pace.pause(pause).await;
                            tracing::info!(provider = %self.name, ?pause, "429: provider paused");
                            if pace.is_paced() {
                                continue;
                            }
                        }
                    }
                    if !is_retryable_status(status) {
                        return Err(ProviderError::Failed(message));
                    }
                    (message, retry_after)
                }
                Err(e) if is_transient(&e) => (describe(&e), None),
                Err(e) => return Err(ProviderError::Failed(describe(&e))),
            };
            if attempt >= self.max_retries {
                return Err(ProviderError::Failed(format!(
                    "{message} (gave up after {} attempts)",
                    attempt + 1
                )));
            }
            let delay = match retry_after {
                Some(wait) if wait > self.max_retry_delay => {
                    return Err(ProviderError::Failed(format!(
                        "{message}; the provider asked to retry after {} s, longer than \
                         max_retry_delay ({} s)",
                        wait.as_secs_f64(),
                        self.max_retry_delay.as_secs_f64()
                    )));
                }
                Some(wait) => wait,
                None => self.backoff(attempt),
            };
            tracing::debug!(provider = %self.name, attempt, ?delay, %message, "retrying");
            metrics::counter!(m::PROVIDER_RETRIES_TOTAL, "provider" => self.name.clone())
                .increment(1);
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// Exponential backoff with jitter: `retry_backoff · 2^attempt`, capped at
    /// `max_retry_delay`, then a random 50–100 % of that.
    fn backoff(&self, attempt: u32) -> Duration {
        let full = self
            .retry_backoff
            .saturating_mul(1u32 << attempt.min(20))
            .min(self.max_retry_delay);
        full.mul_f64(0.5 + fastrand::f64() * 0.5)
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        let (body, shape) = request_body(&call);
        // SPEC §14 token pace: this call's bound, counted as SPEC §13 counts a
        // reservation (its re-ask messages included), settled with the real usage.
        let estimate = if self.pace.as_ref().is_some_and(ProviderPace::is_paced) {
            let counter = TokenCounter::for_model(Some(ProviderKind::Openai), &call.model.model);
            let output = output_bound(call.model, call.request)
                .unwrap_or(u64::from(DEFAULT_PACE_OUTPUT_TOKENS));
            body_input_tokens(counter, &body).saturating_add(output)
        } else {
            0
        };
        let (answer, ticket) = self
            .post(&body, estimate, answer_limit(call.max_output_bytes))
            .await?;
        let parsed = parse_answer(&answer, shape);
        if let (Some(pace), Some(ticket)) = (&self.pace, &ticket) {
            let used = match &parsed {
                Ok(a) => Some(a.usage),
                Err(ProviderError::InvalidOutput { usage, .. }) => Some(*usage),
                Err(_) => None,
            };
            if let Some(u) = used {
                pace.settle(ticket, u.input_tokens.saturating_add(u.output_tokens))
                    .await;
            }
        }
        parsed
    }
}

/// The longest answer body read for an output limit: the output arrives as a JSON string
/// inside the answer's JSON, where escaping can make each byte up to six (`\u0000`), plus
/// the answer's own fields.
fn answer_limit(max_output_bytes: usize) -> usize {
    max_output_bytes.saturating_mul(6).saturating_add(64 * 1024)
}

enum ReadError {
    TooLarge,
    Http(reqwest::Error),
}

/// The body, chunk by chunk, stopping past `limit` bytes.
async fn read_bounded(mut response: reqwest::Response, limit: usize) -> Result<Vec<u8>, ReadError> {
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(ReadError::Http)? {
        if bytes.len() + chunk.len() > limit {
            return Err(ReadError::TooLarge);
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(bytes)
}

/// Parses an answer body off the async runtime (it may be megabytes).
async fn parse_json_body(bytes: Vec<u8>) -> Result<Value, ProviderError> {
    crate::cpu::run(None, move |_| {
        serde_json::from_slice::<Value>(&bytes).map_err(|e| {
            ProviderError::Failed(format!(
                "the provider's answer is not JSON ({e}): {}",
                excerpt(&String::from_utf8_lossy(
                    &bytes[..bytes.len().min(4 * MAX_BODY_EXCERPT)]
                ))
            ))
        })
    })
    .await
    .map_err(|panic| {
        ProviderError::Failed(format!("reading the provider's answer failed: {panic}"))
    })?
}

/// How the answer's content becomes the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    /// `{"text": content}`.
    Text,
    /// The content is the output's JSON.
    Json,
    /// The content is `{"value": output}`.
    WrappedJson,
}

/// The chat completions request body for a call, and how to read its answer.
pub fn request_body(call: &ProviderCall<'_>) -> (Value, AnswerShape) {
    let mut body: Map<String, Value> = call.model.params.clone();
    body.insert("model".into(), json!(call.model.model));
    let mut messages: Vec<Value> = Vec::new();
    let shape = match call.request {
        TaskRequest::GenerateText(r) => {
            if let Some(system) = &r.system {
                messages.push(json!({"role": "system", "content": system}));
            }
            if let Some(chat) = &r.messages {
                messages.extend(
                    chat.iter()
                        .map(|m| json!({"role": m.role, "content": m.content})),
                );
            }
            if let Some(prompt) = &r.prompt {
                messages.push(json!({"role": "user", "content": prompt}));
            }
            insert_sampling(
                &mut body,
                Sampling {
                    max_output_tokens: r.max_output_tokens,
                    temperature: r.temperature,
                    top_p: r.top_p,
                    stop: r.stop.as_deref(),
                    seed: r.seed,
                },
            );
            AnswerShape::Text
        }
        TaskRequest::Classify(r) => {
            messages.push(json!({"role": "system", "content": task_instructions(call.request)}));
            messages.push(json!({"role": "user", "content": r.input}));
            body.insert(
                "response_format".into(),
                response_format("classify", call.output_schema, true),
            );
            AnswerShape::Json
        }
        TaskRequest::ClassifyMany(r) => {
            let items: Vec<Value> = r
                .items
                .iter()
                .map(|i| json!({"id": i.id, "input": i.input}))
                .collect();
            messages.push(json!({"role": "system", "content": task_instructions(call.request)}));
            messages.push(json!({"role": "user", "content": Value::Array(items).to_string()}));
            body.insert(
                "response_format".into(),
                response_format("classify_many", call.output_schema, true),
            );
            AnswerShape::Json
        }
        TaskRequest::ExtractData(r) => {
            let (schema, shape) = if is_object_schema(call.output_schema) {
                (call.output_schema.clone(), AnswerShape::Json)
            } else {
                (wrap_schema(call.output_schema), AnswerShape::WrappedJson)
            };
            match (&r.messages, &r.input) {
                // A chat (the OpenAI-compatible door's `json_schema`): sent as given, the
                // schema travels in `response_format` only.
                (Some(chat), _) => {
                    if let Some(extra) = &r.instructions {
                        messages.push(json!({"role": "system", "content": extra}));
                    }
                    messages.extend(
                        chat.iter()
                            .map(|m| json!({"role": m.role, "content": m.content})),
                    );
                }
                (None, input) => {
                    let system = format!(
                        "{}\nJSON Schema of the answer:\n{}",
                        task_instructions(call.request),
                        schema
                    );
                    messages.push(json!({"role": "system", "content": system}));
                    messages
                        .push(json!({"role": "user", "content": input.as_deref().unwrap_or("")}));
                }
            }
            let format = if schema == json!({"type": "object"}) {
                // Any object: JSON mode says exactly that, and more servers know it.
                json!({"type": "json_object"})
            } else {
                response_format("extract_data", &schema, is_strict_compatible(&schema))
            };
            body.insert("response_format".into(), format);
            insert_sampling(
                &mut body,
                Sampling {
                    max_output_tokens: r.max_output_tokens,
                    temperature: r.temperature,
                    top_p: r.top_p,
                    stop: r.stop.as_deref(),
                    seed: r.seed,
                },
            );
            shape
        }
    };
    if let Some(error) = call.previous_error {
        messages.push(json!({
            "role": "user",
            "content": format!(
                "Your previous answer was refused: {error}\nAnswer again, following the \
                 required format exactly."
            ),
        }));
    }
    body.insert("messages".into(), Value::Array(messages));
    (Value::Object(body), shape)
}

/// The request's own sampling fields, borrowed.
struct Sampling<'a> {
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Option<&'a [String]>,
    seed: Option<i64>,
}

/// The request's sampling fields win over the model's `params`; `max_output_tokens` is
/// sent as `max_tokens` (what every OpenAI-compatible server reads).
fn insert_sampling(body: &mut Map<String, Value>, s: Sampling<'_>) {
    if let Some(t) = s.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = s.max_output_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    if let Some(p) = s.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(stop) = s.stop {
        body.insert("stop".into(), json!(stop));
    }
    if let Some(seed) = s.seed {
        body.insert("seed".into(), json!(seed));
    }
}

fn response_format(name: &str, schema: &Value, strict: bool) -> Value {
    json!({
        "type": "json_schema",
        "json_schema": { "name": name, "schema": schema, "strict": strict }
    })
}

/// Whether a schema's root is an object schema (structured outputs need one).
fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// `{"type": "object", "properties": {"value": schema}, …}`. Definitions move to the new
/// root so `#/$defs/…` references still resolve; references to the old root are
/// rewritten to `#/properties/value…`.
fn wrap_schema(schema: &Value) -> Value {
    let mut inner = schema.clone();
    let mut wrapper = Map::new();
    if let Value::Object(map) = &mut inner {
        for defs in ["$defs", "definitions"] {
            if let Some(d) = map.remove(defs) {
                wrapper.insert(defs.to_string(), d);
            }
        }
        // `$schema` belongs at the root.
        if let Some(dialect) = map.remove("$schema") {
            wrapper.insert("$schema".into(), dialect);
        }
    }
    rewrite_root_refs(&mut inner);
    wrapper.insert("type".into(), json!("object"));
    wrapper.insert("properties".into(), json!({ "value": inner }));
    wrapper.insert("required".into(), json!(["value"]));
    wrapper.insert("additionalProperties".into(), json!(false));
    Value::Object(wrapper)
}

fn rewrite_root_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "$ref"
                    && let Value::String(target) = child
                    && target.starts_with('#')
                    && !target.starts_with("#/$defs")
                    && !target.starts_with("#/definitions")
                {
                    *target = format!("#/properties/value{}", &target[1..]);
                } else {
                    rewrite_root_refs(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_root_refs),
        _ => {}
    }
}

/// Strict structured outputs need every object to list all its properties as required
/// and to forbid additional ones.
fn is_strict_compatible(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => {
            let is_object = map.get("type").and_then(Value::as_str) == Some("object")
                || map.contains_key("properties");
            if is_object {
                if map.get("additionalProperties") != Some(&Value::Bool(false)) {
                    return false;
                }
                let props: Vec<&String> = map
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().collect())
                    .unwrap_or_default();
                let required: Vec<&str> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if props.iter().any(|p| !required.contains(&p.as_str())) {
                    return false;
                }
            }
            map.iter().all(|(key, child)| match key.as_str() {
                // Data, not subschemas.
                "enum" | "const" | "default" | "examples" | "required" => true,
                _ => is_strict_compatible(child),
            })
        }
        Value::Array(items) => items.iter().all(is_strict_compatible),
        Value::Bool(_) => true,
        _ => true,
    }
}

/// Reads a chat completions answer.
pub fn parse_answer(answer: &Value, shape: AnswerShape) -> Result<ProviderAnswer, ProviderError> {
    let reported = |key: &str| {
        answer
            .get("usage")
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
    };
    let (input, output) = (reported("prompt_tokens"), reported("completion_tokens"));
    let usage = Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cost_usd: None,
        cached_input_tokens: answer
            .pointer("/usage/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64),
        // No usage reported: the worker counts the attempt at its bound (docs/budgets.md).
        estimated: input.is_none() || output.is_none(),
    };
    let invalid = |message: String| ProviderError::InvalidOutput { message, usage };
    let message = answer.pointer("/choices/0/message").ok_or_else(|| {
        ProviderError::Failed(format!(
            "the provider's answer has no choices[0].message: {}",
            excerpt(&answer.to_string())
        ))
    })?;
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
        return Err(invalid(format!("the model refused: {}", excerpt(refusal))));
    }
    let Some(content) = message.get("content").and_then(Value::as_str) else {
        return Err(invalid("the answer has no message content".to_string()));
    };
    let output = match shape {
        AnswerShape::Text => json!({ "text": content }),
        AnswerShape::Json | AnswerShape::WrappedJson => {
            let parsed: Value = serde_json::from_str(strip_code_fence(content)).map_err(|e| {
                invalid(format!(
                    "the answer is not valid JSON ({e}): {}",
                    excerpt(content)
                ))
            })?;
            if shape == AnswerShape::WrappedJson {
                match parsed {
                    Value::Object(mut map) if map.contains_key("value") => {
                        map.remove("value").unwrap_or(Value::Null)
                    }
                    other => {
                        return Err(invalid(format!(
                            "the answer must be an object {{\"value\": …}}, got {}",
                            excerpt(&other.to_string())
                        )));
                    }
                }
            } else {
                parsed
            }
        }
    };
    Ok(ProviderAnswer { output, usage })
}

/// Some local servers wrap JSON in a Markdown code fence despite `response_format`.
fn strip_code_fence(content: &str) -> &str {
    let trimmed = content.trim();
    let Some(rest) = trimmed.strip_prefix("```") else {
        return trimmed;
    };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

fn is_retryable_status(status: StatusCode) -> bool {
    status == StatusCode::REQUEST_TIMEOUT
        || status == StatusCode::CONFLICT
        || status == StatusCode::TOO_MANY_REQUESTS
        || status.is_server_error()
}

fn is_transient(e: &reqwest::Error) -> bool {
    e.is_timeout() || e.is_connect() || e.is_request() || e.is_body()
}

/// The longest wait a header can ask for, before any configured cap: a day. Anything
/// longer reads as a day (and is then cut to `max_pause` or refused by
/// `max_retry_delay`).
const LONGEST_HEADER_WAIT: Duration = Duration::from_secs(24 * 3600);

/// The wait a provider asks for: `retry-after-ms` (OpenAI's, in milliseconds), else
/// `Retry-After` in seconds or as an HTTP date. Read defensively, as anything a
/// provider (or a proxy before it) sends: values that are not text, not a number or a
/// date, negative, NaN or infinite are ignored (as if absent); a date in the past is 0;
/// a huge value reads as [`LONGEST_HEADER_WAIT`]. Never panics.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    retry_after_at(headers, std::time::SystemTime::now())
}

fn retry_after_at(headers: &HeaderMap, now: std::time::SystemTime) -> Option<Duration> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|t| !t.is_empty())
    };
    let seconds = |n: f64| -> Option<Duration> {
        (n.is_finite() && n >= 0.0)
            .then(|| Duration::from_secs_f64(n.min(LONGEST_HEADER_WAIT.as_secs_f64())))
    };
    if let Some(wait) = text("retry-after-ms")
        .and_then(|t| t.parse::<f64>().ok())
        .and_then(|ms| seconds(ms / 1000.0))
    {
        return Some(wait);
    }
    let value = text("retry-after")?;
    match value.parse::<f64>() {
        Ok(n) => seconds(n),
        Err(_) => httpdate::parse_http_date(value).ok().map(|at| {
            at.duration_since(now)
                .unwrap_or(Duration::ZERO)
                .min(LONGEST_HEADER_WAIT)
        }),
    }
}

/// An error and its causes, e.g. "error sending request: connection refused".
fn describe(e: &reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        format!("timed out: {e}")
    } else {
        e.to_string()
    };
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

fn excerpt(text: &str) -> String {
    match text.char_indices().nth(MAX_BODY_EXCERPT) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{ModelRef, TaskKind};

    fn call_for(kind: TaskKind, raw: Value) -> (TaskRequest, Value) {
        let request = TaskRequest::parse(kind, &raw).unwrap();
        let schema = request.output_schema();
        (request, schema)
    }

    #[test]
    fn classify_asks_for_strict_nested_json_schema() {
        let (request, schema) = call_for(
            TaskKind::Classify,
            json!({"input": "Win a cruise", "labels": ["spam", "ham"]}),
        );
        let mut model = ModelRef::new("openai", "gpt-x");
        model.params.insert("temperature".into(), json!(0));
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: Some("label `eggs` is not one of the labels"),
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body(&call);
        assert_eq!(shape, AnswerShape::Json);
        assert_eq!(body["model"], "gpt-x");
        assert_eq!(body["temperature"], 0);
        assert_eq!(body["response_format"]["type"], "json_schema");
        assert_eq!(body["response_format"]["json_schema"]["strict"], true);
        assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
        let messages = body["messages"].as_array().unwrap();
        assert!(
            messages.last().unwrap()["content"]
                .as_str()
                .unwrap()
                .contains("eggs")
        );
    }

    #[test]
    fn non_object_extract_schemas_are_wrapped_and_unwrapped() {
        let (request, schema) = call_for(
            TaskKind::ExtractData,
            json!({"input": "x", "schema": {
                "type": "array", "items": {"$ref": "#/$defs/n"},
                "$defs": {"n": {"type": "integer"}}
            }}),
        );
        let model = ModelRef::new("openai", "m");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body(&call);
        assert_eq!(shape, AnswerShape::WrappedJson);
        let sent = &body["response_format"]["json_schema"]["schema"];
        assert_eq!(sent["properties"]["value"]["type"], "array");
        assert_eq!(sent["$defs"]["n"]["type"], "integer");
        let answer = json!({
            "choices": [{"message": {"content": "{\"value\": [1, 2]}"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3}
        });
        let parsed = parse_answer(&answer, shape).unwrap();
        assert_eq!(parsed.output, json!([1, 2]));
        assert_eq!(parsed.usage.input_tokens, 7);
        assert_eq!(parsed.usage.output_tokens, 3);
    }

    #[test]
    fn a_chat_extract_is_sent_as_given_with_its_sampling() {
        let schema = json!({
            "type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false
        });
        let (request, output_schema) = call_for(
            TaskKind::ExtractData,
            json!({
                "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                "schema": schema, "top_p": 0.5, "stop": ["END"], "seed": 9,
                "max_output_tokens": 20, "temperature": 0.1
            }),
        );
        let model = ModelRef::new("openai", "m");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &output_schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body(&call);
        assert_eq!(shape, AnswerShape::Json);
        assert_eq!(
            body["messages"],
            json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
        );
        assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
        assert_eq!(body["response_format"]["json_schema"]["strict"], true);
        assert_eq!(
            (
                &body["top_p"],
                &body["stop"],
                &body["seed"],
                &body["max_tokens"]
            ),
            (&json!(0.5), &json!(["END"]), &json!(9), &json!(20))
        );
        assert_eq!(body["temperature"], 0.1);
    }

    #[test]
    fn any_object_is_json_mode() {
        let (request, output_schema) = call_for(
            TaskKind::ExtractData,
            json!({"messages": [{"role": "user", "content": "u"}], "schema": {"type": "object"}}),
        );
        let model = ModelRef::new("openai", "m");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &output_schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, _) = request_body(&call);
        assert_eq!(body["response_format"], json!({"type": "json_object"}));
    }

    #[test]
    fn root_references_follow_the_wrapped_schema() {
        let wrapped = wrap_schema(&json!({"anyOf": [{"type": "null"}, {"$ref": "#"}]}));
        assert_eq!(
            wrapped["properties"]["value"]["anyOf"][1]["$ref"],
            "#/properties/value"
        );
    }

    #[test]
    fn strictness_follows_the_schema() {
        assert!(is_strict_compatible(&json!({
            "type": "object", "properties": {"a": {"type": "string"}},
            "required": ["a"], "additionalProperties": false
        })));
        assert!(!is_strict_compatible(&json!({
            "type": "object", "properties": {"a": {"type": "string"}}
        })));
    }

    #[test]
    fn malformed_content_is_an_invalid_output_not_a_failure() {
        let answer = json!({"choices": [{"message": {"content": "{not json"}}]});
        match parse_answer(&answer, AnswerShape::Json) {
            Err(ProviderError::InvalidOutput { message, .. }) => {
                assert!(message.contains("not valid JSON"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        let fenced = json!({"choices": [{"message": {"content": "```json\n{\"a\":1}\n```"}}]});
        assert_eq!(
            parse_answer(&fenced, AnswerShape::Json).unwrap().output,
            json!({"a": 1})
        );
    }

    #[test]
    fn retry_after_reads_both_headers() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "150".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(150)));
    }

    /// Issue 26 item 13: hostile values never panic, never ask for more than a day, and
    /// an unreadable `retry-after-ms` falls back to `Retry-After`.
    #[test]
    fn retry_after_reads_hostile_headers_defensively() {
        use reqwest::header::HeaderValue;
        let now = std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let day = LONGEST_HEADER_WAIT;
        let read = |ms: Option<&[u8]>, secs: Option<&[u8]>| {
            let mut h = HeaderMap::new();
            if let Some(v) = ms {
                h.insert("retry-after-ms", HeaderValue::from_bytes(v).unwrap());
            }
            if let Some(v) = secs {
                h.insert("retry-after", HeaderValue::from_bytes(v).unwrap());
            }
            retry_after_at(&h, now)
        };
        // Huge, in every notation: capped at a day (1e23 ms panicked before).
        for huge in [
            &b"1e23"[..],
            b"1e308",
            b"18446744073709551616",
            b"99999999999999999999999999",
        ] {
            assert_eq!(read(Some(huge), None), Some(day), "{huge:?}");
            assert_eq!(read(None, Some(huge)), Some(day), "{huge:?}");
        }
        assert_eq!(read(None, Some(b"1000000000")), Some(day));
        // Not a usable number: ignored.
        for bad in [
            &b"NaN"[..],
            b"nan",
            b"inf",
            b"-inf",
            b"infinity",
            b"-1",
            b"-0.5",
            b"1e400x",
            b"soon",
            b"",
            b"   ",
            b"0x10",
            b"\xff\xfe",
        ] {
            assert_eq!(read(Some(bad), None), None, "{bad:?}");
            assert_eq!(read(None, Some(bad)), None, "{bad:?}");
        }
        // A bad `retry-after-ms` falls back to a good `Retry-After`.
        assert_eq!(read(Some(b"NaN"), Some(b"3")), Some(Duration::from_secs(3)));
        // Fractions, zero and surrounding space.
        assert_eq!(
            read(Some(b" 250.5 "), None),
            Some(Duration::from_micros(250_500))
        );
        assert_eq!(read(None, Some(b"0")), Some(Duration::ZERO));
        // HTTP dates: in the future, in the past, far away, malformed.
        let in_90s = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(
            read(None, Some(in_90s.as_bytes())),
            Some(Duration::from_secs(90))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(90));
        assert_eq!(read(None, Some(past.as_bytes())), Some(Duration::ZERO));
        assert_eq!(
            read(None, Some(b"Fri, 31 Dec 9999 23:59:59 GMT")),
            Some(day)
        );
        assert_eq!(read(None, Some(b"Fri, 32 Dec 2025 25:61:61 GMT")), None);
    }
}
