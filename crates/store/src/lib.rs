//! Tollgate's durable store.
//!
//! # Store shape
//!
//! [`Store`] is the one interface the engine holds (`Arc<dyn Store>`): docs/conformance.md#store-rules whole,
//! each operation one short transaction that is never held during inference. It is the
//! sum of small traits, one per concern, and every type that implements them all is
//! a `Store` (blanket impl):
//!
//! | trait | concern | where it is written |
//! | --- | --- | --- |
//! | [`TaskStore`] | the application's side of tasks: create (admission), read, cancel, release, list, owner deletion | `shared/tasks.rs`; each backend's `tasks.rs` (creation in `admission`, owner deletion, its statements) |
//! | [`WorkerStore`] | the worker's side: claim, heartbeat, complete, fail, cancellation | `shared/lifecycle.rs`, `shared/completion.rs` (a batch of completions); each backend's `lifecycle.rs` (its claims, its heartbeat statement, a reservation's locks, its batch's write) |
//! | [`AttemptStore`] | a task's attempts: begin, end, list (docs/routes.md, "Attempts") | `shared/attempts.rs` |
//! | [`EmbeddingStore`] | the embeddings item cache: look up, store (docs/api.md, "Embeddings") | `shared/embeddings.rs` |
//! | [`StreamLogStore`] | the stream log: running tasks' live output for readers on any replica (docs/api.md, "Streaming a task") | `shared/stream_log.rs` |
//! | [`RunStore`] | workflow runs, waits and the cancel cascade | `shared/runs.rs`; each backend's `runs.rs` (its row locks, its cascade) |
//! | [`PipelineStore`] | pipeline definitions, pipeline runs, driver leases | `shared/pipelines.rs`; each backend's `pipelines.rs` (its claim, its keyed start) |
//! | [`MaintenanceStore`] | backend name, ping, sweep, recovery | `shared/maintenance.rs`; each backend's `maintenance.rs` (its statements, its expiry) |
//! | [`PaceStore`] | docs/conformance.md#provider-pace provider pace: call and token schedules, pauses | each backend's `pace.rs` |
//! | [`ListStore`] | docs/conformance.md#listings listings: tasks, runs, pipelines, scopes, stats | `shared/list.rs` (statements and cursors in [`list`]) |
//! | [`WebhookStore`] | docs/webhooks.md: endpoints, the outbox's events, deliveries and their leases | `shared/webhooks.rs` (the outbox is written by the terminal-move plan) |
//!
//! Logic written once runs its statements through `shared::sql` (one text with `$n`
//! placeholders runs on both backends). The composite statements of creation and
//! admission are whole SQL texts (`.sql` files) with `:name` parameters, bound by name
//! from one struct by `shared::named` into the same kind of statement and run the same
//! way; each such statement's unit test checks its text against its binder's names. A
//! backend supplies only what really differs —
//! locks, `SKIP LOCKED`, id sets, admission, the claim — as constants and hooks of a
//! per-concern trait, and states the store trait with one macro line. A wrapper of another store (the bench's
//! counting store) implements [`wrap::StoreWrapper`] and the traits it does not change are
//! forwarded for it by marker traits ([`wrap`]).
//!
//! # One rule, one place
//!
//! Dialect-free code both backends call lives in `shared` (crate-private): row decoding
//! into domain types (named `sqlx::FromRow` structs), the terminal-move plan (capacity
//! given back in lock order, logical keys cleared, runs woken — each backend only supplies
//! the statements, see `shared::terminal::TerminalStatements`), per-scope grouping, the
//! stored form of default usage, and keyset pages ([`keyset_fetch`], [`keyset_page`]).
//! Policy arithmetic (admission, cost) stays in `tollgate-core`. A new rule goes where its
//! kind goes: arithmetic in core; what a state change does in `shared` (cost reservations
//! are settled in the terminal-move plan); cursors and row shapes of a new listing in
//! `shared`; only the SQL that differs in each backend's module of that concern.
//!
//! # Backends
//!
//! Each behind the cargo feature of its name (both on by default): `sqlite::SqliteStore`
//! (embedded, the default) and `postgres::PostgresStore` (scale-out). The suite every
//! backend runs to prove it behaves exactly as docs/conformance.md states it is a crate of its own,
//! `tollgate-conformance` (`crates/conformance`), written against this crate's public API
//! only; normal builds never compile it. What the shared suite cannot express (schema
//! versions, lost-wake repair behind the store's back, index use) is tested beside each
//! backend in this crate's `tests/`.

#![warn(missing_docs)]

mod error;
pub mod list;
#[cfg(feature = "postgres")]
pub mod postgres;
mod shared;
#[cfg(feature = "sqlite")]
pub mod sqlite;
mod types;
pub mod webhooks;
pub mod wrap;

pub use error::StoreError;
pub use list::ListStore;
pub use shared::stream_log::STREAM_LOG_GRACE;
pub use types::*;
pub use webhooks::WebhookStore;

use async_trait::async_trait;
use std::time::Duration;
use tollgate_core::{
    AppId, EffectKey, ErrorCode, Lease, NewRun, NewTask, PipelineName, Reservation, Run, RunId,
    ScopeId, SourceId, Task, TaskId, Timestamp, Usage, WorkerId,
};

/// Result of store calls.
pub type StoreResult<T> = Result<T, StoreError>;

/// The durable store behind Tollgate: every concern's trait at once. Every method is one
/// transaction; none is held while a model is called. Methods that take an [`AppId`] see
/// only that app's rows: another app's row behaves exactly as a missing one. Worker-side
/// methods ([`WorkerStore`]) address tasks by id, since workers serve every app.
pub trait Store:
    TaskStore
    + WorkerStore
    + AttemptStore
    + EmbeddingStore
    + StreamLogStore
    + RunStore
    + PipelineStore
    + MaintenanceStore
    + ListStore
    + PaceStore
    + WebhookStore
    + 'static
{
}

impl<T> Store for T where
    T: TaskStore
        + WorkerStore
        + AttemptStore
        + EmbeddingStore
        + StreamLogStore
        + RunStore
        + PipelineStore
        + MaintenanceStore
        + ListStore
        + PaceStore
        + WebhookStore
        + 'static
{
}

/// The store traits, for callers that use a concrete backend (`use
/// tollgate_store::prelude::*;` brings every method into scope).
pub mod prelude {
    pub use crate::{
        AttemptStore, EmbeddingStore, ListStore, MaintenanceStore, PaceStore, PipelineStore,
        RunStore, Store, StreamLogStore, TaskStore, WebhookStore, WorkerStore,
    };
}

/// The application's side of tasks (docs/conformance.md#create-idempotency, docs/conformance.md#lifecycle cancel, docs/conformance.md#application-tasks): create (idempotency, owner
/// check, cache, admission), read, cancel, release, list and delete an owner's data.
///
/// Where the next rules go: cost reservations are taken in creation (the admission
/// snapshot and its writes) and listing queries are methods here; their dialect-free part
/// (plans, cursors, decoding) lives in the shared module, the SQL in each backend's
/// `tasks.rs` / `admission` module.
#[async_trait]
pub trait TaskStore: Send + Sync {
    /// docs/conformance.md#create-idempotency: validate, idempotency, owner check, cache, admission, insert — one short
    /// transaction. Returns the existing task with `created = false` when the effect key
    /// is taken in the app, whatever its state.
    async fn create_task(&self, new: NewTask) -> StoreResult<Created>;

    /// Creates many tasks (docs/conformance.md#creating-a-task for each, in order), each admitted or refused on its own:
    /// the answer has one result per item, in order. Errors that concern an item
    /// ([`StoreError::is_per_item`]) are reported in its place; a database failure fails
    /// the call. Backends use as few transactions as correctness allows (SQLite: one, with
    /// a savepoint per item); the default runs one `create_task` per item.
    async fn create_tasks(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>> {
        let mut out = Vec::with_capacity(news.len());
        for new in news {
            match self.create_task(new).await {
                Err(e) if !e.is_per_item() => return Err(e),
                result => out.push(result),
            }
        }
        Ok(out)
    }

    /// A task of the app by id.
    async fn get_task(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Task>>;

    /// A task of the app by effect key.
    async fn get_task_by_effect_key(
        &self,
        app: &AppId,
        key: &EffectKey,
    ) -> StoreResult<Option<Task>>;

    /// docs/conformance.md#lifecycle request cancel: marks the task; a queued or running task becomes
    /// `canceled` at once. `None` when the app has no such task.
    async fn request_cancel(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Transition>>;

    /// docs/conformance.md#application-tasks release by (app, scope, effect key) of an application-owned task. Returns
    /// whether a task matched.
    async fn release(&self, app: &AppId, scope: &ScopeId, key: &EffectKey) -> StoreResult<bool>;

    /// docs/conformance.md#application-tasks: distinct (scope, source) pairs that still have unreleased application
    /// tasks, ordered, in keyset pages.
    async fn list_unreleased_sources(
        &self,
        app: &AppId,
        query: &UnreleasedQuery,
    ) -> StoreResult<UnreleasedPage>;

    /// docs/conformance.md#application-tasks: deletes an app's application-owned tasks of a scope (optionally one
    /// source), serialized with task creation; keeps admission records. Returns how many.
    async fn delete_owner_data(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> StoreResult<u64>;

    /// docs/conformance.md#cost-usage: the spend and tokens of one scope of the app (`Some`) or of the whole
    /// app (`None`) in the 24 h window. Reads at most 25 bucket rows per scope (25 × 8
    /// for an app).
    async fn spend(&self, app: &AppId, scope: Option<&ScopeId>) -> StoreResult<SpendWindow>;
}

/// The worker's side of tasks (docs/conformance.md#heartbeat): claim, heartbeat, complete, fail, acknowledge
/// cancellation. Methods address tasks by id, since workers serve every app.
///
/// The lease fence: every write a worker makes about a task it executes names its
/// [`Lease`] (the worker and the claim it got the task by, [`Task::lease`]) and
/// applies only while the task runs under that worker *and* that claim. A stale
/// execution — its task went back to the queue and was claimed again since, by another
/// worker or by the same one — changes nothing.
///
/// Where the next rules go: fair claiming is the order `claim_next` picks in (written
/// once as a shared ordering rule, each backend's `dispatch.rs` turning it into its
/// SQL); settling a cost reservation is part of the terminal-move plan in the shared
/// module, which every move to a terminal state runs.
#[async_trait]
pub trait WorkerStore: Send + Sync {
    /// docs/conformance.md#lifecycle claim: `queued → running` only if neither the task nor its run is canceled.
    /// Returns the claimed task, or `None` when it is not claimable (taken, canceled,
    /// finished, gone).
    async fn claim_task(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<Task>>;

    /// Claims up to `limit` claimable queued tasks in the store's [`ClaimOrder`], skipping
    /// rows other transactions hold. docs/conformance.md#fair-share (the default, [`ClaimOrder::Fair`]): the
    /// (app, scope) queues with the least virtual time share the batch by their weights
    /// (stride scheduling), each queue's tasks by priority then age with ageing
    /// (`tollgate_core::dispatch`). An empty answer does not prove the queue is empty.
    async fn claim_next(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<Task>>;

    /// docs/conformance.md#heartbeat heartbeat for many running tasks of `worker` in one
    /// write, each named with the claim the worker holds it by (`(id, claim)`: the
    /// worker's [`Lease`] on it). Reports which of them the worker should stop
    /// (canceled, cancellation requested, expired, deleted, or not held by this worker
    /// under that claim: a stale execution of a task claimed again is reported to stop
    /// while the current one is kept alive).
    async fn heartbeat(
        &self,
        worker: &WorkerId,
        held: &[(TaskId, u32)],
    ) -> StoreResult<HeartbeatReport>;

    /// docs/conformance.md#lifecycle complete: `running → succeeded` with output and usage, only if not canceled,
    /// held under `lease`, and the output satisfies the kind's contract. A late
    /// completion is refused and changes nothing. The task's open attempt ends
    /// `succeeded` with it, charged `usage` at the prices the task reserved at (a
    /// [`Completion`] can say more).
    async fn complete_task(
        &self,
        id: TaskId,
        lease: &Lease,
        output: serde_json::Value,
        usage: Usage,
    ) -> StoreResult<Transition>;

    /// Several completions, each exactly as [`complete_task`](Self::complete_task) would record it: one
    /// answer per item, in order ([`StoreError::InvalidOutput`] in an item's place when its
    /// output breaks the contract); a database failure fails the call. Each applied
    /// completion ends the task's open attempt `succeeded` in the same transaction,
    /// charged as [`Completion::attempt`] says. Backends use as few transactions as they
    /// can (PostgreSQL: one for the batch; SQLite: one per item). Workers batch the
    /// completions that are ready together, which saves a commit per task under load.
    async fn complete_tasks(
        &self,
        items: Vec<Completion>,
    ) -> StoreResult<Vec<StoreResult<Transition>>>;

    /// docs/conformance.md#lifecycle fail: `queued/running → failed` with a code and a message cut to 2,000
    /// characters; clears the admission logical key. `usage` is what the task's attempts
    /// used (docs/conformance.md#money-and-tokens: tokens spent on a failed task are real money and are recorded
    /// and settled); `None` when unknown (a running task is then charged its whole
    /// reservation). With `lease` (a worker failing the task it executes) only while
    /// the task is running under that lease, as for `complete_task`: a worker whose
    /// lease was lost (its task went back to the queue, or to another worker, or to a
    /// later claim of its own) is refused and changes nothing. Without it, a queued or
    /// running task fails whoever holds it.
    async fn fail_task(
        &self,
        id: TaskId,
        lease: Option<&Lease>,
        code: ErrorCode,
        message: &str,
        usage: Option<&Usage>,
    ) -> StoreResult<Transition>;

    /// docs/budgets.md, "The reservation": reserves one more attempt (a re-ask) of a
    /// running task held under `lease`, before the worker makes it. `attempt` is that
    /// attempt's tokens and nano-dollars (its input counted as sent); it is checked with
    /// the same exactness as admission — under the scope's lock, against the scope's
    /// spend, the scope's token bucket and (under the app's lock) the app's spend, with
    /// the limits the task was admitted under — then added to the task's reservation and
    /// to the spend buckets of its admission hour. A refusal ([`StoreError::Cost`])
    /// changes nothing. `Ok(None)`: the task is not running under `lease` (canceled,
    /// deleted, finished, requeued, claimed again) or has no reservation; nothing changed.
    async fn reserve_attempt(
        &self,
        id: TaskId,
        lease: &Lease,
        attempt: &Reservation,
    ) -> StoreResult<Option<Reservation>>;

    /// A worker acknowledges cancellation: `queued/running → canceled`
    /// (`WORKFLOW_AI_CANCELED`) when cancellation was requested for the task or its run.
    async fn mark_canceled(&self, id: TaskId) -> StoreResult<Transition>;

    /// docs/conformance.md#lifecycle: true if the task or its run is canceled or cancellation was requested,
    /// and true if the task no longer exists.
    async fn is_cancellation_requested(&self, id: TaskId) -> StoreResult<bool>;
}

/// Attempts (docs/routes.md, "Attempts"): a task makes attempts, each one deployment's
/// provider call with its re-asks; the worker begins one before the call and ends it
/// after. At most one attempt of a task is open at a time. Written once for both
/// backends (`shared/attempts.rs`).
#[async_trait]
pub trait AttemptStore: Send + Sync {
    /// Begins the next attempt of a task running under `lease`, on `deployment`, and
    /// returns its number: a later attempt of the same claim (the claim opened its
    /// first, with the claim's number, `Task::attempt`, on the first deployment of
    /// the task's model, holding the admission's reservation when it is the task's
    /// first). A later attempt holds nothing until the worker reserves it
    /// ([`WorkerStore::reserve_attempt`], which adds every reservation of a running
    /// task to its open attempt). `None`: the task is not running under `lease`, an
    /// attempt is open, or it made `max_attempts` already; nothing changed.
    async fn begin_attempt(
        &self,
        id: TaskId,
        lease: &Lease,
        deployment: &str,
    ) -> StoreResult<Option<u32>>;

    /// The open attempt `n` of a task running under `lease` goes to `deployment`
    /// instead of the one recorded (a claim records the first deployment of the task's
    /// model; a route may choose another). `false`: no such open attempt of a task
    /// running under `lease`; nothing changed.
    async fn redirect_attempt(
        &self,
        id: TaskId,
        lease: &Lease,
        n: u32,
        deployment: &str,
    ) -> StoreResult<bool>;

    /// Ends attempt `n`: its outcome, usage and error, and what it is charged
    /// (`tollgate_core::attempt::attempt_charge`: its usage at `end.prices`, or its
    /// reservation when its usage is unknown). `false`: it was ended already (by the
    /// sweep, a cancel, the task's end); nothing changed.
    async fn end_attempt(&self, id: TaskId, n: u32, end: &AttemptEnd) -> StoreResult<bool>;

    /// The attempts of a task of `app`, in order (none for another app's task).
    async fn task_attempts(
        &self,
        app: &AppId,
        id: TaskId,
    ) -> StoreResult<Vec<tollgate_core::Attempt>>;

    /// A worker that stops before its task ends (a graceful shutdown past its deadline)
    /// hands the task back to the queue, as the sweep does for a silent one
    /// (docs/routes.md, "Attempts"): in one transaction its open attempt ends
    /// `interrupted`, charged its reservation (`message` its error), the task becomes
    /// queued with no worker, and its scope's dispatch queue active again. Only while
    /// the task runs under `lease`, its cancellation was not requested and it has tries
    /// left (claimed and attempted fewer times than its `max_attempts`); otherwise
    /// `false`, nothing changed (the worker then fails it).
    async fn requeue_task(&self, id: TaskId, lease: &Lease, message: &str) -> StoreResult<bool>;
}

/// One vector of the embeddings item cache, as an `embed` task computed it.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingEntry {
    /// The item key (`tollgate_core::embed_item_key`).
    pub key: String,
    /// The vector.
    pub vector: Vec<f32>,
    /// The item's input tokens, as counted.
    pub tokens: u64,
}

/// The embeddings item cache (docs/api.md, "Embeddings"): vectors by item key within an
/// app and scope, each entry owned by the task that computed it and deleted with it
/// (retention, owner deletion). Written once for both backends (`shared/embeddings.rs`).
#[async_trait]
pub trait EmbeddingStore: Send + Sync {
    /// The cached vectors of `keys` in `app` and `scope` (keys without an entry are
    /// absent from the map). Never another app's or scope's.
    async fn cached_embeddings(
        &self,
        app: &AppId,
        scope: &ScopeId,
        keys: &[String],
    ) -> StoreResult<std::collections::HashMap<String, Vec<f32>>>;

    /// Stores vectors `task` computed, in the task's app and scope, owned by it; a key
    /// with an entry already keeps it. Nothing is stored when the task no longer exists.
    /// Returns how many entries were stored.
    async fn put_embeddings(&self, task: TaskId, entries: &[EmbeddingEntry]) -> StoreResult<u64>;

    /// How many cache entries a task of `app` owns.
    async fn embeddings_of_task(&self, app: &AppId, task: TaskId) -> StoreResult<u64>;
}

/// Where a chunk sits in a task's stream log: the claim that wrote it (the task's
/// `attempt` at that claim, [`Task::attempt`]) and its number within that claim's
/// chunks, from 0. Positions order chunks: by claim, then number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct StreamPosition {
    /// The claim that wrote it.
    pub claim: u32,
    /// Its number within the claim's chunks.
    pub seq: u32,
}

/// One chunk of a task's stream log: a few pieces of one execution's live output,
/// coalesced (docs/api.md, "Streaming a task").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamChunk {
    /// The task.
    pub task: TaskId,
    /// Its claim and number.
    pub position: StreamPosition,
    /// The pieces, as the engine encodes them (a JSON array; the store keeps the text).
    pub events: String,
    /// The claim's execution ended with the task's output: this is its last chunk.
    pub answered: bool,
}

/// The stream log (docs/api.md, "Streaming a task"): the live output of running tasks,
/// written by the process executing each task a few pieces at a time, read by readers
/// on any replica. A task's chunks go with the task (owner deletion, retention) and are
/// swept [`STREAM_LOG_GRACE`] after it ended (readers of an ended task read its stored
/// output). Written once for both backends (`shared/stream_log.rs`).
#[async_trait]
pub trait StreamLogStore: Send + Sync {
    /// Appends chunks, in one transaction: one answer per chunk, in order — `true` when
    /// written (or written already: appending is idempotent), `false` when its task is
    /// not running under the claim of its position (ended, requeued, deleted), which
    /// writes nothing.
    async fn append_stream_chunks(&self, chunks: &[StreamChunk]) -> StoreResult<Vec<bool>>;

    /// Up to `limit` chunks of a task of `app` at or after `from`, in order (none for
    /// another app's task).
    async fn stream_chunks(
        &self,
        app: &AppId,
        task: TaskId,
        from: StreamPosition,
        limit: u32,
    ) -> StoreResult<Vec<StreamChunk>>;
}

/// Workflow runs (docs/conformance.md#workflow-runs): create, read, cancel with its cascade, wait on a task,
/// finish, and the tasks of a run.
#[async_trait]
pub trait RunStore: Send + Sync {
    /// docs/conformance.md#workflow-runs: creates a run in state `running`.
    async fn create_run(&self, new: NewRun) -> StoreResult<Run>;

    /// A run of the app by id.
    async fn get_run(&self, app: &AppId, id: RunId) -> StoreResult<Option<Run>>;

    /// docs/conformance.md#workflow-runs: cancels the run and its queued and running tasks. `None` when the app
    /// has no such run.
    async fn request_run_cancel(&self, app: &AppId, id: RunId) -> StoreResult<Option<RunCancel>>;

    /// docs/conformance.md#workflow-runs: a run's step waits on a task of the same run. If the task is already
    /// terminal the run stays runnable and the answer says so. Errors:
    /// [`StoreError::RunNotFound`] (no such run in the app), [`StoreError::InvalidState`]
    /// (the run is finished), [`StoreError::TaskNotFound`] (no such task of this run).
    async fn wait_on_task(&self, app: &AppId, run: RunId, task: TaskId)
    -> StoreResult<WaitOutcome>;

    /// Finishes a run with its output or error (its workflow worker's last step).
    async fn finish_run(
        &self,
        app: &AppId,
        run: RunId,
        result: RunResult,
    ) -> StoreResult<Option<Run>>;

    /// Every task of a run of the app (every attempt of every step), oldest first.
    async fn run_tasks(&self, app: &AppId, run: RunId) -> StoreResult<Vec<Task>>;
}

/// Pipelines: versioned definitions, pipeline runs (at most once per start key) and the
/// driver leases that keep one replica driving a run at a time.
#[async_trait]
pub trait PipelineStore: Send + Sync {
    /// Registers a version of a pipeline definition. The same (app, name, version) again
    /// answers the stored one with `false`.
    async fn put_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: &str,
        definition: &serde_json::Value,
    ) -> StoreResult<(StoredPipeline, bool)>;

    /// A pipeline of the app: that version, or the newest when `version` is `None`.
    async fn get_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: Option<&str>,
    ) -> StoreResult<Option<StoredPipeline>>;

    /// Creates a run of a pipeline version (state `running`, due to be driven at once) in
    /// one transaction.
    async fn create_pipeline_run(&self, new: NewRun, pipeline: &PipelineRef) -> StoreResult<Run>;

    /// Like [`create_pipeline_run`](Self::create_pipeline_run), at most once per
    /// (app, `start_key`): the first call creates the run (`true`); every later call with
    /// the key returns that run (`false`) and creates nothing, whatever else it asks (the
    /// caller compares). Keys of different apps never meet.
    async fn start_pipeline_run_once(
        &self,
        new: NewRun,
        pipeline: &PipelineRef,
        start_key: &EffectKey,
    ) -> StoreResult<(Run, bool)>;

    /// The pipeline version a run of the app runs (`None` for plain runs).
    async fn run_pipeline(&self, app: &AppId, run: RunId) -> StoreResult<Option<PipelineRef>>;

    /// Claims up to `limit` pipeline runs to drive: runnable (state `running`), due, and
    /// not held by a live lease. Each is held for `lease`; replicas never hold one run
    /// at once. Skips rows other transactions hold.
    async fn claim_pipeline_runs(
        &self,
        driver: &WorkerId,
        lease: Duration,
        limit: u32,
    ) -> StoreResult<Vec<Run>>;

    /// Gives back a claimed run, due again at `wake_at` (now when `None`). A run that
    /// waits on a task is driven again only once woken. False when `driver` no longer
    /// held it.
    async fn release_pipeline_run(
        &self,
        run: RunId,
        driver: &WorkerId,
        wake_at: Option<Timestamp>,
    ) -> StoreResult<bool>;
}

/// docs/conformance.md#provider-pace provider pace shared by every replica: schedules of calls and tokens per
/// provider (and model), and pauses after a 429. Time is the store's clock (the
/// database's on PostgreSQL), so replicas' own clocks never matter: answers are waits
/// from now.
///
/// Each schedule is one row; a call moves it on by its cost (GCRA without burst), so the
/// calls of all replicas together never exceed the pace. Each call of these methods is
/// one short statement on one or two rows.
#[async_trait]
pub trait PaceStore: Send + Sync {
    /// Takes the next start of a call on every schedule of `slots` at once and says how
    /// long from now the call must wait for it (the latest of the schedules, after any
    /// pause). The start is reserved: a caller that does not call gives it up.
    async fn reserve_pace(&self, slots: &[PaceSlot]) -> StoreResult<Duration>;

    /// Moves a token schedule by `delta_us` once a call's real usage is known (negative:
    /// it used less than its bound). The schedule never moves before now.
    async fn settle_pace(&self, key: &str, delta_us: i64) -> StoreResult<()>;

    /// A 429 with `Retry-After`: no call on this schedule starts before now + `pause`
    /// (an earlier pause is never shortened).
    async fn pause_pace(&self, key: &str, pause: Duration) -> StoreResult<()>;

    /// How long the longest pause of these schedules still lasts (zero: none).
    async fn pace_pause_left(&self, keys: &[String]) -> StoreResult<Duration>;

    /// How long each schedule's pause still lasts (zero: none), in the order of `keys`:
    /// one read for all the deployments of a route (docs/routes.md, cooldowns).
    async fn pace_pauses_left(&self, keys: &[String]) -> StoreResult<Vec<Duration>>;
}

/// The service's own upkeep: which backend, readiness, the background sweep (docs/conformance.md#sweeps) and
/// recovery after a restart (docs/conformance.md#sweep-recovery).
#[async_trait]
pub trait MaintenanceStore: Send + Sync {
    /// Which backend this is (`"sqlite"`, `"postgres"`).
    fn backend(&self) -> &'static str;

    /// Checks that the database answers (for readiness probes).
    async fn ping(&self) -> StoreResult<()>;

    /// docs/conformance.md#sweeps, each one bounded batch. Call again while
    /// [`SweepReport::more`] is true.
    async fn sweep(&self, config: &SweepConfig) -> StoreResult<SweepReport>;

    /// docs/conformance.md#sweep-recovery: the oldest queued task (by creation time, then id), if any: after a
    /// restart, recovery wakes the dispatcher with it, which then claims every queued
    /// task in dispatch order.
    async fn first_queued(&self) -> StoreResult<Option<TaskId>>;

    /// Keeps `value` under `name` unless a value is kept there already, and returns the
    /// kept one: the first writer wins, across replicas and restarts (the development
    /// API key `serve` generates is kept this way).
    async fn keep_setting(&self, name: &str, value: &str) -> StoreResult<String>;
}
