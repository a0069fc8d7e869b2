//! Recording attempts (docs/routes.md, "Attempts"): a claim begins the first attempt
//! of its execution (moved to the deployment a route chose,
//! [`WorkerPool::redirect_attempt`]); a later one begins in the store before its
//! deployment's call ([`WorkerPool::begin_attempt`]); a failed one ends after it
//! ([`WorkerPool::end_attempt`]) with its outcome, usage and error, a successful one
//! with its completion (a transient failure,
//! after which the next attempt may follow, is a deployment found unavailable:
//! [`ProviderError::Unavailable`](crate::provider::ProviderError::Unavailable)).

use super::WorkerPool;
use super::complete::retry_unavailable;
use super::execute::Failure;
use crate::metrics as m;
use tollgate_core::{AttemptOutcome, ErrorCode, Prices, Task, TaskError};
use tollgate_store::AttemptEnd;

impl WorkerPool {
    /// Begins the task's next attempt on `deployment` and returns its number. A task no
    /// longer running under this execution's lease (canceled, deleted, finished,
    /// requeued, claimed again) stops
    /// (`Canceled`, acknowledged as such).
    pub(super) async fn begin_attempt(
        &self,
        task: &Task,
        deployment: &str,
    ) -> Result<u32, Failure> {
        let store = &self.inner.store;
        let lease = self.lease(task);
        match retry_unavailable(|| store.begin_attempt(task.id, &lease, deployment)).await {
            Ok(Some(n)) => Ok(n),
            Ok(None) => Err(Failure::new(
                ErrorCode::Canceled,
                "the task was canceled, deleted or finished before its attempt",
            )),
            Err(e) => Err(Failure::new(
                ErrorCode::ProviderError,
                format!("cannot record the attempt: {e}"),
            )),
        }
    }

    /// The claim's attempt (open since the claim, recorded on the first deployment of
    /// the task's model) goes to `deployment` instead: written only when a route chose
    /// another. A task no longer running under this worker stops, as for
    /// [`begin_attempt`](Self::begin_attempt).
    pub(super) async fn redirect_attempt(
        &self,
        task: &Task,
        deployment: &str,
    ) -> Result<(), Failure> {
        if deployment == tollgate_core::Deployment::new(&task.model_ref).name() {
            return Ok(());
        }
        let store = &self.inner.store;
        let n = task.attempt;
        let lease = self.lease(task);
        match retry_unavailable(|| store.redirect_attempt(task.id, &lease, n, deployment)).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(Failure::new(
                ErrorCode::Canceled,
                "the task was canceled, deleted or finished before its attempt",
            )),
            Err(e) => Err(Failure::new(
                ErrorCode::ProviderError,
                format!("cannot record the attempt: {e}"),
            )),
        }
    }

    /// Ends attempt `n` that failed as `f` says: its usage (an attempt that failed
    /// without one is charged its reservation), outcome and error (an attempt that
    /// succeeded ends with its completion). A failure to record is logged: the attempt
    /// then ends with its task, charged its reservation.
    pub(super) async fn end_attempt(
        &self,
        task: &Task,
        n: u32,
        f: &Failure,
        prices: Option<Prices>,
    ) {
        let end = AttemptEnd {
            outcome: if f.transient {
                AttemptOutcome::Unavailable
            } else {
                AttemptOutcome::of_error(f.code)
            },
            usage: f.usage,
            prices,
            error: Some(TaskError::new(f.code, &f.message)),
        };
        let store = &self.inner.store;
        match retry_unavailable(|| store.end_attempt(task.id, n, &end)).await {
            Ok(true) => {
                metrics::counter!(m::ATTEMPTS_TOTAL, "outcome" => end.outcome.as_str())
                    .increment(1);
            }
            Ok(false) => {
                tracing::info!(task = %task.id, attempt = n, "the attempt was ended already (the task ended or went back to the queue)");
            }
            Err(e) => {
                tracing::warn!(task = %task.id, attempt = n, error = %e, "cannot record the attempt's end; it ends with its task");
            }
        }
    }
}
