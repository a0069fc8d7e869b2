//! `[models]` and `[providers]`: what a model id resolves to and who calls it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::Duration;
use tollgate_core::ModelRef;

use super::*;

/// `[models.<id>]`: what a model id resolves to — one deployment (`provider`, `model`,
/// `params`, `prices`, …) or a route of several (`[[models.<id>.deployments]]`, with a
/// `strategy` and a `cooldown`; docs/routes.md). The two forms do not mix.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// A provider name from `[providers]` (or the built-in `dev`). Empty in the
    /// `deployments` form.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub provider: String,
    /// The provider's own model name. Empty in the `deployments` form.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    /// Provider parameters. The `openai` provider merges them into the request body
    /// (`temperature`, `top_p`, `seed`, …); the `dev` provider reads `latency_ms` and
    /// `time_limit_ms`.
    /// Changing any of them changes the model config hash, so old cache entries stop
    /// matching.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
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
    /// docs/routes.md: how a route picks each call's deployment (`fallback`, the default,
    /// or `weighted`). Only with `deployments`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<tollgate_core::Strategy>,
    /// docs/routes.md: the route's deployments, in order (instead of `provider`,
    /// `model`, `params`, `prices`, `max_output_tokens` and the pace at this level).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deployments: Vec<DeploymentConfig>,
    /// docs/routes.md: how long a deployment that failed (429, 5xx, timeout, connection
    /// error) is skipped by every replica (default 30 s; at most 5 min). Only with
    /// `deployments`.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_duration_text"
    )]
    pub cooldown: Option<Duration>,
    /// docs/routes.md: the longest one call on a deployment may take before the route
    /// moves on (default: none beyond the provider's `timeout` and retries).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_duration_text"
    )]
    pub attempt_timeout: Option<Duration>,
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
    /// docs/conformance.md#provider-pace: this model's own pace limits (the single form's;
    /// a route's are per deployment).
    pub fn pace(&self) -> PaceLimits {
        PaceLimits {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
        }
    }

    /// Whether this is the route form (`[[models.<id>.deployments]]`).
    pub fn is_route(&self) -> bool {
        !self.deployments.is_empty()
    }

    /// The model's deployments: those of a route, or the single form's one.
    pub fn deployment_configs(&self) -> Vec<DeploymentConfig> {
        if self.is_route() {
            return self.deployments.clone();
        }
        vec![DeploymentConfig {
            provider: self.provider.clone(),
            model: self.model.clone(),
            params: self.params.clone(),
            prices: self.prices,
            max_output_tokens: self.max_output_tokens,
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
            weight: None,
            attempt_timeout: None,
        }]
    }

    /// The resolved model reference: its first deployment's provider, model and
    /// parameters (a configured `max_output_tokens` sent as `max_tokens` unless `params`
    /// already says) and, for a route or a model with an `attempt_timeout`, the whole
    /// [`Route`](tollgate_core::Route) (docs/routes.md).
    pub fn model_ref(&self) -> ModelRef {
        let route = self.route();
        let mut model_ref = route.deployments[0].model_ref();
        if self.is_route() || self.attempt_timeout.is_some() {
            model_ref.route = Some(route);
        }
        model_ref
    }

    /// The model's route: a route of one for the single form. Prices that are not valid
    /// are left out (validation reports them).
    pub fn route(&self) -> tollgate_core::Route {
        tollgate_core::Route {
            strategy: self.strategy.unwrap_or_default(),
            deployments: self
                .deployment_configs()
                .iter()
                .map(DeploymentConfig::deployment)
                .collect(),
            cooldown_ms: millis(
                self.cooldown
                    .unwrap_or(tollgate_core::route::DEFAULT_COOLDOWN),
            ),
            attempt_timeout_ms: self.attempt_timeout.map(millis),
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
