//! The [`Tollgate`] facade: everything an HTTP server, a CLI or an embedding Rust program
//! calls. Each operation validates, calls the store (one short transaction, never held
//! during inference) and publishes notifications after the commit.

use crate::config::{EngineConfig, TransportKind};
use crate::error::EngineError;
use crate::metrics as m;
use crate::notify::{Event, Notifier};
use crate::pipelines::PipelineCache;
use crate::provider::{Provider, ProviderRegistry};
use crate::registry::{BudgetPolicies, ModelRegistry};
use crate::sweeper;
use crate::worker::{EngineHandle, WorkerPool};
use futures::StreamExt;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tollgate_core::{
    AppId, BudgetName, EffectKey, InvalidInput, ModelId, NewRun, NewTask, Owner, Run, RunId,
    ScopeId, SourceId, SourceRevision, StepKey, Subject, Task, TaskId, TaskKind, TaskScope,
    TaskStatus, ValidatedRequest,
};
#[cfg(feature = "postgres")]
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
#[cfg(feature = "sqlite")]
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};
use tollgate_store::{
    Created, RunCancel, RunResult, Store, StoreError, SweepReport, Transition, UnreleasedPage,
    UnreleasedQuery, WaitOutcome,
};

/// Most submissions one [`Tollgate::submit_many`] call accepts.
pub const MAX_BATCH: usize = 1000;
/// Submissions of one batch in flight at once.
const BATCH_PARALLELISM: usize = 8;

/// Who a submitted task belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SubmissionOwner {
    /// A workflow run of the app: the run's scope and subject apply.
    Run(RunId),
    /// The application itself, in a scope.
    Application {
        /// The scope inside the app.
        scope: ScopeId,
    },
}

/// The source a scoped task is about: cache and admission apply (SPEC §3–4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceSpec {
    /// The source's id.
    pub id: SourceId,
    /// The source's revision: a new revision is new work.
    pub revision: SourceRevision,
    /// Skip the cache and count as a new step.
    pub recompute: bool,
}

/// One task to submit.
#[derive(Debug, Clone, PartialEq)]
pub struct Submission {
    /// The caller's app (from authentication).
    pub app: AppId,
    /// Run or application owner.
    pub owner: SubmissionOwner,
    /// The authenticated subject of an application-owned task (from authentication,
    /// never from a request body). Run-owned tasks use the run's subject; this is ignored.
    pub subject: Option<Subject>,
    /// The caller's name for the step (default: the kind's name).
    pub step: Option<StepKey>,
    /// The caller's idempotency key.
    pub effect_key: EffectKey,
    /// The task's kind.
    pub kind: TaskKind,
    /// The request object of the kind (without `kind`).
    pub request: Value,
    /// The model id (default: the configured `default_model`).
    pub model: Option<ModelId>,
    /// Present for scoped tasks.
    pub source: Option<SourceSpec>,
    /// A budget policy the app may use (default: the app's default policy).
    pub budget: Option<BudgetName>,
}

impl Submission {
    /// An application-owned task with defaults for everything optional.
    pub fn application(
        app: AppId,
        scope: ScopeId,
        effect_key: EffectKey,
        kind: TaskKind,
        request: Value,
    ) -> Submission {
        Submission {
            app,
            owner: SubmissionOwner::Application { scope },
            subject: None,
            step: None,
            effect_key,
            kind,
            request,
            model: None,
            source: None,
            budget: None,
        }
    }

    /// A run-owned task with defaults for everything optional.
    pub fn for_run(
        app: AppId,
        run: RunId,
        effect_key: EffectKey,
        kind: TaskKind,
        request: Value,
    ) -> Submission {
        Submission {
            app,
            owner: SubmissionOwner::Run(run),
            subject: None,
            step: None,
            effect_key,
            kind,
            request,
            model: None,
            source: None,
            budget: None,
        }
    }

    /// Makes the task scoped: about `source` at `revision`.
    pub fn with_source(mut self, id: SourceId, revision: SourceRevision) -> Submission {
        self.source = Some(SourceSpec {
            id,
            revision,
            recompute: false,
        });
        self
    }

    /// Asks for a model id.
    pub fn with_model(mut self, model: ModelId) -> Submission {
        self.model = Some(model);
        self
    }

    /// Names the step.
    pub fn with_step(mut self, step: StepKey) -> Submission {
        self.step = Some(step);
        self
    }

    /// Names a budget policy.
    pub fn with_budget(mut self, budget: BudgetName) -> Submission {
        self.budget = Some(budget);
        self
    }

    /// Sets the authenticated subject.
    pub fn with_subject(mut self, subject: Subject) -> Submission {
        self.subject = Some(subject);
        self
    }
}

/// The answer of a submission.
#[derive(Debug, Clone, PartialEq)]
pub struct Submitted {
    /// The new or existing task.
    pub task: Task,
    /// False when the effect key already named a task in the app.
    pub created: bool,
}

/// What the engine shares between the facade, the workers and the sweeper.
pub(crate) struct Inner {
    pub(crate) store: Arc<dyn Store>,
    pub(crate) config: EngineConfig,
    pub(crate) models: ModelRegistry,
    pub(crate) budgets: BudgetPolicies,
    pub(crate) providers: ProviderRegistry,
    pub(crate) notifier: Notifier,
    pub(crate) pipelines: PipelineCache,
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
        let mut providers = ProviderRegistry::from_config(&self.config)?;
        for (name, provider) in self.providers {
            providers.insert(name, provider);
        }
        Ok(Tollgate {
            inner: Arc::new(Inner {
                store: self.store,
                config: self.config,
                models,
                budgets,
                providers,
                notifier: self.notifier.unwrap_or_else(Notifier::local),
                pipelines: PipelineCache::default(),
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
            open_postgres(database_url, &config).await?
        } else {
            open_sqlite(database_url, &config).await?
        };
        Tollgate::builder(store, config).notifier(notifier).build()
    }

    /// The store underneath.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.inner.store
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

    /// SPEC §3: resolves the model and budget, validates the request, creates the task
    /// (idempotent per effect key; served from the cache when possible; admitted under
    /// the budget when scoped) and tells the workers. A rejection wrote nothing.
    pub async fn submit(&self, submission: Submission) -> Result<Submitted, EngineError> {
        let kind = submission.kind;
        let result = match self.prepare(submission) {
            Ok(prepared) => {
                let scoped = prepared.scope.is_some();
                let created = self.inner.store.create_task(prepared).await;
                self.created(kind, scoped, created)
            }
            Err(e) => Err(e),
        };
        count_submit(kind, &result);
        result
    }

    /// SPEC §3 step 1 and the configuration: model, budget policy, request, owner.
    fn prepare(&self, s: Submission) -> Result<NewTask, EngineError> {
        let inner = &self.inner;
        let model = inner.models.resolve(s.model.as_ref())?;
        let (_, budget) = inner.budgets.resolve(&s.app, s.budget.as_ref())?;
        let request = ValidatedRequest::new(s.kind, &s.request, inner.config.max_request_bytes)?;
        let step = match s.step {
            Some(step) => step,
            None => StepKey::new(s.kind.as_str())?,
        };
        let owner = match s.owner {
            SubmissionOwner::Run(run_id) => Owner::Run {
                app: s.app.clone(),
                run_id,
            },
            SubmissionOwner::Application { scope } => Owner::Application {
                app: s.app.clone(),
                scope,
                subject: s.subject,
            },
        };
        Ok(NewTask {
            owner,
            step,
            effect_key: s.effect_key,
            request,
            model: model.id.clone(),
            model_ref: model.model_ref.clone(),
            scope: s.source.map(|source| TaskScope {
                source_id: source.id,
                source_revision: source.revision,
                recompute: source.recompute,
                budget,
            }),
        })
    }

    /// What the store answered for one item: metrics, and the workers told (after the
    /// commit) about a new queued task.
    fn created(
        &self,
        kind: TaskKind,
        scoped: bool,
        answer: Result<Created, StoreError>,
    ) -> Result<Submitted, EngineError> {
        let created = match answer {
            Ok(c) => c,
            Err(StoreError::Admission(rejection)) => {
                metrics::counter!(m::ADMISSIONS_TOTAL, "outcome" => rejection.code().as_str())
                    .increment(1);
                return Err(StoreError::Admission(rejection).into());
            }
            Err(e) => return Err(e.into()),
        };
        let task = created.task;
        if created.created {
            if task.cached() {
                metrics::counter!(m::CACHE_HITS_TOTAL, "kind" => kind.as_str()).increment(1);
            } else if scoped {
                metrics::counter!(m::ADMISSIONS_TOTAL, "outcome" => "admitted").increment(1);
            }
            if task.status == TaskStatus::Queued {
                self.inner.notifier.publish(Event::TaskQueued {
                    app: task.app.clone(),
                    id: task.id,
                });
            }
        }
        Ok(Submitted {
            task,
            created: created.created,
        })
    }

    /// Submits up to [`MAX_BATCH`] tasks. Each is admitted or rejected on its own; the
    /// answers come in the order of the submissions. Items are grouped by owner (a scope,
    /// or a run): each group goes to the store's batch creation in order (SQLite: one
    /// transaction per group), so earlier items take a scope's budget first; groups run
    /// concurrently (bounded). A repeated effect key within the batch is submitted after
    /// its first occurrence, so the first one is the one that creates.
    pub async fn submit_many(
        &self,
        submissions: Vec<Submission>,
    ) -> Result<Vec<Result<Submitted, EngineError>>, EngineError> {
        if submissions.len() > MAX_BATCH {
            return Err(InvalidInput::field(
                "tasks",
                format!(
                    "a batch holds at most {MAX_BATCH} tasks, got {}",
                    submissions.len()
                ),
            )
            .into());
        }
        let total = submissions.len();
        let mut results: Vec<Option<Result<Submitted, EngineError>>> =
            (0..total).map(|_| None).collect();
        let mut seen = HashSet::new();
        let mut groups: Vec<Vec<(usize, TaskKind, NewTask)>> = Vec::new();
        let mut group_of: HashMap<(AppId, String), usize> = HashMap::new();
        let mut repeated = Vec::new();
        for (i, s) in submissions.into_iter().enumerate() {
            if !seen.insert((s.app.clone(), s.effect_key.clone())) {
                repeated.push((i, s));
                continue;
            }
            let kind = s.kind;
            let owner = match &s.owner {
                SubmissionOwner::Run(run) => format!("run:{run}"),
                SubmissionOwner::Application { scope } => format!("scope:{scope}"),
            };
            let app = s.app.clone();
            match self.prepare(s) {
                Ok(new) => {
                    let next = groups.len();
                    let g = *group_of.entry((app, owner)).or_insert(next);
                    if g == next {
                        groups.push(Vec::new());
                    }
                    groups[g].push((i, kind, new));
                }
                Err(e) => {
                    let result = Err(e);
                    count_submit(kind, &result);
                    results[i] = Some(result);
                }
            }
        }
        let answered: Vec<Vec<(usize, Result<Submitted, EngineError>)>> =
            futures::stream::iter(groups)
                .map(|group| self.create_group(group))
                .buffer_unordered(BATCH_PARALLELISM)
                .collect()
                .await;
        for (i, answer) in answered.into_iter().flatten() {
            results[i] = Some(answer);
        }
        for (i, s) in repeated {
            results[i] = Some(self.submit(s).await);
        }
        Ok(results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| {
                    Err(
                        InvalidInput::field("tasks", "internal error: an item got no answer")
                            .into(),
                    )
                })
            })
            .collect())
    }

    /// One owner's items through the store's batch creation, in order.
    async fn create_group(
        &self,
        group: Vec<(usize, TaskKind, NewTask)>,
    ) -> Vec<(usize, Result<Submitted, EngineError>)> {
        let meta: Vec<(usize, TaskKind, bool)> = group
            .iter()
            .map(|(i, kind, new)| (*i, *kind, new.scope.is_some()))
            .collect();
        let news: Vec<NewTask> = group.into_iter().map(|(_, _, new)| new).collect();
        match self.inner.store.create_tasks(news).await {
            Ok(answers) => meta
                .into_iter()
                .zip(answers)
                .map(|((i, kind, scoped), answer)| {
                    let result = self.created(kind, scoped, answer);
                    count_submit(kind, &result);
                    (i, result)
                })
                .collect(),
            // The database failed the whole call: every item of the group reports it.
            Err(e) => meta
                .into_iter()
                .map(|(i, kind, _)| {
                    let result = Err(EngineError::Store(copy_store_error(&e)));
                    count_submit(kind, &result);
                    (i, result)
                })
                .collect(),
        }
    }

    /// A task of the app by id (`None`: no such task in this app).
    pub async fn get(&self, app: &AppId, id: TaskId) -> Result<Option<Task>, EngineError> {
        Ok(self.inner.store.get_task(app, id).await?)
    }

    /// A task of the app by effect key.
    pub async fn get_by_effect_key(
        &self,
        app: &AppId,
        key: &EffectKey,
    ) -> Result<Option<Task>, EngineError> {
        Ok(self.inner.store.get_task_by_effect_key(app, key).await?)
    }

    /// Waits until the task is terminal or `timeout` passes, and returns it as it is then
    /// (`None`: no such task, or it was deleted). Woken by notifications; looks at the
    /// database at least every `notifications.poll_interval` whatever happens, so a lost
    /// notification costs latency only.
    pub async fn wait(
        &self,
        app: &AppId,
        id: TaskId,
        timeout: Duration,
    ) -> Result<Option<Task>, EngineError> {
        // Subscribe before the first read, so a finish between the read and the wait
        // is not missed.
        let mut events = self.inner.notifier.subscribe();
        let deadline = Instant::now() + timeout;
        let poll = self.inner.config.notifications.poll_interval;
        loop {
            let Some(task) = self.inner.store.get_task(app, id).await? else {
                return Ok(None);
            };
            let now = Instant::now();
            if task.status.is_terminal() || now >= deadline {
                return Ok(Some(task));
            }
            let nap = tokio::time::sleep((deadline - now).min(poll));
            tokio::pin!(nap);
            loop {
                tokio::select! {
                    _ = &mut nap => break,
                    event = events.recv() => match event {
                        Ok(Event::TaskFinished { id: finished, .. }) if finished == id => break,
                        Ok(_) => {}
                        Err(RecvError::Lagged(_)) => break,
                        Err(RecvError::Closed) => {
                            (&mut nap).await;
                            break;
                        }
                    },
                }
            }
        }
    }

    /// SPEC §5 request cancel: a queued or running task becomes `canceled` at once and
    /// its worker stops the provider call within one heartbeat interval (at once when
    /// the worker is in this process or hears the notification). A terminal task is
    /// returned unchanged. `None`: no such task in this app.
    pub async fn cancel(&self, app: &AppId, id: TaskId) -> Result<Option<Task>, EngineError> {
        let Some(transition) = self.inner.store.request_cancel(app, id).await? else {
            return Ok(None);
        };
        self.inner.publish_transition(&transition);
        Ok(transition.task)
    }

    /// SPEC §8 release: the application stored or discarded the result of the
    /// application-owned task with this effect key. Returns whether a task matched.
    pub async fn release(
        &self,
        app: &AppId,
        scope: &ScopeId,
        key: &EffectKey,
    ) -> Result<bool, EngineError> {
        Ok(self.inner.store.release(app, scope, key).await?)
    }

    /// SPEC §8: distinct (scope, source) pairs with unreleased application tasks, in
    /// keyset pages of at most 100.
    pub async fn list_unreleased_sources(
        &self,
        app: &AppId,
        query: &UnreleasedQuery,
    ) -> Result<UnreleasedPage, EngineError> {
        Ok(self.inner.store.list_unreleased_sources(app, query).await?)
    }

    /// SPEC §8: deletes the app's application-owned tasks of a scope (optionally of one
    /// source) and returns how many. In-flight ones stop: their workers' next heartbeat
    /// reports them gone. Admission records are kept.
    pub async fn delete_owner_data(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> Result<u64, EngineError> {
        Ok(self
            .inner
            .store
            .delete_owner_data(app, scope, source)
            .await?)
    }

    /// SPEC §7: creates a workflow run.
    pub async fn create_run(&self, new: NewRun) -> Result<Run, EngineError> {
        Ok(self.inner.store.create_run(new).await?)
    }

    /// A run of the app by id.
    pub async fn get_run(&self, app: &AppId, id: RunId) -> Result<Option<Run>, EngineError> {
        Ok(self.inner.store.get_run(app, id).await?)
    }

    /// SPEC §7: cancels the run and its queued and running tasks (their workers stop).
    pub async fn cancel_run(
        &self,
        app: &AppId,
        id: RunId,
    ) -> Result<Option<RunCancel>, EngineError> {
        let answer = self.inner.store.request_run_cancel(app, id).await?;
        if let Some(cancel) = &answer {
            for task in &cancel.canceled_tasks {
                self.inner.notifier.publish(Event::TaskFinished {
                    app: Some(app.clone()),
                    id: *task,
                    status: Some(TaskStatus::Canceled),
                });
            }
        }
        Ok(answer)
    }

    /// SPEC §7: the run's step waits on one of its tasks; it is woken (and a
    /// [`Event::RunWoken`] published) when the task becomes terminal.
    pub async fn wait_on_task(
        &self,
        app: &AppId,
        run: RunId,
        task: TaskId,
    ) -> Result<WaitOutcome, EngineError> {
        Ok(self.inner.store.wait_on_task(app, run, task).await?)
    }

    /// Finishes a run with its output or error.
    pub async fn finish_run(
        &self,
        app: &AppId,
        run: RunId,
        result: RunResult,
    ) -> Result<Option<Run>, EngineError> {
        Ok(self.inner.store.finish_run(app, run, result).await?)
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

/// Counts one submission by kind and outcome.
fn count_submit(kind: TaskKind, result: &Result<Submitted, EngineError>) {
    let outcome = match result {
        Ok(s) if !s.created => "existing",
        Ok(s) if s.task.cached() => "cached",
        Ok(_) => "created",
        Err(EngineError::Store(StoreError::Admission(_))) => "rejected",
        Err(_) => "invalid",
    };
    metrics::counter!(m::SUBMITS_TOTAL, "kind" => kind.as_str(), "outcome" => outcome).increment(1);
}

/// The same failure for another item (store errors are not `Clone`).
fn copy_store_error(e: &StoreError) -> StoreError {
    match e {
        StoreError::Unavailable(m) => StoreError::Unavailable(m.clone()),
        other => StoreError::Database(other.to_string()),
    }
}

/// A store and its notifier, as [`Tollgate::open`] builds them.
type Opened = (Arc<dyn Store>, Notifier);

/// The PostgreSQL database at `database_url`, with the configured notifier (which may be
/// the database's own `LISTEN/NOTIFY`).
#[cfg(feature = "postgres")]
async fn open_postgres(database_url: &str, config: &EngineConfig) -> Result<Opened, EngineError> {
    let store = PostgresStore::open(PostgresOptions::new(database_url)).await?;
    let notifier = match config.notifications.transport {
        TransportKind::Postgres => Notifier::postgres(&store).await?,
        _ => notifier_for(config).await?,
    };
    Ok((Arc::new(store), notifier))
}

/// A build without the `postgres` feature cannot open PostgreSQL.
#[cfg(not(feature = "postgres"))]
async fn open_postgres(_database_url: &str, _config: &EngineConfig) -> Result<Opened, EngineError> {
    Err(InvalidInput::field(
        "database_url",
        "is PostgreSQL, but this build has no PostgreSQL backend (cargo feature `postgres`)",
    )
    .into())
}

/// The SQLite file `database_url` names (`sqlite://path`, `sqlite:path` or a plain path),
/// created if missing, with the configured notifier.
async fn open_sqlite(database_url: &str, config: &EngineConfig) -> Result<Opened, EngineError> {
    if config.notifications.transport == TransportKind::Postgres {
        return Err(crate::config::ConfigError::at(
            "notifications.transport",
            "`postgres` needs a PostgreSQL database",
        )
        .into());
    }
    let path = database_url
        .strip_prefix("sqlite://")
        .or_else(|| database_url.strip_prefix("sqlite:"))
        .unwrap_or(database_url);
    if path.is_empty() {
        return Err(InvalidInput::field("database_url", "names no file").into());
    }
    #[cfg(feature = "sqlite")]
    {
        let store = SqliteStore::open(SqliteOptions::new(path)).await?;
        Ok((Arc::new(store), notifier_for(config).await?))
    }
    #[cfg(not(feature = "sqlite"))]
    {
        Err(InvalidInput::field(
            "database_url",
            "is SQLite, but this build has no SQLite backend (cargo feature `sqlite`)",
        )
        .into())
    }
}

async fn notifier_for(config: &EngineConfig) -> Result<Notifier, EngineError> {
    match config.notifications.transport {
        TransportKind::Local => Ok(Notifier::local()),
        TransportKind::Nats => {
            Notifier::nats(
                &config.notifications.nats_url,
                &config.notifications.subject_prefix,
            )
            .await
        }
        TransportKind::Postgres => Err(crate::config::ConfigError::at(
            "notifications.transport",
            "`postgres` needs a PostgreSQL database",
        )
        .into()),
    }
}
