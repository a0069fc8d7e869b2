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
//! - `chat` sends its conversation (assistant `tool_calls`, `tool` results with their
//!   `tool_call_id`) and its `tools`, `tool_choice` and `parallel_tool_calls` as given, and
//!   reads the answer's `message.content`, `message.tool_calls` and `finish_reason`.
//! - The model's `params` are merged into the request body (`temperature`, `top_p`,
//!   `seed`, …); the request's own `temperature`, `top_p`, `stop`, `seed` and
//!   `max_output_tokens` (sent as `max_tokens`) take precedence.
//! - Failures are retried a bounded number of times (`max_retries`) with exponential
//!   backoff and jitter, on HTTP 408, 409, 429 and 5xx, timeouts and connection errors
//!   (the shared [`HttpClient`](super::http::HttpClient)); when they run out the call is
//!   [`Unavailable`](super::ProviderError::Unavailable). `retry-after-ms` and
//!   `Retry-After` (seconds) are honoured; a wait longer than `max_retry_delay` ends the
//!   call at once instead of holding a worker.
//! - Usage comes from `usage.prompt_tokens` and `usage.completion_tokens`; an answer
//!   without them is marked `estimated` (the worker counts the attempt at its bound).
//! - docs/conformance.md#provider-pace pause ([`super::pace`]): a 429 pauses the provider on every replica for
//!   its `Retry-After` (or the backoff), at most `max_pause`, paced or not; every HTTP
//!   request first waits until no pause is in force.
//! - docs/conformance.md#provider-pace pace: with `requests_per_minute` / `tokens_per_minute` configured, every
//!   HTTP request first waits for its turn on the schedules all replicas share; after a
//!   429 the call waits and tries again — such waits never count against `max_retries`
//!   or `max_retry_delay`, so pacing never fails a task. Without a pace, a 429 is retried
//!   like a 5xx (it counts against `max_retries`; a `Retry-After` longer than
//!   `max_retry_delay` fails the call at once, the pause still holds for other calls).
//! - `structured_output` other than `json_schema` (docs/providers.md): `json_object`
//!   sends `response_format: {"type": "json_object"}` and states the schema in the
//!   instructions; `tool` forces a function call whose parameters are the schema and
//!   reads its arguments; `prompt` sends no format and states the schema.
//! - Azure OpenAI (`kind = "azure"`) is the same dialect at a deployment's URL,
//!   `{base_url}/openai/deployments/{model}/chat/completions?api-version=…`, its key in
//!   `api-key`.
//!
//! Split by concern: `request` (the body, built from the dialect-neutral
//! [`Prompt`](super::prompt::Prompt)), `response` (reading the answer); posting with
//! retries, pauses and the pace is the shared [`super::http`].

mod embeddings;
mod request;
mod response;
mod stream;

pub use super::prompt::AnswerShape;
pub use embeddings::{embeddings_body, parse_embeddings};
pub use request::{format_fields, message_value, request_body, request_body_as, tool_fields};
pub use response::parse_answer;
pub use stream::ChatStream;

use super::http::{ApiKeyHeader, HttpClient, no_exhausted_limits};
use super::pace::ProviderPace;
use super::sse::StreamParser;
use super::{
    EmbedAnswer, EmbedCall, Provider, ProviderAnswer, ProviderCall, ProviderError, answer_limit,
};
use crate::config::{
    AZURE_API_VERSION, ConfigError, OPENAI_BASE_URL, ProviderConfig, ProviderKind, StructuredOutput,
};
use crate::cost::TokenCounter;
use crate::stream::StreamSink;
use async_trait::async_trait;
use std::fmt;

/// Where a provider's requests go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    /// One API root for every model (`{base_url}`, calls go to `/chat/completions` and
    /// `/embeddings` under it).
    Fixed(String),
    /// Azure OpenAI: one URL per deployment (the model's name).
    AzureDeployments {
        /// The resource endpoint.
        base: reqwest::Url,
        /// The `api-version` query parameter.
        api_version: String,
    },
}

/// An OpenAI-compatible chat completions endpoint (or an Azure OpenAI resource).
pub struct OpenAiProvider {
    name: String,
    kind: ProviderKind,
    endpoint: Endpoint,
    structured_output: StructuredOutput,
    http: HttpClient,
    /// Whether answers are streamed (`providers.<name>.stream`).
    stream: bool,
}

impl fmt::Debug for OpenAiProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiProvider")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("endpoint", &self.endpoint)
            .field("structured_output", &self.structured_output)
            .field("http", &self.http)
            .field("stream", &self.stream)
            .finish()
    }
}

impl OpenAiProvider {
    /// Builds the provider `[providers.<name>]` (`kind = "openai"` or `"azure"`), reading
    /// its API key and header variables from the environment now.
    pub fn new(name: &str, config: &ProviderConfig) -> Result<OpenAiProvider, ConfigError> {
        let (endpoint, key_header) = match config.kind {
            ProviderKind::Azure => {
                let at = || format!("providers.{name}.base_url");
                let text = config.base_url.as_deref().ok_or_else(|| {
                    ConfigError::at(at(), "an `azure` provider needs its resource endpoint")
                })?;
                let base = reqwest::Url::parse(text.trim_end_matches('/'))
                    .map_err(|e| ConfigError::at(at(), format!("is not a valid URL: {e}")))?;
                let api_version = config
                    .api_version
                    .clone()
                    .unwrap_or_else(|| AZURE_API_VERSION.to_string());
                (
                    Endpoint::AzureDeployments { base, api_version },
                    ApiKeyHeader::Named("api-key"),
                )
            }
            _ => {
                let base = config
                    .base_url
                    .as_deref()
                    .unwrap_or(OPENAI_BASE_URL)
                    .trim_end_matches('/');
                (Endpoint::Fixed(base.to_string()), ApiKeyHeader::Bearer)
            }
        };
        Ok(OpenAiProvider {
            name: name.to_string(),
            kind: config.kind,
            endpoint,
            structured_output: config.structured_output(),
            http: HttpClient::new(name, config, key_header)?,
            stream: config.stream,
        })
    }

    /// docs/conformance.md#provider-pace: paces this provider's calls with the schedules every replica shares.
    pub fn with_pace(mut self, pace: Option<ProviderPace>) -> OpenAiProvider {
        self.http = self.http.with_pace(pace);
        self
    }

    /// The URL chat completions for `model` go to.
    pub fn endpoint_for(&self, model: &str) -> String {
        self.url_for(model, &["chat", "completions"])
    }

    /// The URL embeddings for `model` go to (docs/providers.md, "Embeddings").
    pub fn embeddings_endpoint_for(&self, model: &str) -> String {
        self.url_for(model, &["embeddings"])
    }

    fn url_for(&self, model: &str, operation: &[&str]) -> String {
        match &self.endpoint {
            Endpoint::Fixed(base) => format!("{base}/{}", operation.join("/")),
            Endpoint::AzureDeployments { base, api_version } => {
                let mut url = base.clone();
                if let Ok(mut segments) = url.path_segments_mut() {
                    segments
                        .pop_if_empty()
                        .extend(["openai", "deployments", model])
                        .extend(operation);
                }
                url.query_pairs_mut()
                    .clear()
                    .append_pair("api-version", api_version);
                url.to_string()
            }
        }
    }
}

impl OpenAiProvider {
    /// One chat completion; streamed (`stream: true` with `stream_options.include_usage`,
    /// so the usage comes in the stream's last chunk) when `sink` is given and the
    /// provider streams.
    async fn chat(
        &self,
        call: ProviderCall<'_>,
        sink: Option<&StreamSink>,
    ) -> Result<ProviderAnswer, ProviderError> {
        let counter =
            TokenCounter::for_provider(self.kind, self.structured_output, &call.model.model);
        let prompt = counter.render(&call);
        let mut body = request::body(&call, &prompt);
        let sink = sink.filter(|_| self.stream);
        if sink.is_some() {
            body["stream"] = serde_json::json!(true);
            body["stream_options"] = serde_json::json!({"include_usage": true});
        }
        // docs/conformance.md#provider-pace token pace: this call's bound, counted as a
        // reservation counts it (its re-ask messages included), settled with the real usage.
        let estimate = if self.http.is_paced() {
            counter.pace_estimate(&call, &prompt)
        } else {
            0
        };
        let url = self.endpoint_for(&call.model.model);
        let model = &call.model.model;
        let posted = match sink {
            Some(sink) => {
                let shape = prompt.shape;
                let parser = move || -> Box<dyn StreamParser> { Box::new(ChatStream::new(shape)) };
                self.http
                    .post_streaming(
                        &url,
                        &body,
                        model,
                        estimate,
                        call.max_output_bytes,
                        no_exhausted_limits,
                        &parser,
                        sink,
                    )
                    .await?
            }
            None => {
                let limit = answer_limit(call.max_output_bytes);
                self.http
                    .post(&url, &body, model, estimate, limit, no_exhausted_limits)
                    .await?
            }
        };
        let parsed = parse_answer(&posted.answer, prompt.shape);
        self.http.settle(posted.ticket, &parsed).await;
        super::billed_before(parsed, posted.billed_before)
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        self.chat(call, None).await
    }

    fn prepare(&self) {
        self.http.prefetch_pause();
    }

    async fn complete_streaming(
        &self,
        call: ProviderCall<'_>,
        sink: &StreamSink,
    ) -> Result<ProviderAnswer, ProviderError> {
        self.chat(call, Some(sink)).await
    }

    async fn embed(&self, call: EmbedCall<'_>) -> Result<EmbedAnswer, ProviderError> {
        let counter =
            TokenCounter::for_provider(self.kind, self.structured_output, &call.model.model);
        let estimate = if self.http.is_paced() {
            call.texts.iter().map(|t| counter.count(t)).sum()
        } else {
            0
        };
        // A float is at most ~25 bytes of JSON: room for every vector of the asked
        // dimension (else the largest any request may ask for).
        let dimension = call
            .dimensions
            .unwrap_or(tollgate_core::MAX_EMBED_DIMENSIONS) as usize;
        let limit = call
            .texts
            .len()
            .saturating_mul(dimension.saturating_mul(25).saturating_add(64))
            .saturating_add(64 * 1024);
        let posted = self
            .http
            .post(
                &self.embeddings_endpoint_for(&call.model.model),
                &embeddings_body(&call),
                &call.model.model,
                estimate,
                limit,
                no_exhausted_limits,
            )
            .await?;
        let parsed = parse_embeddings(&posted.answer, call.texts.len()).map(|mut answer| {
            if posted.billed_before {
                // docs/routes.md, "What is charged when": a try that may have been billed
                // before this answer sent the same texts, so they count twice (as
                // counted here when the provider reported nothing: no longer an estimate
                // the worker would replace by one count).
                let sent = if answer.usage.estimated {
                    call.texts.iter().map(|t| counter.count(t)).sum()
                } else {
                    answer.usage.input_tokens
                };
                answer.usage.input_tokens = sent.saturating_mul(2);
                answer.usage.estimated = false;
            }
            answer
        });
        let settled = parsed.as_ref().map(|a| ProviderAnswer {
            output: serde_json::Value::Null,
            usage: a.usage,
            billed_before: false,
        });
        self.http
            .settle(posted.ticket, &settled.map_err(Clone::clone))
            .await;
        parsed
    }
}
