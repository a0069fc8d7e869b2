//! The handle of a running pool: graceful shutdown, or abandoning it like a crash.

use super::WorkerPool;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::task::TaskTracker;
use tollgate_core::{TaskId, WorkerId};

/// How long shutdown waits for interrupted executions to record their end.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// What [`EngineHandle::shutdown`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownReport {
    /// Whether every execution in flight finished before the deadline.
    pub drained: bool,
    /// Executions still running at the deadline: each task handed back to the queue
    /// with tries left, otherwise recorded as `WORKFLOW_AI_INTERRUPTED`
    /// (docs/routes.md, "Attempts").
    pub interrupted: usize,
}

/// The running workers and sweeper of one [`Tollgate`](crate::Tollgate). Dropping it
/// without [`shutdown`](Self::shutdown) stops everything abruptly, like
/// [`abandon`](Self::abandon).
#[derive(Debug)]
pub struct EngineHandle {
    pub(super) pool: Arc<WorkerPool>,
    pub(super) claiming: TaskTracker,
    pub(super) background: TaskTracker,
}

impl EngineHandle {
    /// The worker id recorded on the tasks this pool claims.
    pub fn worker_id(&self) -> &WorkerId {
        &self.pool.worker
    }

    /// Tasks this pool is executing now (each once, even while a stale execution of one
    /// still runs beside its current one).
    pub fn in_flight(&self) -> Vec<TaskId> {
        let mut ids: Vec<TaskId> = self.pool.held().keys().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// Graceful stop: claims nothing more at once, lets executions in flight finish
    /// until `deadline`, then interrupts the rest: their attempts end `interrupted`
    /// (charged their reservations) and each task goes back to the queue for another
    /// replica while it has tries left, or fails `WORKFLOW_AI_INTERRUPTED` (with
    /// `max_attempts = 1`: never sent twice). Queued tasks stay queued for any replica. Heartbeats continue until
    /// the executions are done, so nothing expires meanwhile.
    pub async fn shutdown(self, deadline: Duration) -> ShutdownReport {
        let control = &self.pool.control;
        control.stop_claiming.cancel();
        self.claiming.wait().await;
        self.pool.executions.close();
        let drained = tokio::time::timeout(deadline, self.pool.executions.wait())
            .await
            .is_ok();
        let interrupted = if drained {
            0
        } else {
            let left = self.pool.held().len();
            control.interrupt.cancel();
            if tokio::time::timeout(INTERRUPT_GRACE, self.pool.executions.wait())
                .await
                .is_err()
            {
                tracing::warn!("interrupted executions did not record their end in time");
            }
            left
        };
        control.stop_background.cancel();
        self.background.wait().await;
        tracing::info!(worker = %self.pool.worker, drained, interrupted, "workers stopped");
        ShutdownReport {
            drained,
            interrupted,
        }
    }

    /// Stops everything at once without recording anything, as if the process had
    /// crashed: executions are dropped mid-call, their tasks stay `running` in the
    /// database until a sweeper (of any replica) fails them with
    /// `WORKFLOW_AI_INTERRUPTED` after the liveness timeout. For tests and drills.
    pub async fn abandon(self) {
        let control = &self.pool.control;
        control.crash.cancel();
        control.stop_claiming.cancel();
        control.stop_background.cancel();
        self.pool.executions.close();
        self.claiming.wait().await;
        self.pool.executions.wait().await;
        self.background.wait().await;
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let control = &self.pool.control;
        control.stop_claiming.cancel();
        control.stop_background.cancel();
        control.crash.cancel();
    }
}
