//! `[models]` and `[providers]`: what a model id resolves to and who calls it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::Duration;
use tollgate_core::ModelRef;

use super::*;

/// `[models.<id>]`: what a model id resolves to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A provider name from `[providers]` (or the built-in `dev`).
    pub provider: String,
    /// The provider's own model name.
    pub model: String,
    /// Provider parameters. The `openai` provider merges them into the request body
    /// (`temperature`, `top_p`, `seed`, …); the `dev` provider reads `latency_ms` and
    /// `time_limit_ms`.
    /// Changing any of them changes the model config hash, so old cache entries stop
    /// matching.
    #[serde(default)]
    pub params: Map<String, Value>,
    /// docs/conformance.md#cost-prices: what the model costs, in USD per million tokens. Without prices a task
    /// of the model costs nothing known (`cost_usd: null`) and reserves no money.
    /// Prices are not part of the model config hash (they change no output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<ModelPrices>,
    /// docs/conformance.md#cost-reservation: the output-token bound of a request that sets none
    /// (`max_output_tokens`), sent to the provider as `max_tokens` (so it is part of the
    /// model config hash) and reserved at admission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// docs/conformance.md#provider-pace: calls per `pace_window` of its provider to this model, from all
    /// replicas together (in addition to the provider's own pace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<Limit>,
    /// docs/conformance.md#provider-pace: model tokens per `pace_window` of its provider to this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<Limit>,
    /// docs/routes.md, "Attempts": how many attempts a task of this model may make
    /// (1 to 20; the smaller of this and its app's `max_attempts`, 3 when neither is
    /// set). `1` is at most once: the choice for calls with side effects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<tollgate_core::MaxAttempts>,
}

/// `[models.<id>.prices]` (docs/conformance.md#cost-prices), USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrices {
    /// Per million input tokens.
    pub input_per_million: f64,
    /// Per million output tokens.
    pub output_per_million: f64,
    /// Per million input tokens served from the provider's prompt cache (default: the
    /// input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_million: Option<f64>,
}

impl ModelPrices {
    /// The prices in core's integer unit, or the first invalid field's message.
    pub fn to_core(&self) -> Result<tollgate_core::Prices, (&'static str, String)> {
        let price = |field: &'static str, usd: f64| {
            tollgate_core::cost::price_from_usd_per_million(field, usd)
                .map_err(|e| (field, e.to_string()))
        };
        let input = price("input_per_million", self.input_per_million)?;
        Ok(tollgate_core::Prices {
            input,
            output: price("output_per_million", self.output_per_million)?,
            cached_input: match self.cached_input_per_million {
                Some(usd) => price("cached_input_per_million", usd)?,
                None => input,
            },
        })
    }
}

impl ModelConfig {
    /// docs/conformance.md#provider-pace: this model's own pace limits.
    pub fn pace(&self) -> PaceLimits {
        PaceLimits {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
        }
    }

    /// The resolved model reference. A configured `max_output_tokens` is sent as
    /// `max_tokens` unless `params` already says.
    pub fn model_ref(&self) -> ModelRef {
        let mut params = self.params.clone();
        if let Some(n) = self.max_output_tokens
            && !params.contains_key("max_tokens")
            && !params.contains_key("max_completion_tokens")
        {
            params.insert("max_tokens".into(), Value::from(n));
        }
        ModelRef {
            provider: self.provider.clone(),
            model: self.model.clone(),
            params,
        }
    }
}

/// Which provider implementation a `[providers.<name>]` entry uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// An OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp server).
    Openai,
    /// The built-in offline, deterministic development and test provider.
    Dev,
}

/// `[providers.<name>]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The implementation.
    pub kind: ProviderKind,
    /// `openai`: the API root, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:11434/v1`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// `openai`: the environment variable holding the API key (none: no `Authorization`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// `openai`: timeout of one HTTP request, including reading the answer.
    #[serde(default = "default_provider_timeout", with = "duration_text")]
    pub timeout: Duration,
    /// `openai`: retries after the first attempt on 408/409/429/5xx, timeouts and
    /// connection errors.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// `openai`: the first retry's backoff; doubled on every retry, with jitter.
    #[serde(default = "default_retry_backoff", with = "duration_text")]
    pub retry_backoff: Duration,
    /// `openai`: the longest wait before a retry. A `Retry-After` longer than this fails
    /// the call at once instead of holding a worker.
    #[serde(default = "default_max_retry_delay", with = "duration_text")]
    pub max_retry_delay: Duration,
    /// docs/conformance.md#provider-pace: calls per `pace_window` to this provider, from all replicas together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<Limit>,
    /// docs/conformance.md#dispatch: model tokens (input bound plus output bound, settled with the reported
    /// usage) per `pace_window` to this provider, from all replicas together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<Limit>,
    /// The window `requests_per_minute` and `tokens_per_minute` count over.
    #[serde(default = "default_pace_window", with = "duration_text")]
    pub pace_window: Duration,
    /// `openai`: the longest pause a 429's `Retry-After` (or `retry-after-ms`) sets on
    /// the provider for every replica; a longer one is cut to this (docs/engine.md,
    /// "Provider pace").
    #[serde(default = "default_max_pause", with = "duration_text")]
    pub max_pause: Duration,
}

fn default_provider_timeout() -> Duration {
    Duration::from_secs(60)
}
fn default_max_retries() -> u32 {
    2
}
fn default_retry_backoff() -> Duration {
    Duration::from_millis(500)
}
fn default_max_retry_delay() -> Duration {
    Duration::from_secs(30)
}
/// Five minutes: a provider's own rate-limit windows are a minute or less, and a longer
/// `Retry-After` (a daily quota) is asked again after this rather than trusted blindly.
fn default_max_pause() -> Duration {
    Duration::from_secs(300)
}

impl ProviderConfig {
    /// docs/conformance.md#provider-pace: the provider's pace limits.
    pub fn pace(&self) -> PaceLimits {
        PaceLimits {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
        }
    }

    /// The built-in dev provider's entry.
    pub fn dev() -> ProviderConfig {
        ProviderConfig {
            kind: ProviderKind::Dev,
            base_url: None,
            api_key_env: None,
            timeout: default_provider_timeout(),
            max_retries: default_max_retries(),
            retry_backoff: default_retry_backoff(),
            max_retry_delay: default_max_retry_delay(),
            requests_per_minute: None,
            tokens_per_minute: None,
            pace_window: default_pace_window(),
            max_pause: default_max_pause(),
        }
    }

    /// An OpenAI-compatible provider at `base_url` with default retry settings.
    pub fn openai(base_url: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            kind: ProviderKind::Openai,
            base_url: Some(base_url.into()),
            ..ProviderConfig::dev()
        }
    }
}
