//! Model providers: what actually produces a task's output.
//!
//! A [`Provider`] gets the resolved [`ModelRef`], the typed request, the JSON Schema its
//! output must satisfy and, when asking again, the validation error of the previous
//! answer. It returns the output JSON and the token usage. Validation against the kind's
//! contract happens in the worker (`tollgate_core::validate_output`), never here alone.
//!
//! Built in: [`openai::OpenAiProvider`] (any OpenAI-compatible chat completions API, and
//! Azure OpenAI), [`anthropic::AnthropicProvider`] (Anthropic's Messages API) and
//! [`dev::DevProvider`] (offline and deterministic, for development and tests). What a
//! call sends is rendered once for every dialect ([`prompt::Prompt`], in the provider's
//! structured-output mode); each dialect turns it into its wire format, and the token
//! bound counts it ([`crate::cost::TokenCounter`]). Every HTTP dialect posts through
//! [`http::HttpClient`] (timeouts, headers, retries, pace and pauses).

pub mod answer;
pub mod anthropic;
pub mod dev;
pub mod embed_batch;
pub mod http;
pub mod openai;
pub mod pace;
pub mod prompt;
pub mod sse;
pub mod wait;

use crate::config::{ConfigError, DEV_PROVIDER, EngineConfig, ProviderKind};
use crate::stream::StreamSink;
use async_trait::async_trait;
use serde_json::Value;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use tollgate_core::{ModelRef, TaskRequest, Usage};
use tollgate_store::Store;

/// One request to a provider.
#[derive(Debug, Clone, Copy)]
pub struct ProviderCall<'a> {
    /// The model configuration the task was submitted with.
    pub model: &'a ModelRef,
    /// The typed request.
    pub request: &'a TaskRequest,
    /// The JSON Schema the output must satisfy (`TaskRequest::output_schema`).
    pub output_schema: &'a Value,
    /// When asking again: why the previous answer was refused.
    pub previous_error: Option<&'a str>,
    /// The output limit (`max_output_bytes`): an answer whose output would be larger is
    /// refused by the worker; a provider should stop reading or building one early and
    /// answer [`ProviderError::OutputTooLarge`].
    pub max_output_bytes: usize,
}

/// A provider's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderAnswer {
    /// The output, as the model gave it (validated by the caller).
    pub output: Value,
    /// Tokens used (and cost where known).
    pub usage: Usage,
    /// An earlier try of this call failed after the provider may have processed it (a
    /// timeout, a dropped connection or stream, a 5xx other than 503) before the
    /// provider's own retry (`max_retries`) answered: the worker charges that try at the
    /// call's bound besides `usage` (docs/routes.md, "What is charged when").
    pub billed_before: bool,
}

/// Marks an answer read after a try that may have been billed
/// ([`ProviderAnswer::billed_before`]), or the answer's refusal
/// ([`ProviderError::InvalidOutput`]).
pub fn billed_before(
    parsed: Result<ProviderAnswer, ProviderError>,
    billed: bool,
) -> Result<ProviderAnswer, ProviderError> {
    match parsed {
        Ok(answer) => Ok(ProviderAnswer {
            billed_before: answer.billed_before || billed,
            ..answer
        }),
        Err(ProviderError::InvalidOutput {
            message,
            usage,
            billed_before,
        }) => Err(ProviderError::InvalidOutput {
            message,
            usage,
            billed_before: billed_before || billed,
        }),
        Err(other) => Err(other),
    }
}

/// Why a provider call produced no output.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// The model answered, but not with what was asked (not JSON, no content, a refusal).
    /// The worker may ask again with this message, like an output that fails validation.
    #[error("{message}")]
    InvalidOutput {
        /// What is wrong with the answer.
        message: String,
        /// Tokens the refused answer used.
        usage: Usage,
        /// As [`ProviderAnswer::billed_before`].
        billed_before: bool,
    },
    /// The call failed for good (an HTTP 4xx other than 408/409/429, a malformed answer,
    /// misconfiguration): trying again would fail the same way. The task fails with
    /// `provider_error`.
    #[error("{0}")]
    Failed(String),
    /// The provider could not answer now (HTTP 408/409/429/5xx, a timeout, a connection
    /// error), still so after the provider's own retries (`max_retries`), or it asked to
    /// wait longer than `max_retry_delay`: a later call (or another deployment) may
    /// succeed. The task fails with `provider_error` unless the caller tries again.
    #[error("{message}")]
    Unavailable {
        /// What failed last.
        message: String,
        /// How long the provider asked to wait (`retry-after`, or an exhausted rate
        /// limit's reset), where it said.
        retry_after: Option<std::time::Duration>,
        /// The provider refused every try outright (HTTP 429, 503 or 529: it processed
        /// no tokens), so the call is charged nothing; `false` when a try may have been
        /// billed (a timeout, a dropped connection, another 5xx), and the call is then
        /// charged its bound (docs/routes.md, "What is charged when").
        refused: bool,
    },
    /// The output would be larger than `max_output_bytes`. The task fails with
    /// `output_too_large` (asking again would not make it smaller).
    #[error("{0}")]
    OutputTooLarge(String),
}

/// One embeddings request to a provider (the `embed` kind; docs/api.md, "Embeddings"):
/// the texts of one or more tasks that missed the item cache, grouped up to the batch size.
#[derive(Debug, Clone, Copy)]
pub struct EmbedCall<'a> {
    /// The deployment's model.
    pub model: &'a ModelRef,
    /// The texts, in order.
    pub texts: &'a [String],
    /// The vectors' dimension, when asked for.
    pub dimensions: Option<u32>,
}

/// A provider's vectors: one per text, in order, with the call's usage.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbedAnswer {
    /// One vector per text, in the texts' order.
    pub vectors: Vec<Vec<f32>>,
    /// Tokens used (input only; `estimated` when the provider did not say).
    pub usage: Usage,
}

/// A model provider. Object safe: the engine holds `Arc<dyn Provider>`. Dropping the
/// returned future aborts the call (the worker does so when its task is canceled).
#[async_trait]
pub trait Provider: Send + Sync + fmt::Debug + 'static {
    /// Produces one output for one request.
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError>;

    /// [`complete`](Self::complete), publishing the answer's pieces to `sink` as the
    /// provider sends them (docs/api.md, "Streaming a task"). The answer returned is the
    /// same as `complete`'s (output and usage). A provider that cannot stream keeps this
    /// default: its answer is read by readers as a whole at the task's end.
    async fn complete_streaming(
        &self,
        call: ProviderCall<'_>,
        sink: &StreamSink,
    ) -> Result<ProviderAnswer, ProviderError> {
        let _ = sink;
        self.complete(call).await
    }

    /// A call is about to be made (a door call's task is being created, claimed by this
    /// process, docs/engine.md, "Tasks claimed at creation"): the provider may get
    /// ready for it meanwhile. Never waits. HTTP providers begin reading their pause
    /// ([`pace::ProviderPace::prefetch`]); the default does nothing.
    fn prepare(&self) {}

    /// Embeds texts (the `embed` kind). A provider without an embeddings API (Anthropic)
    /// keeps this default, which fails the call for good.
    async fn embed(&self, call: EmbedCall<'_>) -> Result<EmbedAnswer, ProviderError> {
        Err(ProviderError::Failed(format!(
            "provider `{}` has no embeddings API",
            call.model.provider
        )))
    }
}

/// Provider name → provider instance.
#[derive(Debug, Clone, Default)]
pub struct ProviderRegistry {
    providers: HashMap<String, Arc<dyn Provider>>,
}

impl ProviderRegistry {
    /// Builds every provider under `[providers]`, plus the built-in `dev` unless a
    /// provider of that name is configured. Reads API keys from the environment now, so a
    /// missing key fails at start-up rather than on the first task.
    pub fn from_config(config: &EngineConfig) -> Result<ProviderRegistry, ConfigError> {
        Self::build(config, None)
    }

    /// [`from_config`](Self::from_config) with docs/conformance.md#provider-pace provider pace: providers (and
    /// models) with `requests_per_minute` / `tokens_per_minute` share `store`'s
    /// schedules with every replica, and every provider's 429s pause it there.
    pub fn from_config_paced(
        config: &EngineConfig,
        store: Arc<dyn Store>,
    ) -> Result<ProviderRegistry, ConfigError> {
        Self::build(config, Some(store))
    }

    fn build(
        config: &EngineConfig,
        store: Option<Arc<dyn Store>>,
    ) -> Result<ProviderRegistry, ConfigError> {
        let mut providers: HashMap<String, Arc<dyn Provider>> = HashMap::new();
        providers.insert(DEV_PROVIDER.to_string(), Arc::new(dev::DevProvider::new()));
        for (name, conf) in &config.providers {
            // docs/conformance.md#provider-pace: every HTTP provider's 429s pause it on every replica.
            let pace = || {
                store
                    .as_ref()
                    .map(|s| pace::ProviderPace::from_config(name, conf, config, s.clone()))
            };
            let provider: Arc<dyn Provider> = match conf.kind {
                ProviderKind::Dev => Arc::new(dev::DevProvider::new()),
                ProviderKind::Openai | ProviderKind::Azure => {
                    Arc::new(openai::OpenAiProvider::new(name, conf)?.with_pace(pace()))
                }
                ProviderKind::Anthropic => {
                    Arc::new(anthropic::AnthropicProvider::new(name, conf)?.with_pace(pace()))
                }
            };
            providers.insert(name.clone(), provider);
        }
        Ok(ProviderRegistry { providers })
    }

    /// Adds or replaces a provider (for providers implemented outside this crate).
    pub fn insert(&mut self, name: impl Into<String>, provider: Arc<dyn Provider>) {
        self.providers.insert(name.into(), provider);
    }

    /// The provider of a name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Provider>> {
        self.providers.get(name)
    }
}

/// The longest answer body read for an output limit: the output arrives as a JSON string
/// inside the answer's JSON, where escaping can make each byte up to six (`\u0000`), plus
/// the answer's own fields.
pub(crate) fn answer_limit(max_output_bytes: usize) -> usize {
    max_output_bytes.saturating_mul(6).saturating_add(64 * 1024)
}
