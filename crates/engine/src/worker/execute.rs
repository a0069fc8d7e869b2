//! One execution: the task's route walked (docs/routes.md) — a deployment chosen, called
//! ([`calls`](super::calls)), its output validated and re-asked as configured, the next
//! deployment tried when one is unavailable (each call after the first reserved first) —
//! and the end handed to [`complete`](super::complete) to record.

use super::WorkerPool;
use super::calls::{Attempted, Spent};
use crate::cpu;
use crate::metrics as m;
use futures::FutureExt;
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_core::route::choose;
use tollgate_core::{Deployment, ErrorCode, Reservation, Route, Task, Usage};

/// Why an execution ended without an output.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) code: ErrorCode,
    pub(super) message: String,
    /// docs/conformance.md#money-and-tokens: what the attempts used, when every attempt reported it (`None`: unknown,
    /// and a started task is then charged its whole reservation).
    pub(super) usage: Option<Usage>,
}

impl Failure {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            usage: None,
        }
    }

    pub(super) fn with_usage(mut self, usage: Usage) -> Failure {
        self.usage = Some(usage);
        self
    }
}

/// How an execution ended.
enum Ended {
    Done(Result<(Value, Usage), Failure>),
    /// The store or a notification said to stop (canceled, expired, deleted).
    Stopped,
    /// Shutdown's deadline passed.
    Interrupted,
}

impl WorkerPool {
    /// Runs the task, frees its execution slot as soon as the execution has ended, then
    /// records the end. The slot bounds concurrent executions (provider calls); while a
    /// completion waits for its batch's commit the next task may already run, which is
    /// what lets completions and claims batch under load. The task stays held (and
    /// heartbeated) until its end is recorded.
    pub(super) async fn execute_and_record(
        self: Arc<Self>,
        task: Arc<Task>,
        permit: OwnedSemaphorePermit,
    ) {
        let stop = CancellationToken::new();
        self.held().insert(task.id, stop.clone());
        let started = Instant::now();
        let interrupt = self.control.interrupt.clone();
        // The task's reservation as it grows with each re-ask (docs/budgets.md).
        let mut reservation = task.reservation;
        let ended = tokio::select! {
            biased;
            _ = stop.cancelled() => Ended::Stopped,
            _ = interrupt.cancelled() => Ended::Interrupted,
            // docs/engine.md, "Workers": a panicking execution fails its task at once.
            result = AssertUnwindSafe(self.execute(&task, &mut reservation)).catch_unwind() => match result {
                Ok(result) => Ended::Done(result),
                Err(panic) => {
                    let message = cpu::panic_message(&*panic);
                    tracing::error!(task = %task.id, %message, "the execution panicked");
                    Ended::Done(Err(Failure::new(
                        ErrorCode::Interrupted,
                        format!("the execution panicked: {message}"),
                    )))
                }
            },
        };
        drop(permit);
        self.slot_freed.notify_one();
        let ended = match ended {
            // The task was canceled, deleted or finished before its re-ask was reserved.
            Ended::Done(Err(f)) if f.code == ErrorCode::Canceled => Ended::Stopped,
            other => other,
        };
        let r = reservation.as_ref();
        let (outcome, code) = match ended {
            Ended::Done(Ok((output, usage))) => self.complete(&task, r, output, usage).await,
            Ended::Done(Err(failure)) => {
                tracing::info!(task = %task.id, code = %failure.code, message = %failure.message, "task failed");
                self.fail(&task, r, failure).await
            }
            Ended::Stopped => {
                tracing::info!(task = %task.id, "execution stopped: task canceled, expired or deleted");
                // Acknowledge a requested cancellation (a no-op when already canceled).
                match self.inner.store.mark_canceled(task.id).await {
                    Ok(t) => self.inner.publish_transition(&t),
                    Err(e) => tracing::debug!(error = %e, "mark_canceled failed"),
                }
                ("aborted", "none")
            }
            Ended::Interrupted => {
                let failure = Failure::new(
                    ErrorCode::Interrupted,
                    "the worker shut down before the task finished",
                );
                let (_, code) = self.fail(&task, r, failure).await;
                ("interrupted", code)
            }
        };
        metrics::counter!(m::TASK_OUTCOMES_TOTAL, "outcome" => outcome, "code" => code)
            .increment(1);
        metrics::histogram!(m::TASK_EXECUTION_SECONDS, "kind" => task.kind.as_str())
            .record(started.elapsed().as_secs_f64());
        self.held().remove(&task.id);
    }

    /// Runs the task on its route (docs/routes.md): a deployment is chosen by the
    /// route's strategy, skipping those cooling down; each gets one call
    /// ([`attempt`](Self::attempt)), re-asked on the same deployment while its output is
    /// invalid (as configured); a deployment that is unavailable (429, 5xx, timeout,
    /// connection error) is cooled down on every replica and the next one is tried, each
    /// deployment at most once per execution. Every call after the first is reserved
    /// before it is made (`reservation` grows with it; docs/budgets.md, "The
    /// reservation"); one that does not fit ends the task with `WORKFLOW_AI_SPEND_BUDGET`,
    /// its spent calls settled.
    async fn execute(
        &self,
        task: &Task,
        reservation: &mut Option<Reservation>,
    ) -> Result<(Value, Usage), Failure> {
        let request = task.parsed_request().map_err(|e| {
            Failure::new(
                ErrorCode::InvalidRequest,
                format!("the stored request cannot be read: {e}"),
            )
        })?;
        let route = self.task_route(task);
        let cooling = self.cooling(task, &route).await;
        let mut tried = vec![false; route.deployments.len()];
        let mut spent = Spent::default();
        let mut failures: Vec<String> = Vec::new();
        while let Some(index) = choose(&route, &cooling, &tried, fastrand::u64(..)) {
            tried[index] = true;
            let deployment = &route.deployments[index];
            match self
                .attempt(task, &request, &route, index, reservation, &mut spent)
                .await?
            {
                Attempted::Valid(output) => return Ok((output, spent.usage)),
                Attempted::Unavailable {
                    message,
                    retry_after,
                } => {
                    if route.deployments.len() > 1 {
                        self.cool_down(task, &route, deployment, retry_after).await;
                        tracing::info!(task = %task.id, deployment = %deployment.name(), %message, "deployment unavailable: trying the next one");
                    }
                    failures.push(if route.deployments.len() > 1 {
                        format!("{}: {message}", deployment.name())
                    } else {
                        message
                    });
                }
            }
        }
        // docs/budgets.md, "Settlement": the calls' usage is not known for sure (a timed
        // out call may have been billed): the task is charged everything it reserved.
        Err(Failure::new(ErrorCode::ProviderError, failures.join("; ")))
    }

    /// The task's route: the one stored with it, or the route of its one deployment,
    /// priced as it was reserved (or at the model's prices if it reserved nothing).
    fn task_route(&self, task: &Task) -> Route {
        if let Some(route) = &task.model_ref.route {
            return route.clone();
        }
        let prices = task.reservation.and_then(|r| r.prices).or_else(|| {
            self.inner
                .models
                .resolve(Some(&task.model))
                .ok()
                .and_then(|m| m.prices)
        });
        Route::single(Deployment {
            prices,
            ..Deployment::new(&task.model_ref)
        })
    }
}
