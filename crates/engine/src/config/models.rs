//! `[models]` and `[providers]`: what a model id resolves to and who calls it.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::collections::BTreeMap;
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
    /// Provider parameters. HTTP providers merge them into the request body
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
    /// docs/routes.md, "Attempts": how many attempts a task of this model may make
    /// (1 to 20; the smaller of this and its app's `max_attempts`, 3 when neither is
    /// set). `1` is at most once: the choice for calls with side effects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<tollgate_core::MaxAttempts>,
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
    /// Per million input tokens written to the provider's prompt cache (Anthropic's
    /// cache creation; default: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_input_per_million: Option<f64>,
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
            cache_write_input: match self.cache_write_input_per_million {
                Some(usd) => price("cache_write_input_per_million", usd)?,
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
    /// already says; on an `anthropic` provider, whose Messages API needs a `max_tokens`,
    /// [`ANTHROPIC_DEFAULT_MAX_TOKENS`] when none is named) and, for a route or a model
    /// with an `attempt_timeout`, the whole [`Route`](tollgate_core::Route)
    /// (docs/routes.md). `kind_of` names each provider's kind.
    pub fn model_ref(&self, kind_of: impl Fn(&str) -> Option<ProviderKind>) -> ModelRef {
        let route = self.route(kind_of);
        let mut model_ref = route.deployments[0].model_ref();
        if self.is_route() || self.attempt_timeout.is_some() {
            model_ref.route = Some(route);
        }
        model_ref
    }

    /// The model's route: a route of one for the single form. Prices that are not valid
    /// are left out (validation reports them). `kind_of` names each provider's kind.
    pub fn route(&self, kind_of: impl Fn(&str) -> Option<ProviderKind>) -> tollgate_core::Route {
        tollgate_core::Route {
            strategy: self.strategy.unwrap_or_default(),
            deployments: self
                .deployment_configs()
                .iter()
                .map(|d| d.deployment(kind_of(&d.provider)))
                .collect(),
            cooldown_ms: millis(
                self.cooldown
                    .unwrap_or(tollgate_core::route::DEFAULT_COOLDOWN),
            ),
            attempt_timeout_ms: self.attempt_timeout.map(millis),
        }
    }
}

/// Which provider implementation (dialect) a `[providers.<name>]` entry uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProviderKind {
    /// An OpenAI-compatible chat completions API (OpenAI, vLLM, Ollama, llama.cpp server).
    Openai,
    /// Anthropic's Messages API (`POST {base_url}/messages`).
    Anthropic,
    /// Azure OpenAI: chat completions of a deployment
    /// (`{base_url}/openai/deployments/{model}/chat/completions?api-version=…`).
    Azure,
    /// The built-in offline, deterministic development and test provider.
    Dev,
}

impl ProviderKind {
    /// The kind as configured (`openai`, `anthropic`, `azure`, `dev`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Azure => "azure",
            ProviderKind::Dev => "dev",
        }
    }

    /// Whether the kind calls a model over HTTP (every kind but `dev`).
    pub fn is_http(self) -> bool {
        self != ProviderKind::Dev
    }

    /// The structured-output mode of a provider of this kind that names none:
    /// `tool` for `anthropic`, `json_schema` otherwise.
    pub fn default_structured_output(self) -> StructuredOutput {
        match self {
            ProviderKind::Anthropic => StructuredOutput::Tool,
            _ => StructuredOutput::JsonSchema,
        }
    }
}

/// How a provider is asked for structured output (`classify`, `classify_many`,
/// `extract_data`; docs/providers.md). Whatever the mode, the worker validates the
/// output and asks again when it is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// The API's JSON Schema mode: `response_format: {"type": "json_schema"}`
    /// (OpenAI-compatible, Azure), `output_config.format` (Anthropic).
    JsonSchema,
    /// JSON mode without a schema (`response_format: {"type": "json_object"}`), the
    /// schema in the instructions. OpenAI-compatible and Azure only.
    JsonObject,
    /// A forced tool call whose parameters are the schema.
    Tool,
    /// No structured-output feature at all: the schema in the instructions, the answer's
    /// text parsed as JSON (for servers that support none, e.g. some llama.cpp builds).
    Prompt,
}

impl StructuredOutput {
    /// The mode as configured.
    pub fn as_str(self) -> &'static str {
        match self {
            StructuredOutput::JsonSchema => "json_schema",
            StructuredOutput::JsonObject => "json_object",
            StructuredOutput::Tool => "tool",
            StructuredOutput::Prompt => "prompt",
        }
    }
}

/// The value of an extra header of a provider (`headers`): a literal, or read from an
/// environment variable at start-up (`{ env = "NAME" }`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HeaderValueSource {
    /// The value as written.
    Literal(String),
    /// The value of an environment variable.
    Env {
        /// The variable's name.
        env: String,
    },
}

/// `[providers.<name>]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// The implementation.
    pub kind: ProviderKind,
    /// The API root: `openai`, e.g. `https://api.openai.com/v1` (the default) or
    /// `http://127.0.0.1:11434/v1`; `anthropic`: `https://api.anthropic.com/v1` (the
    /// default); `azure` (required): the resource endpoint,
    /// `https://<resource>.openai.azure.com`.
    #[serde(default)]
    pub base_url: Option<String>,
    /// The environment variable holding the API key (none: no key is sent). Sent as
    /// `Authorization: Bearer` (`openai`), `x-api-key` (`anthropic`), `api-key` (`azure`).
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// `azure`: the `api-version` query parameter (default [`AZURE_API_VERSION`]);
    /// `anthropic`: the `anthropic-version` header (default [`ANTHROPIC_VERSION`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    /// Extra headers sent with every request, e.g. `{ "OpenAI-Organization" = "org-1",
    /// "X-Gateway-Key" = { env = "GATEWAY_KEY" } }`. Environment values are read at
    /// start-up (a missing variable fails it).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, HeaderValueSource>,
    /// How structured output is asked for (default: `tool` for `anthropic`,
    /// `json_schema` otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_output: Option<StructuredOutput>,
    /// HTTP providers: timeout of one HTTP request, including reading the answer.
    #[serde(default = "default_provider_timeout", with = "duration_text")]
    pub timeout: Duration,
    /// HTTP providers: retries after the first attempt on 408/409/429/5xx, timeouts and
    /// connection errors.
    #[serde(default = "default_max_retries")]
    pub max_retries: u32,
    /// HTTP providers: the first retry's backoff; doubled on every retry, with jitter.
    #[serde(default = "default_retry_backoff", with = "duration_text")]
    pub retry_backoff: Duration,
    /// HTTP providers: the longest wait before a retry. A `Retry-After` longer than this fails
    /// the call at once (unavailable) instead of holding a worker.
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
    /// HTTP providers: the longest pause a 429's `Retry-After` (or `retry-after-ms`) sets on
    /// the provider for every replica; a longer one is cut to this (docs/engine.md,
    /// "Provider pace").
    #[serde(default = "default_max_pause", with = "duration_text")]
    pub max_pause: Duration,
    /// Most texts in one embeddings call (docs/engine.md, "Embeddings"): grouped `embed`
    /// tasks share calls of at most this many texts (default
    /// [`DEFAULT_EMBED_BATCH_SIZE`](crate::provider::embed_batch::DEFAULT_EMBED_BATCH_SIZE);
    /// a model's `embed_batch_size` parameter overrides it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub embed_batch_size: Option<std::num::NonZeroU32>,
    /// Whether chat answers are asked for as a stream (docs/providers.md, "Streaming"):
    /// the pieces reach the task's live readers as the provider sends them, and the
    /// answer recorded is the same. Default `true`; `false` for a server that cannot
    /// stream (or cannot send the usage in its stream).
    #[serde(default = "default_stream")]
    pub stream: bool,
}

fn default_stream() -> bool {
    true
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

    /// The structured-output mode in force (configured, else the kind's default).
    pub fn structured_output(&self) -> StructuredOutput {
        self.structured_output
            .unwrap_or_else(|| self.kind.default_structured_output())
    }

    /// The built-in dev provider's entry.
    pub fn dev() -> ProviderConfig {
        ProviderConfig {
            kind: ProviderKind::Dev,
            base_url: None,
            api_key_env: None,
            api_version: None,
            headers: BTreeMap::new(),
            structured_output: None,
            timeout: default_provider_timeout(),
            max_retries: default_max_retries(),
            retry_backoff: default_retry_backoff(),
            max_retry_delay: default_max_retry_delay(),
            requests_per_minute: None,
            tokens_per_minute: None,
            pace_window: default_pace_window(),
            max_pause: default_max_pause(),
            embed_batch_size: None,
            stream: true,
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

    /// An Anthropic Messages API provider at `base_url` (e.g. `https://api.anthropic.com/v1`).
    pub fn anthropic(base_url: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            kind: ProviderKind::Anthropic,
            base_url: Some(base_url.into()),
            ..ProviderConfig::dev()
        }
    }

    /// An Azure OpenAI provider at the resource endpoint `base_url`.
    pub fn azure(base_url: impl Into<String>) -> ProviderConfig {
        ProviderConfig {
            kind: ProviderKind::Azure,
            base_url: Some(base_url.into()),
            ..ProviderConfig::dev()
        }
    }
}

/// The default `anthropic-version` header of `anthropic` providers.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";

/// The `max_tokens` an `anthropic` model sends when neither it nor the request names an
/// output bound.
pub const ANTHROPIC_DEFAULT_MAX_TOKENS: u32 = 4096;

/// The default Anthropic API root.
pub const ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com/v1";

/// The default `api-version` of `azure` providers (a generally available version with
/// structured outputs).
pub const AZURE_API_VERSION: &str = "2024-10-21";
