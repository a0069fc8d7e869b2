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
//! - docs/conformance.md#provider-pace pause ([`super::pace`]): a 429 pauses the provider on every replica for
//!   its `Retry-After` (or the backoff), at most `max_pause`, paced or not; every HTTP
//!   request first waits until no pause is in force.
//! - docs/conformance.md#provider-pace pace: with `requests_per_minute` / `tokens_per_minute` configured, every
//!   HTTP request first waits for its turn on the schedules all replicas share; after a
//!   429 the call waits and tries again — such waits never count against `max_retries`
//!   or `max_retry_delay`, so pacing never fails a task. Without a pace, a 429 is retried
//!   like a 5xx (it counts against `max_retries`; a `Retry-After` longer than
//!   `max_retry_delay` fails the call at once, the pause still holds for other calls).
//! - Provider headers are read defensively (`http::retry_after`): nothing they say can panic
//!   or pause a provider longer than `max_pause`.
//!
//! Split by concern: `request` (the body, built from the dialect-neutral
//! [`Prompt`](super::prompt::Prompt)), `response` (reading the answer), `http` (posting with
//! retries, pauses and the pace; reading provider headers defensively).

mod http;
mod request;
mod response;

pub use super::prompt::AnswerShape;
pub use request::request_body;
pub use response::parse_answer;

use super::pace::{DEFAULT_PACE_OUTPUT_TOKENS, ProviderPace};
use super::prompt::Prompt;
use super::{Provider, ProviderAnswer, ProviderCall, ProviderError};
use crate::config::ProviderKind;
use crate::config::{ConfigError, OPENAI_BASE_URL, ProviderConfig};
use crate::cost::{TokenCounter, output_bound, prompt_input_tokens};
use async_trait::async_trait;
use std::fmt;
use std::time::Duration;

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

    /// docs/conformance.md#provider-pace: paces this provider's calls with the schedules every replica shares.
    pub fn with_pace(mut self, pace: Option<ProviderPace>) -> OpenAiProvider {
        self.pace = pace;
        self
    }

    /// The URL requests go to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
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
        let prompt = Prompt::render(&call);
        let body = request::body(&call, &prompt);
        // docs/conformance.md#provider-pace token pace: this call's bound, counted as docs/conformance.md#cost-reservation counts a
        // reservation (its re-ask messages included), settled with the real usage.
        let estimate = if self.pace.as_ref().is_some_and(ProviderPace::is_paced) {
            let counter = TokenCounter::for_model(Some(ProviderKind::Openai), &call.model.model);
            let output = output_bound(call.model, call.request)
                .unwrap_or(u64::from(DEFAULT_PACE_OUTPUT_TOKENS));
            prompt_input_tokens(counter, &prompt).saturating_add(output)
        } else {
            0
        };
        let (answer, ticket) = self
            .post(&body, estimate, answer_limit(call.max_output_bytes))
            .await?;
        let parsed = parse_answer(&answer, prompt.shape);
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
