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
//! [providers.openai]
//! kind = "openai"                       # or "dev"
//! base_url = "https://api.openai.com/v1"
//! api_key_env = "OPENAI_API_KEY"
//! timeout = "60s"
//! max_retries = 2
//!
//! [budgets.standard]
//! max_steps_per_source = 50
//! sources_per_24_hours = 10000
//! scope_concurrent = 50
//! burst = 60
//! tasks_per_minute = 600
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
//!
//! [sweeper]
//! interval = "10s"
//! queue_timeout = "1h"
//! liveness_timeout = "30s"
//! retention = "24h"
//! batch_size = 100
//!
//! [notifications]
//! transport = "local"                   # or "nats", "postgres"
//! nats_url = "nats://127.0.0.1:4222"
//! subject_prefix = "tollgate"
//! poll_interval = "1s"
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
//! ```
//!
//! Durations are strings: `"200ms"`, `"2s"`, `"1h"`, `"1h 30m"`.
//! [`EngineConfig::validate`] names the exact key of every problem.

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::num::NonZeroU32;
use std::time::Duration;
use tollgate_core::{
    AppId, BudgetName, DEFAULT_MAX_OUTPUT_BYTES, DEFAULT_MAX_REQUEST_BYTES, ModelId, ModelRef,
};

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
    /// Named budget policies (SPEC §10).
    pub budgets: BTreeMap<String, BudgetPolicy>,
    /// Per-app budget choices.
    pub apps: BTreeMap<String, AppConfig>,
    /// Server-wide admission settings.
    pub admission: AdmissionConfig,
    /// The worker pool of this process.
    pub workers: WorkerConfig,
    /// The background sweeper of this process (SPEC §6).
    pub sweeper: SweeperConfig,
    /// How replicas hint each other.
    pub notifications: NotificationConfig,
    /// The pipeline driver of this process.
    pub pipelines: PipelineConfig,
}

impl Default for EngineConfig {
    fn default() -> Self {
        let mut models = BTreeMap::new();
        models.insert(
            DEFAULT_MODEL.to_string(),
            ModelConfig {
                provider: DEV_PROVIDER.to_string(),
                model: "dev-1".to_string(),
                params: Map::new(),
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
        }
    }
}

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
}

impl ModelConfig {
    /// The resolved model reference.
    pub fn model_ref(&self) -> ModelRef {
        ModelRef {
            provider: self.provider.clone(),
            model: self.model.clone(),
            params: self.params.clone(),
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

impl ProviderConfig {
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

/// A budget number as written in configuration. [`EngineConfig::validate`] requires a
/// positive integer below 2^32; anything else is reported with its key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// An integer (valid when positive and below 2^32).
    Integer(i64),
    /// A number written with a fraction or exponent (valid only when it is a whole
    /// positive number).
    Float(f64),
}

impl Limit {
    /// The positive 32-bit value, or why it is not one.
    pub fn positive(self) -> Result<NonZeroU32, String> {
        let whole = match self {
            Limit::Integer(n) => n,
            Limit::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 => f as i64,
            Limit::Float(f) => return Err(format!("must be a positive integer, got {f}")),
        };
        u32::try_from(whole)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| format!("must be a positive integer below 2^32, got {whole}"))
    }
}

impl From<u32> for Limit {
    fn from(n: u32) -> Limit {
        Limit::Integer(i64::from(n))
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Limit::Integer(n) => s.serialize_i64(*n),
            Limit::Float(f) => s.serialize_f64(*f),
        }
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Limit, D::Error> {
        struct LimitVisitor;
        impl Visitor<'_> for LimitVisitor {
            type Value = Limit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Limit, E> {
                Ok(Limit::Integer(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Limit, E> {
                Ok(i64::try_from(v).map_or(Limit::Float(v as f64), Limit::Integer))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Limit, E> {
                Ok(Limit::Float(v))
            }
        }
        d.deserialize_any(LimitVisitor)
    }
}

/// `[budgets.<name>]`: the five per-scope admission limits of SPEC §4 (the sixth,
/// `global_concurrent`, is the server-wide `[admission]` setting).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetPolicy {
    /// Distinct logical steps admitted for one source in 24 h.
    pub max_steps_per_source: Limit,
    /// Distinct sources admitted in the scope in 24 h.
    pub sources_per_24_hours: Limit,
    /// Scoped tasks of the scope that are queued or running.
    pub scope_concurrent: Limit,
    /// Token-bucket capacity per (app, scope).
    pub burst: Limit,
    /// Token-bucket refill in tasks per minute.
    pub tasks_per_minute: Limit,
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        BudgetPolicy {
            max_steps_per_source: Limit::Integer(50),
            sources_per_24_hours: Limit::Integer(10_000),
            scope_concurrent: Limit::Integer(50),
            burst: Limit::Integer(60),
            tasks_per_minute: Limit::Integer(600),
        }
    }
}

impl BudgetPolicy {
    fn fields(&self) -> [(&'static str, Limit); 5] {
        [
            ("max_steps_per_source", self.max_steps_per_source),
            ("sources_per_24_hours", self.sources_per_24_hours),
            ("scope_concurrent", self.scope_concurrent),
            ("burst", self.burst),
            ("tasks_per_minute", self.tasks_per_minute),
        ]
    }
}

/// `[apps.<app>]`: which budget policies an app uses.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// The policy of the app's scoped tasks that name none (default: the top-level
    /// `default_budget`).
    #[serde(default)]
    pub default_budget: Option<String>,
    /// The policies a request of the app may name (default: only its default).
    #[serde(default)]
    pub allowed_budgets: Option<Vec<String>>,
    /// The app's API keys. They belong to the HTTP server's configuration; the engine
    /// accepts and ignores them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<Value>,
}

/// `[admission]`: server-wide admission settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Scoped tasks of all apps and scopes that may be queued or running at once.
    pub global_concurrent: Limit,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            global_concurrent: Limit::Integer(1000),
        }
    }
}

/// `[workers]`: this process's worker pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Tasks executed at once by this process; 0 runs none (an API-only replica).
    pub concurrency: u32,
    /// How often the pool heartbeats all its tasks (one write) and learns which to stop.
    #[serde(with = "duration_text")]
    pub heartbeat_interval: Duration,
    /// How many times an invalid model output is sent back to the provider with the
    /// validation error before the task fails with `invalid_model_output`.
    pub max_output_retries: u32,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 8,
            heartbeat_interval: Duration::from_secs(5),
            max_output_retries: 2,
        }
    }
}

/// `[sweeper]`: SPEC §6 timeouts and batches (configuration, not constants).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweeperConfig {
    /// How often this replica sweeps.
    #[serde(with = "duration_text")]
    pub interval: Duration,
    /// Queued longer than this fails with `WORKFLOW_AI_QUEUE_TIMEOUT`.
    #[serde(with = "duration_text")]
    pub queue_timeout: Duration,
    /// Running without a heartbeat this long fails with `WORKFLOW_AI_INTERRUPTED`.
    #[serde(with = "duration_text")]
    pub liveness_timeout: Duration,
    /// Released terminal application tasks are deleted this long after release and
    /// completion.
    #[serde(with = "duration_text")]
    pub retention: Duration,
    /// Rows per sweep item per round.
    pub batch_size: u32,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            interval: Duration::from_secs(10),
            queue_timeout: Duration::from_secs(3600),
            liveness_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            batch_size: 100,
        }
    }
}

/// How replicas tell each other about new and finished work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// In this process only.
    Local,
    /// NATS core pub/sub.
    Nats,
    /// PostgreSQL `LISTEN/NOTIFY` (PostgreSQL databases only).
    Postgres,
}

/// `[notifications]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotificationConfig {
    /// Which transport carries hints between replicas.
    pub transport: TransportKind,
    /// The NATS server (`transport = "nats"`).
    pub nats_url: String,
    /// NATS subjects are `<prefix>.task.queued`, `<prefix>.task.finished`,
    /// `<prefix>.run.woken`.
    pub subject_prefix: String,
    /// The bounded fallback: every waiter and every idle worker looks at the database at
    /// least this often, so a lost notification costs at most this much latency.
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
}

impl Default for NotificationConfig {
    fn default() -> Self {
        NotificationConfig {
            transport: TransportKind::Local,
            nats_url: "nats://127.0.0.1:4222".to_string(),
            subject_prefix: "tollgate".to_string(),
            poll_interval: Duration::from_secs(1),
        }
    }
}

/// `[pipelines]`: how this process drives pipeline runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Runs this process drives at once (each drive is a few short store calls, never
    /// held during inference). 0: this process drives no runs (other replicas do).
    pub concurrency: u32,
    /// How long a claimed run is held by this process's driver. Another replica takes
    /// over a run whose driver died once its lease ends.
    #[serde(with = "duration_text")]
    pub lease: Duration,
    /// The bounded fallback: an idle driver looks for due runs at least this often,
    /// whatever notifications say.
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    /// An admission rejection of a step (`WORKFLOW_AI_*`) makes the run wait and try
    /// again; `false` fails the run with the rejection instead.
    pub admission_retry: bool,
    /// How long a run waits after an admission rejection that gives no retry time
    /// (capacity, per-source and daily budgets).
    #[serde(with = "duration_text")]
    pub admission_default_delay: Duration,
    /// How long a run waits before it is driven again after a store error (an
    /// unavailable database).
    #[serde(with = "duration_text")]
    pub error_delay: Duration,
    /// How many times a step whose attempt was interrupted by a dead worker
    /// (`WORKFLOW_AI_INTERRUPTED`, a crash mid-call) is tried again, on top of the step's
    /// own `retries`: a run survives crashes of the processes executing its steps.
    pub interrupted_retries: u32,
    /// Whether a process that runs no workers (`workers.concurrency = 0`, an API-only
    /// replica) drives pipeline runs too. Off by default: API-only replicas answer HTTP
    /// and sweep, and the worker replicas drive runs.
    pub drive_without_workers: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            concurrency: 8,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            admission_retry: true,
            admission_default_delay: Duration::from_secs(5),
            error_delay: Duration::from_secs(1),
            interrupted_retries: 3,
            drive_without_workers: false,
        }
    }
}

/// One configuration problem, at one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    /// The dotted key, e.g. `budgets.standard.burst` or `apps.acme.allowed_budgets[1]`.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Every problem [`EngineConfig::validate`] found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration: {}", self.problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct ConfigError {
    /// The problems, in key order of discovery.
    pub problems: Vec<ConfigProblem>,
}

impl ConfigError {
    /// One problem.
    pub fn at(key: impl Into<String>, message: impl Into<String>) -> ConfigError {
        ConfigError {
            problems: vec![ConfigProblem {
                key: key.into(),
                message: message.into(),
            }],
        }
    }

    /// Whether some problem is at `key`.
    pub fn mentions(&self, key: &str) -> bool {
        self.problems.iter().any(|p| p.key == key)
    }
}

struct Problems(Vec<ConfigProblem>);

impl Problems {
    fn add(&mut self, key: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigProblem {
            key: key.into(),
            message: message.into(),
        });
    }

    fn positive_duration(&mut self, key: &str, d: Duration) {
        if d.is_zero() {
            self.add(key, "must be longer than 0");
        }
    }
}

impl EngineConfig {
    /// Checks the whole configuration and reports every problem with its exact key:
    /// unknown providers, models, budgets; budget numbers that are not positive integers;
    /// app defaults outside their allowed lists; zero intervals; a liveness timeout not
    /// longer than the heartbeat interval; and so on.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with_providers(&[])
    }

    /// [`validate`](Self::validate), counting `extra_providers` (registered in code) as
    /// configured.
    pub fn validate_with_providers(&self, extra_providers: &[&str]) -> Result<(), ConfigError> {
        let mut p = Problems(Vec::new());
        self.check_models(&mut p, extra_providers);
        self.check_providers(&mut p);
        self.check_budgets(&mut p);
        self.check_runtime(&mut p);
        if p.0.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { problems: p.0 })
        }
    }

    fn has_provider(&self, name: &str, extra: &[&str]) -> bool {
        self.providers.contains_key(name) || name == DEV_PROVIDER || extra.contains(&name)
    }

    fn check_models(&self, p: &mut Problems, extra: &[&str]) {
        if !self.models.contains_key(&self.default_model) {
            p.add(
                "default_model",
                format!(
                    "names model `{}`, which is not under [models] (configured: {})",
                    self.default_model,
                    listed(self.models.keys())
                ),
            );
        }
        for (id, model) in &self.models {
            let key = format!("models.{id}");
            if let Err(e) = ModelId::new(id.as_str()) {
                p.add(&key, format!("is not a valid model id: {e}"));
            }
            if !self.has_provider(&model.provider, extra) {
                p.add(
                    format!("{key}.provider"),
                    format!(
                        "names provider `{}`, which is not under [providers] (configured: {})",
                        model.provider,
                        listed(self.providers.keys())
                    ),
                );
            }
            if model.model.trim().is_empty() {
                p.add(format!("{key}.model"), "must not be empty");
            }
            if let Err(e) = model.model_ref().config_hash() {
                p.add(format!("{key}.params"), e.to_string());
            }
            if model.provider == DEV_PROVIDER
                || self.providers.get(&model.provider).map(|c| c.kind) == Some(ProviderKind::Dev)
            {
                match model.params.get("latency_ms") {
                    None => {}
                    Some(v) if v.as_u64().is_some() => {}
                    Some(_) => p.add(
                        format!("{key}.params.latency_ms"),
                        "must be a non-negative integer (milliseconds)",
                    ),
                }
                match model.params.get("time_limit_ms") {
                    None => {}
                    Some(v) if v.as_u64().is_some_and(|ms| ms > 0) => {}
                    Some(_) => p.add(
                        format!("{key}.params.time_limit_ms"),
                        "must be a positive integer (milliseconds)",
                    ),
                }
            }
        }
    }

    fn check_providers(&self, p: &mut Problems) {
        for (name, provider) in &self.providers {
            let key = format!("providers.{name}");
            if name.trim().is_empty() {
                p.add(&key, "a provider name must not be empty");
            }
            match provider.kind {
                ProviderKind::Dev => {
                    if provider.base_url.is_some() {
                        p.add(
                            format!("{key}.base_url"),
                            "is not used by a `dev` provider; remove it or set kind = \"openai\"",
                        );
                    }
                    if provider.api_key_env.is_some() {
                        p.add(
                            format!("{key}.api_key_env"),
                            "is not used by a `dev` provider; remove it or set kind = \"openai\"",
                        );
                    }
                }
                ProviderKind::Openai => {
                    let url = provider.base_url.as_deref().unwrap_or(OPENAI_BASE_URL);
                    match reqwest::Url::parse(url) {
                        Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
                        Ok(u) => p.add(
                            format!("{key}.base_url"),
                            format!("must be an http or https URL, not {}", u.scheme()),
                        ),
                        Err(e) => p.add(
                            format!("{key}.base_url"),
                            format!("is not a valid URL ({url:?}): {e}"),
                        ),
                    }
                    if let Some(env) = &provider.api_key_env
                        && (env.is_empty() || env.contains('='))
                    {
                        p.add(
                            format!("{key}.api_key_env"),
                            "must be the name of an environment variable",
                        );
                    }
                    p.positive_duration(&format!("{key}.timeout"), provider.timeout);
                    if provider.max_retries > 20 {
                        p.add(format!("{key}.max_retries"), "must be at most 20");
                    }
                    p.positive_duration(&format!("{key}.retry_backoff"), provider.retry_backoff);
                    if provider.max_retry_delay < provider.retry_backoff {
                        p.add(
                            format!("{key}.max_retry_delay"),
                            "must not be shorter than retry_backoff",
                        );
                    }
                }
            }
        }
    }

    fn check_budgets(&self, p: &mut Problems) {
        for (name, policy) in &self.budgets {
            if let Err(e) = BudgetName::new(name.as_str()) {
                p.add(format!("budgets.{name}"), format!("invalid name: {e}"));
            }
            for (field, value) in policy.fields() {
                if let Err(message) = value.positive() {
                    p.add(format!("budgets.{name}.{field}"), message);
                }
            }
        }
        if let Err(message) = self.admission.global_concurrent.positive() {
            p.add("admission.global_concurrent", message);
        }
        if !self.budgets.contains_key(&self.default_budget) {
            p.add(
                "default_budget",
                format!(
                    "names budget `{}`, which is not under [budgets] (configured: {})",
                    self.default_budget,
                    listed(self.budgets.keys())
                ),
            );
        }
        for (app, conf) in &self.apps {
            let key = format!("apps.{app}");
            if let Err(e) = AppId::new(app.as_str()) {
                p.add(&key, format!("is not a valid app id: {e}"));
            }
            let default = conf.default_budget.as_ref().unwrap_or(&self.default_budget);
            if let Some(name) = &conf.default_budget
                && !self.budgets.contains_key(name)
            {
                p.add(
                    format!("{key}.default_budget"),
                    format!("names budget `{name}`, which is not under [budgets]"),
                );
            }
            if let Some(allowed) = &conf.allowed_budgets {
                if allowed.is_empty() {
                    p.add(
                        format!("{key}.allowed_budgets"),
                        "must list at least the app's default budget",
                    );
                }
                let mut seen = BTreeSet::new();
                for (i, name) in allowed.iter().enumerate() {
                    if !self.budgets.contains_key(name) {
                        p.add(
                            format!("{key}.allowed_budgets[{i}]"),
                            format!("names budget `{name}`, which is not under [budgets]"),
                        );
                    }
                    if !seen.insert(name) {
                        p.add(
                            format!("{key}.allowed_budgets[{i}]"),
                            format!("lists `{name}` twice"),
                        );
                    }
                }
                if !allowed.is_empty() && !allowed.contains(default) {
                    p.add(
                        format!("{key}.default_budget"),
                        format!(
                            "`{default}` is not in allowed_budgets ({})",
                            listed(allowed)
                        ),
                    );
                }
            }
        }
    }

    fn check_runtime(&self, p: &mut Problems) {
        if self.max_request_bytes == 0 {
            p.add("max_request_bytes", "must be at least 1");
        }
        if self.max_output_bytes < 64 {
            p.add("max_output_bytes", "must be at least 64");
        }
        if self.workers.concurrency > 10_000 {
            p.add("workers.concurrency", "must be from 0 to 10000");
        }
        p.positive_duration(
            "workers.heartbeat_interval",
            self.workers.heartbeat_interval,
        );
        if self.workers.max_output_retries > 10 {
            p.add("workers.max_output_retries", "must be at most 10");
        }
        p.positive_duration("sweeper.interval", self.sweeper.interval);
        p.positive_duration("sweeper.queue_timeout", self.sweeper.queue_timeout);
        if self.sweeper.liveness_timeout <= self.workers.heartbeat_interval {
            p.add(
                "sweeper.liveness_timeout",
                format!(
                    "must be longer than workers.heartbeat_interval ({}), or running tasks \
                     would expire between heartbeats",
                    humantime::format_duration(self.workers.heartbeat_interval)
                ),
            );
        }
        if self.sweeper.batch_size == 0 || self.sweeper.batch_size > 10_000 {
            p.add("sweeper.batch_size", "must be from 1 to 10000");
        }
        p.positive_duration(
            "notifications.poll_interval",
            self.notifications.poll_interval,
        );
        if self.notifications.transport == TransportKind::Nats
            && self.notifications.nats_url.trim().is_empty()
        {
            p.add("notifications.nats_url", "must not be empty");
        }
        if self.pipelines.concurrency > 1000 {
            p.add("pipelines.concurrency", "must be from 0 to 1000");
        }
        if self.pipelines.interrupted_retries > 100 {
            p.add("pipelines.interrupted_retries", "must be from 0 to 100");
        }
        p.positive_duration("pipelines.lease", self.pipelines.lease);
        p.positive_duration("pipelines.poll_interval", self.pipelines.poll_interval);
        p.positive_duration(
            "pipelines.admission_default_delay",
            self.pipelines.admission_default_delay,
        );
        p.positive_duration("pipelines.error_delay", self.pipelines.error_delay);
        let prefix = &self.notifications.subject_prefix;
        if prefix.is_empty()
            || prefix.starts_with('.')
            || prefix.ends_with('.')
            || prefix
                .chars()
                .any(|c| c.is_whitespace() || c == '*' || c == '>' || c.is_control())
        {
            p.add(
                "notifications.subject_prefix",
                "must be a NATS subject without wildcards or whitespace, e.g. `tollgate`",
            );
        }
    }
}

fn listed<T: AsRef<str>>(names: impl IntoIterator<Item = T>) -> String {
    let names: Vec<String> = names
        .into_iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
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

    /// Parses a duration, with a message that shows the expected form.
    pub fn parse(text: &str) -> Result<Duration, String> {
        humantime::parse_duration(text.trim()).map_err(|e| {
            format!("invalid duration {text:?} ({e}); write e.g. \"200ms\", \"2s\", \"1h\"")
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
