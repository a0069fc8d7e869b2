//! Anthropic's Messages API, natively: `POST {base_url}/messages` (default base
//! `https://api.anthropic.com/v1`), the key in `x-api-key`, `anthropic-version` (the
//! provider's `api_version`, default [`ANTHROPIC_VERSION`]).
//!
//! - The prompt's system messages become `system`; the rest `messages`.
//! - `max_tokens` is required by the API: the request's `max_output_tokens`, else the
//!   model's (`max_output_tokens` or `params.max_tokens`), else
//!   [`ANTHROPIC_DEFAULT_MAX_TOKENS`](crate::config::ANTHROPIC_DEFAULT_MAX_TOKENS), which
//!   the model's resolved params carry so reservations count it.
//! - Structured output (`structured_output`, default `tool`): a forced tool
//!   (`tools` + `tool_choice: {"type": "tool"}`) whose input is the answer; or
//!   `json_schema`, the API's JSON outputs (`output_config.format`); or `prompt`, the
//!   schema stated in the system prompt and the text parsed. `json_object` does not
//!   exist in this API and is refused by configuration.
//! - `chat`: its tools as `tools` (`input_schema` the parameters), `tool_choice` as
//!   `auto` / `any` (`required`) / `tool` (a named function) / `none`, and
//!   `disable_parallel_tool_use` for `parallel_tool_calls: false`; an assistant's tool
//!   calls as `tool_use` blocks, tool results as `tool_result` blocks in one user message.
//!   The answer's text blocks are the content, its `tool_use` blocks the tool calls
//!   (their `input` as the arguments' JSON text), `stop_reason` `tool_use` →
//!   `tool_calls`, `max_tokens` → `length`.
//! - Usage: `input_tokens` + `cache_read_input_tokens` + `cache_creation_input_tokens`
//!   is the input; cache reads are priced at `cached_input_per_million`, cache writes at
//!   `cache_write_input_per_million` (docs/providers.md).
//! - Retries, pauses and pace as every dialect ([`super::http`]); besides `retry-after`,
//!   the `anthropic-ratelimit-*-remaining` / `-reset` headers pause the provider on
//!   every replica until a limit they report exhausted resets (at most `max_pause`).

mod request;
mod response;
mod stream;

pub use request::{format_fields, request_body_as, tool_fields};
pub use response::parse_answer;
pub use stream::MessageStream;

use super::http::{ApiKeyHeader, HttpClient};
use super::pace::ProviderPace;
use super::sse::StreamParser;
use super::wait::wait_until_rfc3339;
use super::{Provider, ProviderAnswer, ProviderCall, ProviderError, answer_limit};
use crate::config::{
    ANTHROPIC_BASE_URL, ANTHROPIC_VERSION, ConfigError, ProviderConfig, ProviderKind,
    StructuredOutput,
};
use crate::cost::TokenCounter;
use crate::stream::StreamSink;
use async_trait::async_trait;
use reqwest::header::{HeaderMap, HeaderValue};
use std::fmt;
use std::time::{Duration, SystemTime};

/// The limits Anthropic reports in `anthropic-ratelimit-{limit}-remaining` and
/// `-reset`.
const RATE_LIMITS: [&str; 4] = ["requests", "tokens", "input-tokens", "output-tokens"];

/// An Anthropic Messages API endpoint.
pub struct AnthropicProvider {
    name: String,
    endpoint: String,
    structured_output: StructuredOutput,
    http: HttpClient,
    /// Whether answers are streamed (`providers.<name>.stream`).
    stream: bool,
}

impl fmt::Debug for AnthropicProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AnthropicProvider")
            .field("name", &self.name)
            .field("endpoint", &self.endpoint)
            .field("structured_output", &self.structured_output)
            .field("http", &self.http)
            .field("stream", &self.stream)
            .finish()
    }
}

impl AnthropicProvider {
    /// Builds the provider `[providers.<name>]` (`kind = "anthropic"`), reading its API
    /// key and header variables from the environment now.
    pub fn new(name: &str, config: &ProviderConfig) -> Result<AnthropicProvider, ConfigError> {
        let base = config
            .base_url
            .as_deref()
            .unwrap_or(ANTHROPIC_BASE_URL)
            .trim_end_matches('/');
        let version = config.api_version.as_deref().unwrap_or(ANTHROPIC_VERSION);
        let version = HeaderValue::from_str(version).map_err(|_| {
            ConfigError::at(
                format!("providers.{name}.api_version"),
                "is not a valid HTTP header value",
            )
        })?;
        let http = HttpClient::new(name, config, ApiKeyHeader::Named("x-api-key"))?
            .with_header("anthropic-version", version);
        Ok(AnthropicProvider {
            name: name.to_string(),
            endpoint: format!("{base}/messages"),
            structured_output: config.structured_output(),
            http,
            stream: config.stream,
        })
    }

    /// docs/conformance.md#provider-pace: paces this provider's calls with the schedules
    /// every replica shares.
    pub fn with_pace(mut self, pace: Option<ProviderPace>) -> AnthropicProvider {
        self.http = self.http.with_pace(pace);
        self
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }
}

impl AnthropicProvider {
    /// One Messages API call; streamed (`stream: true`) when `sink` is given and the
    /// provider streams.
    async fn message(
        &self,
        call: ProviderCall<'_>,
        sink: Option<&StreamSink>,
    ) -> Result<ProviderAnswer, ProviderError> {
        let counter = TokenCounter::for_provider(
            ProviderKind::Anthropic,
            self.structured_output,
            &call.model.model,
        );
        let prompt = counter.render(&call);
        let mut body = request::body(&call, &prompt);
        let sink = sink.filter(|_| self.stream);
        if sink.is_some() {
            body["stream"] = serde_json::json!(true);
        }
        let estimate = if self.http.is_paced() {
            counter.pace_estimate(&call, &prompt)
        } else {
            0
        };
        let model = &call.model.model;
        let posted = match sink {
            Some(sink) => {
                let shape = prompt.shape;
                let parser =
                    move || -> Box<dyn StreamParser> { Box::new(MessageStream::new(shape)) };
                self.http
                    .post_streaming(
                        &self.endpoint,
                        &body,
                        model,
                        estimate,
                        call.max_output_bytes,
                        exhausted_limits,
                        &parser,
                        sink,
                    )
                    .await?
            }
            None => {
                let limit = answer_limit(call.max_output_bytes);
                self.http
                    .post(
                        &self.endpoint,
                        &body,
                        model,
                        estimate,
                        limit,
                        exhausted_limits,
                    )
                    .await?
            }
        };
        let parsed = parse_answer(&posted.answer, prompt.shape);
        self.http.settle(posted.ticket, &parsed).await;
        super::billed_before(parsed, posted.billed_before)
    }
}

#[async_trait]
impl Provider for AnthropicProvider {
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        self.message(call, None).await
    }

    fn prepare(&self) {
        self.http.prefetch_pause();
    }

    async fn complete_streaming(
        &self,
        call: ProviderCall<'_>,
        sink: &StreamSink,
    ) -> Result<ProviderAnswer, ProviderError> {
        self.message(call, Some(sink)).await
    }
}

/// The longest wait until a limit Anthropic reports exhausted
/// (`anthropic-ratelimit-{limit}-remaining: 0`) resets (`-reset`, RFC 3339). Headers
/// that are missing or unreadable say nothing.
pub fn exhausted_limits(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let text = |name: String| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
    };
    RATE_LIMITS
        .iter()
        .filter(|limit| {
            text(format!("anthropic-ratelimit-{limit}-remaining"))
                .and_then(|t| t.parse::<u64>().ok())
                == Some(0)
        })
        .filter_map(|limit| {
            text(format!("anthropic-ratelimit-{limit}-reset"))
                .and_then(|t| wait_until_rfc3339(t, now))
        })
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_exhausted_limits_pause() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let mut h = HeaderMap::new();
        let set = |h: &mut HeaderMap, k: &'static str, v: &'static str| {
            h.insert(k, HeaderValue::from_static(v));
        };
        set(&mut h, "anthropic-ratelimit-requests-remaining", "3");
        set(
            &mut h,
            "anthropic-ratelimit-requests-reset",
            "2027-01-15T08:00:30Z",
        );
        assert_eq!(exhausted_limits(&h, now), None);
        set(&mut h, "anthropic-ratelimit-tokens-remaining", "0");
        set(
            &mut h,
            "anthropic-ratelimit-tokens-reset",
            "2027-01-15T08:00:12Z",
        );
        assert_eq!(exhausted_limits(&h, now), Some(Duration::from_secs(12)));
        set(&mut h, "anthropic-ratelimit-requests-remaining", "0");
        assert_eq!(exhausted_limits(&h, now), Some(Duration::from_secs(30)));
        set(&mut h, "anthropic-ratelimit-requests-reset", "whenever");
        assert_eq!(exhausted_limits(&h, now), Some(Duration::from_secs(12)));
    }
}
