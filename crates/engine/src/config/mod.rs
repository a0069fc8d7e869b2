//! The engine's configuration: models, providers, budget policies, apps, workers, the
//! sweeper and notifications.
//!
//! [`EngineConfig::default`] works with no setup at all: one model `default` served by the
//! built-in offline `dev` provider, one budget policy `standard`, in-process
//! notifications. The shape is the TOML file the CLI loads (with figment: defaults < file
//! < `TOLLGATE_*` environment):
//!
//! ```toml
//! default_model = "default"
//! default_budget = "standard"
//! max_request_bytes = 262144
//! max_output_bytes = 1048576              # stored output; bigger fails with output_too_large
//!
//! [models.default]
//! provider = "openai"
//! model = "gpt-4o-mini"
//! params = { temperature = 0 }
//!
//! [models.smart]                        # a route: several deployments (docs/routes.md)
//! strategy = "fallback"                 # or "weighted" (by each deployment's weight)
//! cooldown = "30s"                      # a failed deployment is skipped this long (max 5 min)
//! attempt_timeout = "20s"               # the longest one call may take before moving on
//! [[models.smart.deployments]]
//! provider = "openai"
//! model = "gpt-4o-mini"
//! prices = { input_per_million = 0.15, output_per_million = 0.6 }
//! [[models.smart.deployments]]
//! provider = "backup"
//! model = "llama-3.1-8b"
//! weight = 1                            # for "weighted"
//! prices = { input_per_million = 0.05, output_per_million = 0.1 }
//!
//! [providers.openai]
//! kind = "openai"                       # or "dev"
//! base_url = "https://api.openai.com/v1"
//! api_key_env = "OPENAI_API_KEY"
//! timeout = "60s"
//! max_retries = 2
//!
//! requests_per_minute = 500             # docs/conformance.md#provider-pace pace across all replicas (optional)
//! tokens_per_minute = 200000            # (optional; per model too, under [models.<id>])
//! pace_window = "60s"                   # the window the per-minute limits count over
//!
//! [budgets.standard]
//! max_steps_per_source = 50
//! sources_per_24_hours = 10000
//! scope_concurrent = 50
//! burst = 60
//! tasks_per_minute = 600
//! weight = 1                            # docs/conformance.md#fair-share share of claims against other scopes
//!
//! [dispatch]
//! fairness = true                       # false: oldest first across everything
//! ageing_step = "60s"                   # one priority level is worth this much waiting
//!
//! [apps.acme]
//! default_budget = "standard"
//! allowed_budgets = ["standard"]
//!
//! [admission]
//! global_concurrent = 1000
//!
//! [workers]
//! concurrency = 8                       # 0: this process runs no tasks (API only)
//! heartbeat_interval = "5s"
//! max_output_retries = 2
//! embed_gather = "10ms"                 # embed tasks' texts grouped into one call
//!
//! [sweeper]
//! interval = "10s"
//! queue_timeout = "1h"
//! liveness_timeout = "30s"
//! retention = "24h"                    # released tasks; ended webhook events
//! batch_size = 100
//!
//! [notifications]
//! transport = "local"                   # or "nats", "postgres"
//! nats_url = "nats://127.0.0.1:4222"
//! subject_prefix = "tollgate"
//! poll_interval = "1s"
//! waiters_per_app = 1000                # calls of one app waiting at once (429 beyond)
//!
//! [pipelines]
//! concurrency = 8                       # runs driven at once; 0: this process drives none
//! lease = "30s"
//! poll_interval = "1s"
//! admission_retry = true                # false: an admission rejection fails the run
//! admission_default_delay = "5s"
//! error_delay = "1s"
//! interrupted_retries = 3               # attempts cut short by a crash, tried again
//! drive_without_workers = false         # true: an API-only replica drives runs too
//!
//! [webhooks]                            # docs/webhooks.md
//! concurrency = 16                      # deliveries sent at once; 0: this process sends none
//! per_app_concurrency = 4               # of one app at once
//! allow_http = false                    # https only by default
//! allowed_networks = []                 # internal networks endpoints may reach, e.g. ["10.0.0.0/8"]
//! timeout = "10s"
//! max_response_bytes = 65536
//! lease = "60s"
//! retry = { initial = "5s", max_interval = "1h", give_up_after = "24h", jitter = 0.2 }
//!
//! [[webhooks.endpoints]]                # read-only over the API
//! app = "acme"
//! name = "main"
//! url = "https://hooks.acme.example/tollgate"
//! secret = "whsec_…"
//! events = ["task.succeeded", "task.failed"]
//! ```
//!
//! Durations are strings: `"200ms"`, `"2s"`, `"1h"`, `"1h 30m"`.
//! [`EngineConfig::validate`] names the exact key of every problem.
//!
//! One module per section: [`models`] (`[models]`, `[providers]`), [`budgets`]
//! (`[budgets]`, `[apps]`, `[admission]`), [`workers`] (`[workers]`, `[sweeper]`),
//! [`notifications`], [`pipelines`], and [`validate`] (the checks and their errors).

mod budgets;
mod dispatch;
mod models;
mod notifications;
mod pipelines;
mod routes;
mod validate;
mod webhooks;
mod workers;

pub use budgets::*;
pub use dispatch::*;
pub use models::*;
pub use notifications::*;
pub use pipelines::*;
pub use routes::*;
pub use validate::*;
pub use webhooks::*;
pub use workers::*;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tollgate_core::{DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_REQUEST_BYTES};

/// The model id used when a submission names none, in the default configuration.
pub const DEFAULT_MODEL: &str = "default";
/// The name of the built-in offline provider; always available unless configured otherwise.
pub const DEV_PROVIDER: &str = "dev";
/// The budget policy of the default configuration.
pub const STANDARD_BUDGET: &str = "standard";
/// The OpenAI API, used when an `openai` provider gives no `base_url`.
pub const OPENAI_BASE_URL: &str = "https://api.openai.com/v1";

/// The whole engine configuration. Unknown keys are errors (a typo must not be ignored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// The model id used when a submission names none.
    pub default_model: String,
    /// The budget policy of apps that are not listed under `[apps]`, and the default of
    /// listed apps that name none.
    pub default_budget: String,
    /// Largest request accepted, in bytes of its stored (canonical) form.
    pub max_request_bytes: usize,
    /// Largest output stored, in bytes of its JSON. A request whose smallest valid output
    /// is larger is refused at submit; an output over it fails its task with
    /// `output_too_large`, and the `dev` provider stops building an output past it.
    pub max_output_bytes: usize,
    /// Model ids callers may ask for.
    pub models: BTreeMap<String, ModelConfig>,
    /// Providers the models use, by name.
    pub providers: BTreeMap<String, ProviderConfig>,
    /// Named budget policies (docs/conformance.md#budget-policies).
    pub budgets: BTreeMap<String, BudgetPolicy>,
    /// Per-app budget choices.
    pub apps: BTreeMap<String, AppConfig>,
    /// Server-wide admission settings.
    pub admission: AdmissionConfig,
    /// The worker pool of this process.
    pub workers: WorkerConfig,
    /// The background sweeper of this process (docs/conformance.md#sweeps).
    pub sweeper: SweeperConfig,
    /// How replicas hint each other.
    pub notifications: NotificationConfig,
    /// The pipeline driver of this process.
    pub pipelines: PipelineConfig,
    /// The order workers start queued tasks in (docs/conformance.md#fair-share).
    pub dispatch: DispatchConfig,
    /// Webhook delivery and endpoints (docs/webhooks.md).
    pub webhooks: WebhookConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let mut models = BTreeMap::new();
        models.insert(
            DEFAULT_MODEL.to_string(),
            ModelConfig {
                provider: DEV_PROVIDER.to_string(),
                model: "dev-1".to_string(),
                ..ModelConfig::default()
            },
        );
        let mut providers = BTreeMap::new();
        providers.insert(DEV_PROVIDER.to_string(), ProviderConfig::dev());
        let mut budgets = BTreeMap::new();
        budgets.insert(STANDARD_BUDGET.to_string(), BudgetPolicy::default());
        EngineConfig {
            default_model: DEFAULT_MODEL.to_string(),
            default_budget: STANDARD_BUDGET.to_string(),
            max_request_bytes: DEFAULT_MAX_REQUEST_BYTES,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
            models,
            providers,
            budgets,
            apps: BTreeMap::new(),
            admission: AdmissionConfig::default(),
            workers: WorkerConfig::default(),
            sweeper: SweeperConfig::default(),
            notifications: NotificationConfig::default(),
            pipelines: PipelineConfig::default(),
            dispatch: DispatchConfig::default(),
            webhooks: WebhookConfig::default(),
        }
    }
}

impl EngineConfig {
    /// The kind of the provider named `name`: configured, else `dev` for the built-in
    /// `dev`; `None` for a provider this configuration does not know (one added in code).
    pub fn provider_kind(&self, name: &str) -> Option<ProviderKind> {
        self.providers
            .get(name)
            .map(|p| p.kind)
            .or((name == DEV_PROVIDER).then_some(ProviderKind::Dev))
    }
}

/// Durations as human-readable strings (`"200ms"`, `"2s"`, `"1h 30m"`), for serde.
pub mod duration_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Writes `"1m 30s"`-style text.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&humantime::format_duration(*d).to_string())
    }

    /// Reads `"200ms"`, `"2s"`, `"1h"`, `"1h 30m"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(serde::de::Error::custom)
    }

    /// Parses a duration, with a message that shows the expected form: the configuration
    /// syntax of [`tollgate_core::parse_duration`], the one duration parser.
    pub fn parse(text: &str) -> Result<Duration, String> {
        tollgate_core::parse_duration(text, tollgate_core::DurationSyntax::Config)
            .map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_default_configuration_is_valid() {
        EngineConfig::default().validate().unwrap();
    }

    #[test]
    fn limits_accept_whole_numbers_only() {
        assert_eq!(Limit::Integer(5).positive().unwrap().get(), 5);
        assert_eq!(Limit::Float(5.0).positive().unwrap().get(), 5);
        assert!(Limit::Float(1.5).positive().is_err());
        assert!(Limit::Integer(0).positive().is_err());
        assert!(Limit::Integer(-1).positive().is_err());
        assert!(Limit::Integer(1 << 40).positive().is_err());
    }

    #[test]
    fn durations_read_human_text() {
        assert_eq!(
            duration_text::parse("200ms").unwrap(),
            Duration::from_millis(200)
        );
        assert_eq!(
            duration_text::parse("1h").unwrap(),
            Duration::from_secs(3600)
        );
        assert!(duration_text::parse("soon").unwrap_err().contains("soon"));
    }
}
