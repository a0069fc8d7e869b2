//! Inputs and answers of [`Store`](crate::Store) calls.

use std::time::Duration;
use tollgate_core::{
    AppId, PipelineName, Run, RunId, ScopeId, SourceId, StepKey, Subject, Task, TaskError, TaskId,
    Timestamp, Usage,
};

/// Largest page any listing returns.
pub const MAX_PAGE: u32 = 100;

/// A page size as every listing reads it: 0 means [`MAX_PAGE`], larger values are capped.
pub fn page_size(requested: u32) -> u32 {
    if requested == 0 {
        MAX_PAGE
    } else {
        requested.min(MAX_PAGE)
    }
}

/// Rows a keyset listing fetches for a page of `limit`: one more, so the page knows
/// whether anything follows it.
pub fn keyset_fetch(limit: u32) -> i64 {
    i64::from(limit) + 1
}

/// A keyset page from the `keyset_fetch(limit)` rows a listing read: at most `limit` rows,
/// and the cursor (the last row shown) only when a further row exists.
pub fn keyset_page<T: Clone>(mut rows: Vec<T>, limit: u32) -> (Vec<T>, Option<T>) {
    let limit = limit as usize;
    if rows.len() > limit {
        rows.truncate(limit);
        let next = rows.last().cloned();
        (rows, next)
    } else {
        (rows, None)
    }
}

/// docs/conformance.md#cost-usage "Usage is visible": a scope's or an app's spend and tokens in the 24 h
/// window, read from the window's hourly buckets (`since` is the start of the oldest
/// bucket counted, so the window read is 24 to 25 hours long: the conservative side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpendWindow {
    /// Start of the oldest bucket counted.
    pub since: tollgate_core::Timestamp,
    /// The store's "now".
    pub now: tollgate_core::Timestamp,
    /// Reserved by tasks not yet settled, nano-dollars.
    pub reserved_nano: i64,
    /// Settled (what ended tasks cost), nano-dollars.
    pub settled_nano: i64,
    /// Model tokens reserved by tasks not yet settled.
    pub reserved_tokens: i64,
    /// Model tokens settled.
    pub settled_tokens: i64,
    /// Settled spend above its reservation (providers reporting more than the bound).
    pub overrun_nano: i64,
    /// What cache hits saved (the cost of the task each copied), nano-dollars.
    pub saved_nano: i64,
    /// The scope's model-token bucket as last stored (scope reports only).
    pub token_bucket: Option<tollgate_core::BucketState>,
    /// Its capacity in bucket units, as of the last admission.
    pub token_capacity_units: Option<i64>,
}

/// Answer of `create_task`.
#[derive(Debug, Clone, PartialEq)]
pub struct Created {
    /// The new or existing task.
    pub task: Task,
    /// False when the effect key already named a task.
    pub created: bool,
    /// docs/conformance.md#cost-cache-hits: what a new cache hit saved, in nano-dollars: the charge of the task it
    /// copied (0 for anything else). The store has added it to the saved spend.
    pub saved_nano: u64,
}

impl Created {
    /// The task the effect key already named.
    pub fn existing(task: Task) -> Created {
        Created {
            task,
            created: false,
            saved_nano: 0,
        }
    }

    /// A task this creation inserted.
    pub fn inserted(task: Task) -> Created {
        Created {
            task,
            created: true,
            saved_nano: 0,
        }
    }

    /// The same answer, recording what a cache hit saved (a negative charge counts 0).
    pub fn saving(self, nano: i64) -> Created {
        Created {
            saved_nano: u64::try_from(nano).unwrap_or(0),
            ..self
        }
    }
}

/// Answer of a state change.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Transition {
    /// Whether the change took effect. A refused change wrote nothing.
    pub applied: bool,
    /// The task as it is now (`None` when it no longer exists).
    pub task: Option<Task>,
    /// Runs woken because the task became terminal (notify their workflow workers).
    pub woken_runs: Vec<RunId>,
}

/// One item of [`WorkerStore::complete_tasks`](crate::WorkerStore::complete_tasks): what
/// `complete_task` takes.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The running task.
    pub id: TaskId,
    /// The lease the worker holds it by: the completion applies only while the task
    /// runs under it (an execution whose task was requeued and claimed again — by the
    /// same worker, too — completes nothing).
    pub lease: tollgate_core::Lease,
    /// The model's output.
    pub output: serde_json::Value,
    /// Tokens used.
    pub usage: Usage,
    /// The task as the worker claimed it, when it has it. A task's request, owner and
    /// reservation never change after its creation, so the store checks the output
    /// against this copy instead of reading the row first (the write itself stays
    /// conditional on the task still running under `lease`). `None`, or a copy of
    /// another task: the store reads the row.
    pub claimed: Option<std::sync::Arc<Task>>,
    /// The attempt that produced the output (docs/routes.md, "Attempts"): it ends
    /// `succeeded` with the completion, in its transaction. `None`: it used `usage` at the
    /// prices the task reserved at.
    pub attempt: Option<AttemptUsage>,
}

/// What the attempt that produced a completion's output used: its own calls' usage (a
/// task's usage sums every attempt of its execution) and its deployment's prices.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttemptUsage {
    /// Tokens its calls used.
    pub usage: Usage,
    /// Its deployment's prices (`None`: unpriced, its cost is unknown).
    pub prices: Option<tollgate_core::Prices>,
}

/// Answer of `heartbeat`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HeartbeatReport {
    /// Tasks still running under this worker by the claim named, as `(id, claim)`; their
    /// liveness was extended.
    pub alive: Vec<(TaskId, u32)>,
    /// Tasks the worker must stop, as `(id, claim)`: canceled, cancellation requested,
    /// expired, deleted or not held by this worker under that claim.
    pub stop: Vec<(TaskId, u32)>,
}

/// A (scope, source) pair with unreleased application tasks.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ScopedSource {
    /// The scope.
    pub scope: ScopeId,
    /// The source.
    pub source: SourceId,
}

/// Query of `list_unreleased_sources`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnreleasedQuery {
    /// Only this scope.
    pub scope: Option<ScopeId>,
    /// Only tasks of this step key.
    pub step: Option<StepKey>,
    /// Keyset cursor: the last pair of the previous page.
    pub after: Option<ScopedSource>,
    /// Page size (capped at [`MAX_PAGE`]; 0 means [`MAX_PAGE`]).
    pub limit: u32,
    /// Only pairs with tasks done for this subject (a caller bound to a subject sees only
    /// its own tasks).
    pub subject: Option<Subject>,
}

/// A page of `list_unreleased_sources`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct UnreleasedPage {
    /// Pairs in (scope, source) order.
    pub sources: Vec<ScopedSource>,
    /// Cursor for the next page; `None` on the last page.
    pub next: Option<ScopedSource>,
}

/// Timeouts and batch size of a sweep (docs/conformance.md#sweeps; configuration, not constants).
#[derive(Debug, Clone, PartialEq)]
pub struct SweepConfig {
    /// Queued longer than this fails with `WORKFLOW_AI_QUEUE_TIMEOUT`.
    pub queue_timeout: Duration,
    /// Running without a heartbeat this long fails with `WORKFLOW_AI_INTERRUPTED`.
    pub liveness_timeout: Duration,
    /// Released terminal application tasks are deleted this long after release and
    /// completion; webhook events this long after their deliveries all ended
    /// (docs/webhooks.md, "Retention and deletion").
    pub retention: Duration,
    /// Rows per item per sweep.
    pub batch_size: u32,
}

impl Default for SweepConfig {
    fn default() -> Self {
        SweepConfig {
            queue_timeout: Duration::from_secs(3600),
            liveness_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            batch_size: 100,
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SweepReport {
    /// Item 1: queued tasks failed with `WORKFLOW_AI_QUEUE_TIMEOUT`.
    pub queue_timed_out: u64,
    /// Item 2: running tasks failed with `WORKFLOW_AI_INTERRUPTED`.
    pub interrupted: u64,
    /// Item 3: tasks canceled instead because cancellation was requested.
    pub canceled: u64,
    /// Item 4: waiting runs woken again because their task was already terminal.
    pub runs_repaired: u64,
    /// Item 5: admission records older than 24 h deleted.
    pub admissions_pruned: u64,
    /// Item 6: released terminal application tasks deleted.
    pub tasks_deleted: u64,
    /// Item 7: webhook events (with their deliveries) deleted after the retention.
    pub webhook_events_deleted: u64,
    /// Item 6c: stream log chunks of tasks that ended [`STREAM_LOG_GRACE`](crate::STREAM_LOG_GRACE)
    /// ago or more, deleted (docs/api.md, "Streaming a task").
    pub stream_chunks_deleted: u64,
    /// Item 2 for tasks with tries left (docs/routes.md, "Attempts"): running tasks put
    /// back in the queue for their next attempt (notify the workers).
    pub requeued: Vec<(AppId, TaskId)>,
    /// Tasks this sweep moved to a terminal state (notify their apps' workers).
    pub finished: Vec<TaskId>,
    /// Runs woken (notify their workflow workers).
    pub woken_runs: Vec<RunId>,
    /// Some item filled its batch: sweep again.
    pub more: bool,
}

/// Answer of `request_run_cancel`.
#[derive(Debug, Clone, PartialEq)]
pub struct RunCancel {
    /// The run as it is now.
    pub run: Run,
    /// Its tasks that were queued or running and are now canceled.
    pub canceled_tasks: Vec<TaskId>,
}

/// Answer of `wait_on_task`.
#[derive(Debug, Clone, PartialEq)]
pub enum WaitOutcome {
    /// The run now waits; it is woken when the task becomes terminal.
    Waiting(Box<Run>),
    /// The task is already terminal: the run stays runnable and may read it now.
    Ready(Box<Task>),
}

/// How a run ends.
#[derive(Debug, Clone, PartialEq)]
pub enum RunResult {
    /// With an output.
    Succeeded(serde_json::Value),
    /// With an error.
    Failed(TaskError),
}

/// A registered pipeline definition (one version of a name).
#[derive(Debug, Clone, PartialEq)]
pub struct StoredPipeline {
    /// Owning app.
    pub app: AppId,
    /// The pipeline's name.
    pub name: PipelineName,
    /// Content hash of the definition.
    pub version: String,
    /// The definition.
    pub definition: serde_json::Value,
    /// When this version was registered.
    pub created_at: Timestamp,
}

/// Which pipeline version a run runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PipelineRef {
    /// The pipeline's name.
    pub name: PipelineName,
    /// The version (content hash).
    pub version: String,
}

/// The order [`WorkerStore::claim_next`](crate::WorkerStore::claim_next) claims in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimOrder {
    /// docs/conformance.md#fair-share (the default): round-robin across (app, scope) queues weighted by their
    /// policy's weight (stride scheduling), and within a queue priority then age with
    /// ageing (`tollgate_core::dispatch`).
    #[default]
    Fair,
    /// Oldest first across everything, priority ignored: the order before docs/conformance.md#priority, kept
    /// for comparison (`tollgate bench`) and as an escape hatch.
    Oldest,
}

/// Most queues one fair claim reads (docs/conformance.md#fair-share): the queues with the least virtual time.
pub const MAX_CLAIM_QUEUES: u32 = 64;

/// One schedule a provider call takes a start from (docs/conformance.md#provider-pace provider pace): a provider's,
/// or one model's of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaceSlot {
    /// The schedule's name (`provider` or `provider/model`).
    pub key: String,
    /// How far one call moves the request schedule, in microseconds (0: no request pace).
    pub request_cost_us: i64,
    /// How far this call's token bound moves the token schedule, in microseconds (0: no
    /// token pace).
    pub token_cost_us: i64,
}

/// How an attempt ended, as a worker records it
/// ([`AttemptStore::end_attempt`](crate::AttemptStore::end_attempt)).
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptEnd {
    /// How it ended.
    pub outcome: tollgate_core::AttemptOutcome,
    /// What its calls used, when the provider reported it (`None`: it is charged its
    /// reservation).
    pub usage: Option<tollgate_core::Usage>,
    /// Its deployment's prices (`None`: unpriced, its cost is unknown).
    pub prices: Option<tollgate_core::Prices>,
    /// Its error, when it did not succeed.
    pub error: Option<tollgate_core::TaskError>,
}
