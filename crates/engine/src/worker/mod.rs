//! The worker pool: claims tasks, runs them on their providers, validates, completes.
//!
//! - **Claiming.** A dispatcher claims a lone hinted task by id (`claim_task`, hints come
//!   from notifications and start-up recovery) and otherwise claims in batches with
//!   `claim_next`, oldest first (several hints at once are served that way too, one
//!   transaction for many tasks), never more than the free execution slots
//!   (`workers.concurrency`). An empty claim
//!   does not prove the queue is empty (`SKIP LOCKED`), so idle workers poll again every
//!   `notifications.poll_interval`. The store's claim is conditional, so a task is
//!   executed by at most one worker at a time, across every replica.
//! - **Leases.** A claimed task is held under its lease (this worker and the claim's
//!   number, `Task::attempt`), and every write about it names the lease: a stale
//!   execution, whose task went back to the queue and was claimed again (by this worker
//!   too), changes nothing. Held executions are keyed by `(id, claim)`, so a stale
//!   execution's end never unholds the current one.
//! - **Heartbeats.** Every `workers.heartbeat_interval` the pool sends ONE heartbeat for
//!   all the tasks it holds. Tasks the store reports to stop (canceled, expired, deleted,
//!   not ours) have their execution dropped at once, which drops the in-flight provider
//!   call (the HTTP connection closes). A notification that a held task finished does
//!   the same without waiting for the next heartbeat.
//! - **Validation.** Every output goes through `tollgate_core::validate_output`. An
//!   invalid one is sent back to the provider with the validation error, at most
//!   `workers.max_output_retries` times; then the task fails with
//!   `invalid_model_output`. A provider failure fails it with `provider_error`.
//! - **Panics.** A panic in an execution is caught and fails its task at once with
//!   `WORKFLOW_AI_INTERRUPTED`; a task is held (and heartbeated) only while its execution
//!   exists, so one whose execution is gone otherwise is ended by the sweeper.
//! - **Completion.** `complete_task` is refused for a task that was canceled or expired
//!   meanwhile; that is fine and changes nothing. Completions that are ready together are
//!   recorded together (`complete_tasks`, group commit; see [`CompletionBatcher`]).
//! - **Shutdown.** Claiming stops at once; executions in flight get until the deadline;
//!   those still running then are failed with `WORKFLOW_AI_INTERRUPTED` (tasks never run
//!   twice), and queued tasks stay queued for any replica.
//!
//! Split by what the parts do: `dispatch` (claiming), `execute` (one execution: the
//! route's deployments tried in turn), `calls` (one deployment's calls, re-asks, usage
//! and cooldowns), `embed` (an `embed` task's item cache and grouped calls), `complete` (recording the end), `heartbeat` (heartbeats
//! and the event listener), `handle` (shutdown); this module starts them.

mod attempts;
mod calls;
mod complete;
mod dispatch;
mod embed;
mod execute;
mod handle;
mod heartbeat;

pub(crate) use dispatch::DirectSlot;

pub(crate) use embed::vectors_json;
pub use handle::{EngineHandle, ShutdownReport};

use crate::driver::Driver;
use crate::error::EngineError;
use crate::facade::Tollgate;
use crate::inner::Inner;
use crate::metrics as m;
use crate::sweeper;
use complete::CompletionBatcher;
use dispatch::HINT_CAPACITY;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_core::{Lease, Task, TaskId, WorkerId};

/// Attempts to record a completion while the database is unavailable.
/// Most completions recorded in one store call (one transaction on PostgreSQL).
const MAX_COMPLETION_BATCH: usize = 64;

/// The cancellation tokens that stop the pool's parts, in shutdown order.
#[derive(Debug, Clone, Default)]
struct Control {
    /// The dispatcher and recovery stop claiming.
    stop_claiming: CancellationToken,
    /// Executions still running are dropped and recorded as interrupted.
    interrupt: CancellationToken,
    /// Heartbeats, the event listener and the sweeper stop.
    stop_background: CancellationToken,
    /// Everything stops at once without recording anything (a simulated crash).
    crash: CancellationToken,
}

/// A held execution: the task and the claim this pool holds it by (two executions of
/// one task — a stale one and the current one, after a requeue — are two entries).
type HeldKey = (TaskId, u32);

/// Ends a task's holding by this pool when dropped, also by a panic's unwinding: the
/// heartbeat covers only tasks whose execution is alive.
struct HeldUntilDropped {
    pool: Arc<WorkerPool>,
    key: HeldKey,
}

impl Drop for HeldUntilDropped {
    fn drop(&mut self) {
        self.pool.held().remove(&self.key);
        metrics::gauge!(m::TASKS_IN_FLIGHT).decrement(1.0);
        self.pool.slot_freed.notify_one();
    }
}

/// The worker pool of one process.
#[derive(Debug)]
pub(crate) struct WorkerPool {
    inner: Arc<Inner>,
    worker: WorkerId,
    held: Mutex<HashMap<HeldKey, CancellationToken>>,
    slots: Arc<Semaphore>,
    slot_freed: Notify,
    executions: TaskTracker,
    control: Control,
    completions: CompletionBatcher,
    /// Grouped embeddings calls of this process's `embed` executions.
    embeds: Arc<crate::provider::embed_batch::EmbedBatcher>,
    /// The dispatcher's last claim found nothing more to claim, and no hint came since
    /// (docs/engine.md, "Tasks claimed at creation").
    idle: std::sync::atomic::AtomicBool,
}

impl Tollgate {
    /// Starts this process's workers, sweeper and pipeline driver, and dispatches the
    /// queued tasks found at start (recovery). Returns the handle that shuts them down.
    pub async fn start(&self) -> Result<EngineHandle, EngineError> {
        WorkerPool::start(self.inner.clone()).await
    }
}

impl WorkerPool {
    /// Starts the dispatcher, heartbeats, the event listener, the sweeper and recovery.
    pub(crate) async fn start(inner: Arc<Inner>) -> Result<EngineHandle, EngineError> {
        let worker = WorkerId::new(format!("worker-{}", uuid::Uuid::new_v4().simple()))?;
        // 0 executions (an API-only replica): this process runs the sweeper, and the
        // pipeline driver when `pipelines.drive_without_workers` says so.
        let concurrency = inner.config.workers.concurrency as usize;
        let pool = Arc::new(WorkerPool {
            inner: inner.clone(),
            worker: worker.clone(),
            held: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(concurrency)),
            slot_freed: Notify::new(),
            executions: TaskTracker::new(),
            control: Control::default(),
            completions: CompletionBatcher::default(),
            embeds: Arc::new(crate::provider::embed_batch::EmbedBatcher::new(
                inner.config.workers.embed_gather,
            )),
            idle: std::sync::atomic::AtomicBool::new(false),
        });
        if concurrency > 0 {
            *inner
                .local_pool
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&pool);
        }
        let (hint_tx, hint_rx) = mpsc::channel(HINT_CAPACITY);
        // Subscribe before recovery lists the queue, so nothing queued meanwhile is missed.
        let events = inner.notifier.subscribe();
        let claiming = TaskTracker::new();
        if concurrency > 0 {
            claiming.spawn(pool.clone().dispatch(hint_rx));
            claiming.spawn(sweeper::recover(
                inner.clone(),
                hint_tx.clone(),
                pool.control.stop_claiming.clone(),
            ));
        }
        // An API-only replica drives runs only when configured to.
        let drives = inner.config.pipelines.concurrency > 0
            && (concurrency > 0 || inner.config.pipelines.drive_without_workers);
        if drives {
            // Stops claiming runs with the workers; a crash drops it mid-drive.
            let driver = Driver::new(inner.clone())?;
            let driver_events = inner.notifier.subscribe();
            let stop = pool.control.stop_claiming.clone();
            let crash = pool.control.crash.clone();
            claiming.spawn(async move {
                tokio::select! {
                    _ = crash.cancelled() => {}
                    _ = driver.run(driver_events, stop) => {}
                }
            });
        }
        claiming.close();
        let background = TaskTracker::new();
        if concurrency > 0 {
            background.spawn(pool.clone().heartbeat_loop());
            background.spawn(pool.clone().event_loop(events, hint_tx));
        }
        crate::webhooks::sync_config_endpoints(&inner).await?;
        if inner.config.webhooks.concurrency > 0 {
            // Stops with the background work; a crash drops it mid-attempt (its leases
            // run out and another replica sends those deliveries).
            let stop = pool.control.stop_background.clone();
            let crash = pool.control.crash.clone();
            let inner = inner.clone();
            background.spawn(async move {
                tokio::select! {
                    _ = crash.cancelled() => {}
                    _ = crate::webhooks::run(inner, stop) => {}
                }
            });
        }
        let sweeper_stop = pool.control.stop_background.clone();
        let crash = pool.control.crash.clone();
        background.spawn(async move {
            tokio::select! {
                _ = crash.cancelled() => {}
                _ = sweeper::run(inner, sweeper_stop) => {}
            }
        });
        background.close();
        tracing::info!(worker = %worker, concurrency, drives, "workers started");
        Ok(EngineHandle {
            pool,
            claiming,
            background,
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<HeldKey, CancellationToken>> {
        // The map stays consistent even if a holder panicked: recover it.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether this pool holds an execution of task `id` (of any claim).
    fn holds(&self, id: TaskId) -> bool {
        self.held().keys().any(|(held, _)| *held == id)
    }

    /// The lease this pool holds `task` by: this worker and the claim that returned the
    /// copy.
    fn lease(&self, task: &Task) -> Lease {
        Lease::new(self.worker.clone(), task.attempt)
    }
}
