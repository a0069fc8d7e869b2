//! Recording an execution's end: completions through the [`CompletionBatcher`] (group
//! commit), failures one by one, both retried while the database is unavailable, and
//! the settlement's metrics.

use super::execute::{Failure, Produced};
use super::{MAX_COMPLETION_BATCH, WorkerPool};
use crate::metrics as m;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;
use tollgate_core::{AttemptOutcome, ErrorCode, Reservation, Task, Usage};
use tollgate_store::{Completion, StoreError, Transition};

/// Attempts to record a completion while the database is unavailable.
const RECORD_ATTEMPTS: u32 = 4;

/// Where a queued completion's answer goes.
type CompletionAnswer = oneshot::Sender<Result<Transition, StoreError>>;

/// Group commit of completions: executions that finish while a batch is being recorded
/// queue up, and the next one to take the commit lock records the whole queue in one
/// `complete_tasks` call. Nothing waits on purpose: a lone completion is recorded at
/// once, and batches form only while the store is busy — under load, one commit serves
/// many tasks.
#[derive(Debug, Default)]
pub(super) struct CompletionBatcher {
    queue: Mutex<Vec<(Completion, CompletionAnswer)>>,
    committing: tokio::sync::Mutex<()>,
}

impl WorkerPool {
    /// docs/conformance.md#cost-settlement metrics of a recorded end: settled spend, and any overrun (logged by
    /// the store too). `reservation`: the task's, its re-asks included.
    pub(super) fn count_settlement(
        &self,
        task: &Task,
        reservation: Option<&Reservation>,
        usage: Option<&Usage>,
    ) {
        let Some(r) = reservation else { return };
        let charge = tollgate_core::cost::settle(r, usage, true);
        if charge.nano_usd > 0 {
            metrics::counter!(m::SPEND_SETTLED_TOTAL, m::app_labels(&task.app))
                .increment(charge.nano_usd as u64);
        }
        if charge.overrun_nano > 0 {
            metrics::counter!(m::SPEND_OVERRUN_TOTAL, m::app_labels(&task.app))
                .increment(charge.overrun_nano as u64);
        }
    }

    /// Records a success: the task's and its last attempt's (docs/routes.md,
    /// "Attempts"), in one completion. Returns the outcome and code labels.
    pub(super) async fn complete(
        &self,
        task: &Arc<Task>,
        reservation: Option<&Reservation>,
        produced: Produced,
    ) -> (&'static str, &'static str) {
        let settled = produced.usage;
        let spent = produced.spent;
        let result = self
            .record_completion(Completion {
                id: task.id,
                lease: self.lease(task),
                output: produced.output,
                usage: produced.usage,
                claimed: Some(task.clone()),
                attempt: Some(spent),
            })
            .await;
        match result {
            Ok(t) if t.applied => {
                self.inner.publish_transition(&t);
                metrics::counter!(m::ATTEMPTS_TOTAL, "outcome" => AttemptOutcome::Succeeded.as_str())
                    .increment(1);
                self.count_settlement(task, reservation, Some(&settled));
                ("succeeded", "none")
            }
            Ok(_) => {
                tracing::info!(task = %task.id, "completion refused: the task was canceled, expired or deleted meanwhile");
                ("refused", "none")
            }
            Err(StoreError::InvalidOutput(v)) => {
                let invalid = |message: String, usage| {
                    Failure::new(ErrorCode::InvalidModelOutput, message).with_usage(usage)
                };
                let ended = invalid(v.0.clone(), spent.usage);
                self.end_attempt(task, produced.attempt, &ended, spent.prices)
                    .await;
                self.fail(task, reservation, invalid(v.0, settled)).await
            }
            Err(e) => {
                tracing::error!(task = %task.id, error = %e, "cannot record the completion; the sweeper will end the task");
                ("unrecorded", "none")
            }
        }
    }

    /// Records one completion through the [`CompletionBatcher`]: queues it, then either
    /// its answer arrives (another execution recorded it) or this execution takes the
    /// commit lock and records everything queued.
    async fn record_completion(&self, completion: Completion) -> Result<Transition, StoreError> {
        let batcher = &self.completions;
        let (tx, mut rx) = oneshot::channel();
        batcher
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((completion, tx));
        loop {
            let guard = tokio::select! {
                biased;
                answer = &mut rx => {
                    return answer.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable("the completion batch was abandoned".into()))
                    });
                }
                guard = batcher.committing.lock() => guard,
            };
            let batch: Vec<_> = {
                let mut queue = batcher.queue.lock().unwrap_or_else(PoisonError::into_inner);
                let n = queue.len().min(MAX_COMPLETION_BATCH);
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                // Ours was taken by the previous batch: its answer is on the way.
                drop(guard);
                continue;
            }
            let (items, answers): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let store = &self.inner.store;
            let recorded = retry_unavailable(|| store.complete_tasks(items.clone())).await;
            match recorded {
                Ok(results) => {
                    for (answer, result) in answers.into_iter().zip(results) {
                        let _ = answer.send(result);
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for answer in answers {
                        let _ = answer.send(Err(if e.is_retryable() {
                            StoreError::Unavailable(message.clone())
                        } else {
                            StoreError::Database(message.clone())
                        }));
                    }
                }
            }
            drop(guard);
        }
    }

    /// Records a failure. Returns the outcome and code labels.
    pub(super) async fn fail(
        &self,
        task: &Task,
        reservation: Option<&Reservation>,
        failure: Failure,
    ) -> (&'static str, &'static str) {
        let store = &self.inner.store;
        let id = task.id;
        let usage = failure.usage.as_ref();
        let lease = self.lease(task);
        let result = retry_unavailable(|| {
            store.fail_task(id, Some(&lease), failure.code, &failure.message, usage)
        })
        .await;
        match result {
            Ok(t) if t.applied => {
                self.inner.publish_transition(&t);
                self.count_settlement(task, reservation, usage);
                ("failed", failure.code.as_str())
            }
            Ok(_) => ("refused", failure.code.as_str()),
            Err(e) => {
                tracing::error!(task = %id, error = %e, "cannot record the failure; the sweeper will end the task");
                ("unrecorded", failure.code.as_str())
            }
        }
    }
}

/// Retries a store write while the database is unavailable (a few times, backing off).
pub(super) async fn retry_unavailable<T, F, Fut>(mut write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match write().await {
            Err(e) if e.is_retryable() && attempt + 1 < RECORD_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100) * 2u32.pow(attempt)).await;
            }
            other => return other,
        }
    }
}
