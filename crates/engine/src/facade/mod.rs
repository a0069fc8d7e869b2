//! The [`Tollgate`] facade: everything an HTTP server, a CLI or an embedding Rust program
//! calls. Each operation validates, calls the store (one short transaction, never held
//! during inference) and publishes notifications after the commit.
//!
//! Split by what the calls are about: [`submission`] (what a caller submits),
//! `submit` (docs/conformance.md#creating-a-task creation, one or a batch), `tasks` (reading, waiting, cancel,
//! release, deletion), `runs` (workflow runs) and `open` (databases and notifiers from a
//! URL).

mod open;
mod runs;
mod submission;
mod submit;
mod tasks;

pub use submission::{SourceSpec, Submission, SubmissionOwner, Submitted};
pub(crate) use submit::Start;
pub use tasks::TaskWaiter;

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::inner::Inner;
use crate::notify::Notifier;
use crate::pipeline_cache::PipelineCache;
use crate::provider::{Provider, ProviderRegistry};
use crate::registry::{BudgetPolicies, ModelRegistry};
use crate::watch::Watches;
use std::sync::Arc;
use tollgate_store::Store;

/// Most submissions one [`Tollgate::submit_many`] call accepts.
pub const MAX_BATCH: usize = 1000;

/// Builds a [`Tollgate`] with a chosen notifier or extra providers.
pub struct TollgateBuilder {
    store: Arc<dyn Store>,
    config: EngineConfig,
    notifier: Option<Notifier>,
    providers: Vec<(String, Arc<dyn Provider>)>,
    tracer: Option<opentelemetry::global::BoxedTracer>,
}

impl std::fmt::Debug for TollgateBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TollgateBuilder")
            .field("store", &self.store.backend())
            .field("notifier", &self.notifier)
            .finish_non_exhaustive()
    }
}

impl TollgateBuilder {
    /// Uses this notifier (default: [`Notifier::local`]).
    pub fn notifier(mut self, notifier: Notifier) -> TollgateBuilder {
        self.notifier = Some(notifier);
        self
    }

    /// Registers a provider under `name` (models may name it as their `provider`),
    /// replacing a configured one of the same name.
    pub fn provider(mut self, name: impl Into<String>, provider: Arc<dyn Provider>) -> Self {
        self.providers.push((name.into(), provider));
        self
    }

    /// Records traces with `tracer` (docs/telemetry.md; default: no traces, at no cost).
    pub fn tracer(mut self, tracer: Option<opentelemetry::global::BoxedTracer>) -> Self {
        self.tracer = tracer;
        self
    }

    /// Validates the configuration and builds the engine (nothing runs until
    /// [`Tollgate::start`]).
    pub fn build(self) -> Result<Tollgate, EngineError> {
        let extra: Vec<&str> = self.providers.iter().map(|(n, _)| n.as_str()).collect();
        self.config.validate_with_providers(&extra)?;
        let models = ModelRegistry::from_config(&self.config)?;
        let budgets = BudgetPolicies::from_config(&self.config)?;
        let mut providers = ProviderRegistry::from_config_paced(&self.config, self.store.clone())?;
        for (name, provider) in self.providers {
            providers.insert(name, provider);
        }
        let notifier = self.notifier.unwrap_or_else(Notifier::local);
        let watches = Arc::new(Watches::new(
            self.store.clone(),
            notifier.clone(),
            self.config.notifications.poll_interval,
            self.config.notifications.waiters_per_app,
        ));
        let traces = crate::telemetry::Traces::new(self.tracer, &self.config);
        // Running tasks' live output, logged for readers on other replicas.
        let streams = Arc::new(crate::stream::StreamHub::logged(
            self.store.clone(),
            notifier.clone(),
        ));
        Ok(Tollgate {
            inner: Arc::new(Inner {
                traces,
                store: self.store,
                config: self.config,
                models,
                budgets,
                providers,
                notifier,
                pipelines: PipelineCache::default(),
                watches,
                streams,
                local_pool: std::sync::Mutex::default(),
            }),
        })
    }
}

/// Tollgate: submit, inspect, wait for and cancel AI tasks; run the workers and the
/// sweeper ([`Tollgate::start`], [`Tollgate::sweep_now`]). Cloning shares one engine.
#[derive(Debug, Clone)]
pub struct Tollgate {
    pub(crate) inner: Arc<Inner>,
}

impl Tollgate {
    /// An engine over `store` with in-process notifications and the configured providers.
    pub fn new(store: Arc<dyn Store>, config: EngineConfig) -> Result<Tollgate, EngineError> {
        Tollgate::builder(store, config).build()
    }

    /// A builder, to choose the notifier or add providers.
    pub fn builder(store: Arc<dyn Store>, config: EngineConfig) -> TollgateBuilder {
        TollgateBuilder {
            store,
            config,
            notifier: None,
            providers: Vec::new(),
            tracer: None,
        }
    }

    /// Opens the database and builds the engine: `postgres://…` or `postgresql://…` is
    /// PostgreSQL; `sqlite://path`, `sqlite:path` or a plain path is SQLite (created if
    /// missing). The notifier follows `[notifications] transport`.
    pub async fn open(database_url: &str, config: EngineConfig) -> Result<Tollgate, EngineError> {
        Tollgate::open_traced(database_url, config, None).await
    }

    /// [`open`](Self::open), recording traces with `tracer` when given (docs/telemetry.md).
    pub async fn open_traced(
        database_url: &str,
        config: EngineConfig,
        tracer: Option<opentelemetry::global::BoxedTracer>,
    ) -> Result<Tollgate, EngineError> {
        config.validate()?;
        let (store, notifier) = if database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://")
        {
            open::open_postgres(database_url, &config).await?
        } else {
            open::open_sqlite(database_url, &config).await?
        };
        Tollgate::builder(store, config)
            .notifier(notifier)
            .tracer(tracer)
            .build()
    }

    /// The engine's traces (the HTTP layer starts its request spans with them).
    pub fn traces(&self) -> &crate::telemetry::Traces {
        &self.inner.traces
    }

    /// The database backend in use: `sqlite` or `postgres`.
    pub fn backend(&self) -> &'static str {
        self.inner.store.backend()
    }

    /// Checks that the database answers (a readiness probe).
    pub async fn ping(&self) -> Result<(), EngineError> {
        Ok(self.inner.store.ping().await?)
    }

    /// Keeps `value` under `name` in the database unless a value is kept there already,
    /// and returns the kept one (the first writer wins, across replicas and restarts).
    pub async fn keep_setting(&self, name: &str, value: &str) -> Result<String, EngineError> {
        Ok(self.inner.store.keep_setting(name, value).await?)
    }

    /// The configuration in force.
    pub fn config(&self) -> &EngineConfig {
        &self.inner.config
    }

    /// The model registry.
    pub fn models(&self) -> &ModelRegistry {
        &self.inner.models
    }

    /// The notifier (subscribe to hear tasks finish and runs wake).
    pub fn notifier(&self) -> &Notifier {
        &self.inner.notifier
    }
}
