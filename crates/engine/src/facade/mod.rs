//! The [`Tollgate`] facade: everything an HTTP server, a CLI or an embedding Rust program
//! calls. Each operation validates, calls the store (one short transaction, never held
//! during inference) and publishes notifications after the commit.
//!
//! Split by what the calls are about: [`submission`] (what a caller submits),
//! `submit` (SPEC §3 creation, one or a batch), `tasks` (reading, waiting, cancel,
//! release, deletion), `runs` (workflow runs) and `open` (databases and notifiers from a
//! URL).

mod open;
mod runs;
mod submission;
mod submit;
mod tasks;

pub use submission::{SourceSpec, Submission, SubmissionOwner, Submitted};
pub use tasks::TaskWaiter;

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::notify::{Event, FinishedTask, Notifier};
use crate::pipelines::PipelineCache;
use crate::provider::{Provider, ProviderRegistry};
use crate::registry::{BudgetPolicies, ModelRegistry};
use crate::sweeper;
use crate::watch::Watches;
use crate::worker::{EngineHandle, WorkerPool};
use serde_json::Value;
use std::sync::Arc;
use tollgate_core::{InvalidInput, TaskKind, ValidatedRequest, check_output_fits};
use tollgate_store::{Store, SweepReport, Transition};

/// Most submissions one [`Tollgate::submit_many`] call accepts.
pub const MAX_BATCH: usize = 1000;

/// What the engine shares between the facade, the workers and the sweeper.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: EngineConfig,
    pub(crate) models: ModelRegistry,
    pub(crate) budgets: BudgetPolicies,
    pub(crate) providers: ProviderRegistry,
    pub(crate) notifier: Notifier,
    pub(crate) pipelines: PipelineCache,
    /// Shared watches of waited-on tasks and each app's waiter slots.
    pub(crate) watches: Arc<Watches>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("store", &self.store.backend())
            .field("models", &self.models)
            .field("notifier", &self.notifier)
            .finish_non_exhaustive()
    }
}

impl Inner {
    /// SPEC §3 step 1 for a request: valid for its kind, within the request size limit,
    /// and able to produce an output within the output limit. The one check every
    /// submission (and every pipeline step written in full) goes through.
    pub(crate) fn validate_request(
        &self,
        kind: TaskKind,
        raw: &Value,
    ) -> Result<ValidatedRequest, InvalidInput> {
        let request = ValidatedRequest::new(kind, raw, self.config.max_request_bytes)?;
        check_output_fits(request.request(), self.config.max_output_bytes)?;
        Ok(request)
    }

    /// Notifies about a state change that took effect: the task's app and the runs woken.
    pub(crate) fn publish_transition(&self, transition: &Transition) {
        if !transition.applied {
            return;
        }
        let app = transition.task.as_ref().map(|t| t.app.clone());
        if let Some(task) = &transition.task {
            self.notifier.publish(Event::TaskFinished {
                app: Some(task.app.clone()),
                id: task.id,
                status: Some(task.status),
                task: Some(FinishedTask(Arc::new(task.clone()))),
            });
        }
        for run in &transition.woken_runs {
            self.notifier.publish(Event::RunWoken {
                app: app.clone(),
                id: *run,
            });
        }
    }
}

/// Builds a [`Tollgate`] with a chosen notifier or extra providers.
pub struct TollgateBuilder {
    store: Arc<dyn Store>,
    config: EngineConfig,
    notifier: Option<Notifier>,
    providers: Vec<(String, Arc<dyn Provider>)>,
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
        Ok(Tollgate {
            inner: Arc::new(Inner {
                store: self.store,
                config: self.config,
                models,
                budgets,
                providers,
                notifier,
                pipelines: PipelineCache::default(),
                watches,
            }),
        })
    }
}

/// Tollgate: submit, inspect, wait for and cancel AI tasks; run the workers and the
/// sweeper. Cloning shares one engine.
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
        }
    }

    /// Opens the database and builds the engine: `postgres://…` or `postgresql://…` is
    /// PostgreSQL; `sqlite://path`, `sqlite:path` or a plain path is SQLite (created if
    /// missing). The notifier follows `[notifications] transport`.
    pub async fn open(database_url: &str, config: EngineConfig) -> Result<Tollgate, EngineError> {
        config.validate()?;
        let (store, notifier) = if database_url.starts_with("postgres://")
            || database_url.starts_with("postgresql://")
        {
            open::open_postgres(database_url, &config).await?
        } else {
            open::open_sqlite(database_url, &config).await?
        };
        Tollgate::builder(store, config).notifier(notifier).build()
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

    /// Runs the SPEC §6 sweep now, in rounds until nothing is left, and publishes what
    /// finished. The background sweeper does this every `sweeper.interval`.
    pub async fn sweep_now(&self) -> Result<SweepReport, EngineError> {
        Ok(sweeper::sweep_until_done(&self.inner, None).await?)
    }

    /// Starts this process's workers, sweeper and pipeline driver, and dispatches the
    /// queued tasks found at start (recovery). Returns the handle that shuts them down.
    pub async fn start(&self) -> Result<EngineHandle, EngineError> {
        WorkerPool::start(self.inner.clone()).await
    }
}
