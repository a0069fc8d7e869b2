//! One execution: the task's attempts (docs/routes.md, "Attempts"), each going to one
//! deployment of the task's route, begun in the store before its call and ended after
//! it; in each attempt the deployment called ([`calls`](super::calls)), its output
//! validated and re-asked on the same deployment as configured (each call after the
//! first reserved first); a transient failure followed by the next attempt on the next
//! deployment while the task has tries left; the end handed to
//! [`complete`](super::complete) to record.

use super::WorkerPool;
use super::calls::{Attempted, Spent};
use super::complete::retry_unavailable;
use crate::cpu;
use crate::metrics as m;
use crate::notify::Event;
use futures::FutureExt;
use serde_json::Value;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tollgate_core::attempt::{may_try_again, retry_backoff};
use tollgate_core::route::choose;
use tollgate_core::{Deployment, ErrorCode, Prices, Reservation, Route, Task, Usage};
use tollgate_store::AttemptUsage;

/// Why an execution ended without an output.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) code: ErrorCode,
    pub(super) message: String,
    /// docs/conformance.md#money-and-tokens: what the attempts used, when every attempt reported it (`None`: unknown,
    /// and a started task is then charged its whole reservation).
    pub(super) usage: Option<Usage>,
    /// A transient provider failure (docs/routes.md, "Attempts"): the next attempt may
    /// follow while the task has tries left.
    pub(super) transient: bool,
}

impl Failure {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            usage: None,
            transient: false,
        }
    }

    pub(super) fn with_usage(mut self, usage: Usage) -> Failure {
        self.usage = Some(usage);
        self
    }
}

/// A valid output and what produced it.
pub(super) struct Produced {
    pub(super) output: Value,
    /// What the execution's attempts used, summed (the task's usage).
    pub(super) usage: Usage,
    /// The attempt that produced it: its number and what it used at its deployment's
    /// prices. It ends with the completion, in its transaction (docs/routes.md,
    /// "Attempts").
    pub(super) attempt: u32,
    pub(super) spent: AttemptUsage,
}

/// How an execution ended.
enum Ended {
    Done(Result<Box<Produced>, Failure>),
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
        let key = (task.id, task.attempt);
        self.held().insert(key, stop.clone());
        let started = Instant::now();
        let interrupt = self.control.interrupt.clone();
        // The task's reservation as it grows with each re-ask (docs/budgets.md).
        let mut reservation = task.reservation;
        let trace = self.inner.traces.execution(&task, self.worker.as_str());
        // The execution's live output (docs/api.md, "Streaming a task"), open until its
        // end is recorded.
        let live = self.inner.streams.open(&task.app, task.id, task.attempt);
        let sink = live.sink();
        let ended = tokio::select! {
            biased;
            _ = stop.cancelled() => Ended::Stopped,
            _ = interrupt.cancelled() => Ended::Interrupted,
            // docs/engine.md, "Workers": a panicking execution fails its task at once.
            result = AssertUnwindSafe(self.execute(&task, &mut reservation, &trace, &sink)).catch_unwind() => match result {
                Ok(result) => Ended::Done(result.map(Box::new)),
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
        // Readers on other replicas get the answer's last pieces from the stream log
        // before its end is recorded (waiting a little at most; none for an execution
        // that logged nothing or did not answer).
        if let Some(last) = live.end(matches!(ended, Ended::Done(Ok(_)))) {
            last.written(crate::stream::LAST_CHUNK_WAIT).await;
        }
        let r = reservation.as_ref();
        let settle = self.inner.traces.child(&trace, "settle");
        let (outcome, code) = match ended {
            Ended::Done(Ok(produced)) => self.complete(&task, r, *produced).await,
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
            Ended::Interrupted => self.interrupted(&task, r).await,
        };
        crate::telemetry::record_settle(&settle, outcome, code);
        metrics::counter!(m::TASK_OUTCOMES_TOTAL, "outcome" => outcome, "code" => code)
            .increment(1);
        metrics::histogram!(m::TASK_EXECUTION_SECONDS, "kind" => task.kind.as_str())
            .record(started.elapsed().as_secs_f64());
        self.held().remove(&key);
        drop(live);
    }

    /// The task's attempts (docs/routes.md, "Attempts"): each goes to one deployment of
    /// its route (chosen by the route's strategy, skipping those cooling down and those
    /// this execution tried already while others are left), is begun in the store before
    /// its call and ended after it (the claim began the first, on the first deployment of
    /// the task's model: it is moved when the route chooses another; the one that
    /// produces the output ends with the completion). A transient failure (the deployment unavailable) cools
    /// the deployment down on every replica and is followed by the next attempt while the
    /// task has tries left and a deployment remains that did not ask to wait longer than
    /// its provider's `max_retry_delay` (after a short backoff when it goes to the same deployment);
    /// the last error ends it otherwise. Every call but the task's first is reserved
    /// before it is made; a refusal ends the task with `WORKFLOW_AI_SPEND_BUDGET`. The
    /// usage returned is this execution's attempts', summed.
    async fn execute(
        &self,
        task: &Task,
        reservation: &mut Option<Reservation>,
        trace: &crate::TraceSpan,
        sink: &crate::StreamSink,
    ) -> Result<Produced, Failure> {
        let request = task.typed_request().map_err(|e| {
            Failure::new(
                ErrorCode::InvalidRequest,
                format!("the stored request cannot be read: {e}"),
            )
        })?;
        let route = self.task_route(task);
        let cooling = self.cooling(task, &route).await;
        let mut tried = vec![false; route.deployments.len()];
        // Deployments that asked to be left alone longer than their provider's
        // `max_retry_delay`: never tried again by this execution (docs/routes.md).
        let mut barred = vec![false; route.deployments.len()];
        let mut last: Option<usize> = None;
        // Calls made by this execution (its first attempt's first call was reserved at
        // admission unless the task was requeued).
        let mut calls = 0;
        // What this execution's ended attempts used (`None` once one did not report it).
        let mut spent_total = Some(Usage::default());
        let mut failures: Vec<String> = Vec::new();
        loop {
            let index = match choose(&route, &cooling, &tried, fastrand::u64(..)) {
                Some(index) => index,
                None => {
                    // Every deployment had its turn: the next attempt starts the route over
                    // (but for those barred; one is left, or the loop would have ended).
                    tried.clone_from(&barred);
                    match choose(&route, &cooling, &tried, fastrand::u64(..)) {
                        Some(index) => index,
                        None => barred.iter().position(|b| !b).unwrap_or(0),
                    }
                }
            };
            tried[index] = true;
            let deployment = &route.deployments[index];
            if last == Some(index) {
                // The same deployment again: wait a little first (docs/routes.md).
                let next = u32::try_from(failures.len()).unwrap_or(u32::MAX);
                tokio::time::sleep(retry_backoff(next.saturating_add(1))).await;
            }
            // The claim's attempt first (open since the claim), then one more per turn.
            let n = match last {
                None => {
                    self.redirect_attempt(task, &deployment.name()).await?;
                    task.attempt
                }
                Some(_) => self.begin_attempt(task, &deployment.name()).await?,
            };
            last = Some(index);
            // A requeued task's reservation went with its interrupted attempt: its first
            // call here is reserved like any later one.
            let covered = n == 1;
            let mut spent = Spent {
                calls,
                usage: Usage::default(),
            };
            let result = match self
                .attempt(
                    task,
                    &request,
                    &route,
                    index,
                    reservation,
                    &mut spent,
                    covered,
                    trace,
                    sink,
                )
                .await
            {
                Ok(Attempted::Valid(output)) => Ok((output, spent.usage)),
                Ok(Attempted::Unavailable {
                    message,
                    retry_after,
                }) => {
                    if route.deployments.len() > 1 {
                        self.cool_down(task, &route, deployment, retry_after).await;
                    }
                    let max_delay = self
                        .inner
                        .config
                        .providers
                        .get(&deployment.provider)
                        .map(|p| p.max_retry_delay);
                    if retry_after.zip(max_delay).is_some_and(|(w, max)| w > max) {
                        barred[index] = true;
                    }
                    let message = if route.deployments.len() > 1 {
                        format!("{}: {message}", deployment.name())
                    } else {
                        message
                    };
                    let mut failure =
                        Failure::new(ErrorCode::ProviderError, message).with_usage(spent.usage);
                    failure.transient = true;
                    Err(failure)
                }
                Err(failure) => Err(failure),
            };
            calls = spent.calls;
            let result = match result {
                Ok((output, used)) => {
                    let total = spent_total.map_or(used, |s| s.plus(&used));
                    return Ok(Produced {
                        output,
                        usage: total,
                        attempt: n,
                        spent: AttemptUsage {
                            usage: used,
                            prices: deployment.prices,
                        },
                    });
                }
                Err(f) => {
                    self.end_attempt(task, n, &f, deployment.prices).await;
                    f
                }
            };
            match result {
                f if f.transient
                    && may_try_again(n, task.max_attempts)
                    && barred.contains(&false) =>
                {
                    spent_total = spent_total.zip(f.usage).map(|(s, u)| s.plus(&u));
                    tracing::info!(task = %task.id, attempt = n, deployment = %deployment.name(), message = %f.message, "deployment unavailable: the next attempt follows");
                    failures.push(f.message);
                }
                mut f => {
                    f.usage = spent_total.zip(f.usage).map(|(s, u)| s.plus(&u));
                    if f.transient && !failures.is_empty() {
                        failures.push(f.message);
                        f.message = failures.join("; ");
                    }
                    return Err(f);
                }
            }
        }
    }

    /// docs/routes.md, "Attempts": an execution interrupted by a graceful shutdown is a
    /// transient failure. With tries left its task goes back to the queue for any replica
    /// (its open attempt ends `interrupted`, charged its reservation, as a crashed one
    /// is); with none left (`max_attempts = 1`) it fails `WORKFLOW_AI_INTERRUPTED` as
    /// before attempts.
    async fn interrupted(
        &self,
        task: &Task,
        reservation: Option<&Reservation>,
    ) -> (&'static str, &'static str) {
        const MESSAGE: &str = "the worker shut down before the task finished";
        let store = &self.inner.store;
        let lease = self.lease(task);
        match retry_unavailable(|| store.requeue_task(task.id, &lease, MESSAGE)).await {
            Ok(true) => {
                tracing::info!(task = %task.id, "interrupted by the shutdown: back in the queue for its next attempt");
                metrics::counter!(m::ATTEMPTS_TOTAL, "outcome" => "interrupted").increment(1);
                self.inner.notifier.publish(Event::TaskQueued {
                    app: task.app.clone(),
                    id: task.id,
                });
                ("requeued", "none")
            }
            answer => {
                if let Err(e) = answer {
                    tracing::warn!(task = %task.id, error = %e, "cannot hand the task back to the queue; failing it");
                }
                let failure = Failure::new(ErrorCode::Interrupted, MESSAGE);
                let (_, code) = self.fail(task, reservation, failure).await;
                ("interrupted", code)
            }
        }
    }

    /// The task's route: the one stored with it, or the route of its one deployment,
    /// priced as it was reserved (or at the model's prices if it reserved nothing).
    fn task_route(&self, task: &Task) -> Route {
        if let Some(route) = &task.model_ref.route {
            return route.clone();
        }
        Route::single(Deployment {
            prices: self.prices(task),
            ..Deployment::new(&task.model_ref)
        })
    }

    /// The task's prices: those it was reserved at, or the model's for a task that
    /// reserved nothing (`None`: unpriced).
    pub(super) fn prices(&self, task: &Task) -> Option<Prices> {
        task.reservation.and_then(|r| r.prices).or_else(|| {
            self.inner
                .models
                .resolve(Some(&task.model))
                .ok()
                .and_then(|m| m.prices)
        })
    }
}
