//! The pipeline driver: moves pipeline runs forward, on every replica, without two
//! replicas ever driving one run at once.
//!
//! - **Claiming.** The driver claims due runs (`claim_pipeline_runs`: runnable, due, not
//!   held by a live lease, `SKIP LOCKED`), at most `pipelines.concurrency` at a time, and
//!   holds each for `pipelines.lease`. It looks again at once when a `RunWoken`
//!   notification arrives (a step's task finished, a run started) and at least every
//!   `pipelines.poll_interval` in any case: a lost notification costs latency only.
//! - **Driving** a run is a few short store calls, never held during inference: read the
//!   run's tasks; fail the run if a step failed with no retries left; submit every ready
//!   step (all of its dependencies succeeded) as a run-owned task with its request and
//!   source filled from the run's input and the earlier outputs; finish the run with the
//!   pipeline's output once every step succeeded; otherwise wait on one unfinished task
//!   (`wait_on_task`) and give the run back. The run sleeps until that task is terminal
//!   (the store wakes it, and a sweep repairs a lost wake), then any replica drives it
//!   again. Independent steps run in parallel as tasks; waiting on them one after
//!   another is enough, since a finished task is read at the next drive.
//! - **Exactly once.** Each attempt's effect key is derived from (run, step, attempt)
//!   ([`step_effect_key`](crate::pipelines::step_effect_key)). A driver that crashed at
//!   any instant — before or after submitting, waiting, finishing — leaves nothing a new
//!   driver could repeat: submitting again returns the existing task, without admission
//!   and without spending budget (docs/conformance.md#create-idempotency).
//! - **Admission.** A step refused by admission (`WORKFLOW_AI_*`, docs/conformance.md#money-and-tokens's spend and
//!   token limits too when the retry time is known) makes the run wait
//!   until the reported retry time (or `pipelines.admission_default_delay` when none is
//!   known) and try again; with `pipelines.admission_retry = false` the run fails with
//!   the rejection instead.
//! - **Failures.** A failed or canceled step is tried again under a new effect key while
//!   its `retries` allow; then the run fails with the step's error code and message, and
//!   its tasks still queued or running are canceled.

use crate::error::EngineError;
use crate::facade::{SourceSpec, Submission, SubmissionOwner, Tollgate};
use crate::inner::Inner;
use crate::metrics as m;
use crate::notify::Event;
use crate::pipeline_cache::load_pipeline;
use crate::pipelines::{Progress, step_effect_key};
use futures::StreamExt;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use tollgate_core::pipeline::{Pipeline, Step, resolve};
use tollgate_core::{
    BudgetName, Clock, EngineKeySpace, ErrorCode, Run, SourceId, SourceRevision, StepKey,
    SystemClock, Task, TaskError, TaskOwner, TaskStatus, Timestamp, WorkerId,
};
use tollgate_store::{RunResult, StoreError, WaitOutcome};

/// Most rounds of one drive; each round either acts or ends the drive, so this only
/// bounds a run whose steps keep coming back finished at once (cache hits).
const MAX_ROUNDS: usize = 64;

/// The driver of one process.
#[derive(Debug)]
pub(crate) struct Driver {
    inner: Arc<Inner>,
    id: WorkerId,
}

/// What a round of driving decided.
enum Round {
    /// Something changed that the next round reads: look again now.
    Again,
    /// Give the run back, due again at this instant (now when `None`; a run that waits on
    /// a task is driven again only once woken).
    Release(Option<Timestamp>),
}

/// Why a step could not be submitted.
enum Refused {
    /// Admission refused it: try again after this long.
    Defer(Duration),
    /// The run cannot go on: fail it with this error.
    Fail(TaskError),
    /// The run is canceled or gone: stop driving it.
    Stop,
    /// The store failed (an unavailable database): drive the run again later.
    Store(EngineError),
}

impl Driver {
    /// A driver with a fresh id.
    pub(crate) fn new(inner: Arc<Inner>) -> Result<Driver, EngineError> {
        let id = WorkerId::new(format!("driver-{}", uuid::Uuid::new_v4().simple()))?;
        Ok(Driver { inner, id })
    }

    /// Claims and drives due runs until `stop`; a drive in progress when `stop` fires is
    /// finished first (it is a few short store calls).
    pub(crate) async fn run(self, mut events: broadcast::Receiver<Event>, stop: CancellationToken) {
        let config = &self.inner.config.pipelines;
        let limit = config.concurrency.max(1);
        tracing::info!(driver = %self.id, concurrency = limit, "pipeline driver started");
        loop {
            if stop.is_cancelled() {
                return;
            }
            let claimed = match self
                .inner
                .store
                .claim_pipeline_runs(&self.id, config.lease, limit)
                .await
            {
                Ok(runs) => runs,
                Err(e) => {
                    tracing::warn!(error = %e, "claiming pipeline runs failed");
                    Vec::new()
                }
            };
            let full = claimed.len() >= limit as usize;
            futures::stream::iter(claimed)
                .for_each_concurrent(limit as usize, |run| self.drive_and_release(run))
                .await;
            if full {
                continue;
            }
            // Idle: a woken run, or the poll interval, whichever comes first.
            let nap = tokio::time::sleep(config.poll_interval);
            tokio::pin!(nap);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = &mut nap => break,
                    event = events.recv() => match event {
                        Ok(Event::RunWoken { .. }) | Err(RecvError::Lagged(_)) => break,
                        Ok(_) => {}
                        Err(RecvError::Closed) => {
                            (&mut nap).await;
                            break;
                        }
                    },
                }
            }
        }
    }

    /// Drives one claimed run and gives it back.
    async fn drive_and_release(&self, run: Run) {
        let wake_at = match self.drive(&run).await {
            Ok(at) => at,
            Err(e) => {
                tracing::warn!(run = %run.id, error = %e, "driving a pipeline run failed; trying again later");
                Some(now().plus(self.inner.config.pipelines.error_delay))
            }
        };
        if let Err(e) = self
            .inner
            .store
            .release_pipeline_run(run.id, &self.id, wake_at)
            .await
        {
            // The lease ends by itself; another driver takes over then.
            tracing::warn!(run = %run.id, error = %e, "releasing a pipeline run failed");
        }
    }

    /// Moves one run as far as it goes now. Returns when it is due again.
    async fn drive(&self, run: &Run) -> Result<Option<Timestamp>, EngineError> {
        let store = &self.inner.store;
        let Some(pref) = store.run_pipeline(&run.app, run.id).await? else {
            return Ok(None);
        };
        let pipeline = match load_pipeline(&self.inner, &run.app, &pref).await {
            Ok(Some(p)) => p,
            Ok(None) => {
                let message = format!(
                    "pipeline {} version {} is not registered",
                    pref.name, pref.version
                );
                self.fail(run, TaskError::new(ErrorCode::InvalidState, message))
                    .await?;
                return Ok(None);
            }
            Err(EngineError::Invalid(e)) => {
                let message = format!("the pipeline definition cannot be used: {e}");
                self.fail(run, TaskError::new(ErrorCode::InvalidRequest, message))
                    .await?;
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        for _ in 0..MAX_ROUNDS {
            let tasks = store.run_tasks(&run.app, run.id).await?;
            let progress = Progress::of(&pipeline, run.id, tasks);
            match self.round(run, &pipeline, &progress).await? {
                Round::Again => continue,
                Round::Release(at) => return Ok(at),
            }
        }
        Ok(None)
    }

    /// One look at the run's steps, and what follows from it.
    async fn round(
        &self,
        run: &Run,
        pipeline: &Pipeline,
        progress: &Progress<'_>,
    ) -> Result<Round, EngineError> {
        // A step out of attempts fails the run.
        let interrupted_retries = self.inner.config.pipelines.interrupted_retries;
        if let Some(p) = progress
            .steps
            .iter()
            .find(|p| p.failed() && !p.may_retry(interrupted_retries))
        {
            let error = p
                .task
                .as_ref()
                .and_then(|t| t.error.clone())
                .unwrap_or_else(|| TaskError::new(ErrorCode::ProviderError, "no error recorded"));
            let message = format!(
                "step `{}` failed after {} attempt(s): {}",
                p.step.key,
                p.attempt + 1,
                error.message
            );
            self.fail(run, TaskError::new(error.code, message)).await?;
            return Ok(Round::Release(None));
        }
        // Submit every ready step: never tried, or failed with retries left, and every
        // dependency succeeded.
        let outputs = progress.outputs();
        let mut submitted = false;
        let mut defer: Option<Duration> = None;
        for p in &progress.steps {
            let attempt = match &p.task {
                None => 0,
                Some(_) if p.failed() => p.attempt + 1,
                Some(_) => continue,
            };
            if !p.step.depends_on.iter().all(|d| outputs.contains_key(d)) {
                continue;
            }
            match self.submit(run, p.step, attempt, &outputs).await {
                Ok(_) => submitted = true,
                Err(Refused::Defer(after)) => {
                    metrics::counter!(m::PIPELINE_ADMISSION_WAITS_TOTAL).increment(1);
                    defer = Some(defer.map_or(after, |d| d.min(after)));
                }
                Err(Refused::Fail(error)) => {
                    self.fail(run, error).await?;
                    return Ok(Round::Release(None));
                }
                Err(Refused::Stop) => return Ok(Round::Release(None)),
                Err(Refused::Store(e)) => return Err(e),
            }
        }
        if let Some(after) = defer {
            // Steps submitted meanwhile are read at the next drive.
            return Ok(Round::Release(Some(now().plus(after))));
        }
        if submitted {
            return Ok(Round::Again);
        }
        if progress.steps.iter().all(|p| p.output().is_some()) {
            let result = match pipeline.output(&run.input, &outputs) {
                Ok(output) => RunResult::Succeeded(output),
                Err(message) => RunResult::Failed(TaskError::new(
                    ErrorCode::InvalidRequest,
                    format!("the pipeline's output cannot be built: {message}"),
                )),
            };
            self.finish(run, result).await?;
            return Ok(Round::Release(None));
        }
        let unfinished = progress
            .steps
            .iter()
            .filter_map(|p| p.task.as_ref())
            .find(|t| !t.status.is_terminal());
        let Some(task) = unfinished else {
            // Every step is finished, pending on a failed dependency (handled above), or
            // submittable (submitted above): nothing left. Look again later in any case.
            tracing::warn!(run = %run.id, "pipeline run has nothing to wait on");
            return Ok(Round::Release(Some(
                now().plus(self.inner.config.pipelines.poll_interval),
            )));
        };
        match self
            .inner
            .store
            .wait_on_task(&run.app, run.id, task.id)
            .await
        {
            Ok(WaitOutcome::Waiting(_)) => Ok(Round::Release(None)),
            Ok(WaitOutcome::Ready(_)) => Ok(Round::Again),
            // The run ended meanwhile (canceled): nothing to drive.
            Err(StoreError::InvalidState(_) | StoreError::RunNotFound(_)) => {
                Ok(Round::Release(None))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Submits one attempt of a step (or finds it submitted already).
    async fn submit(
        &self,
        run: &Run,
        step: &Step,
        attempt: u32,
        outputs: &BTreeMap<StepKey, Value>,
    ) -> Result<Task, Refused> {
        let fail = |code: ErrorCode, message: String| {
            Refused::Fail(TaskError::new(
                code,
                format!("step `{}`: {message}", step.key),
            ))
        };
        let effect_key = step_effect_key(run.id, &step.key, attempt)
            .map_err(|e| fail(ErrorCode::InvalidRequest, e.to_string()))?;
        let request = resolve(&step.request, &run.input, outputs)
            .map_err(|e| fail(ErrorCode::InvalidRequest, format!("request: {e}")))?;
        let source = match &step.source {
            None => None,
            Some(template) => Some(
                resolve(template, &run.input, outputs)
                    .and_then(|v| source_spec(&v))
                    .map_err(|e| fail(ErrorCode::InvalidRequest, format!("source: {e}")))?,
            ),
        };
        let budget = step
            .budget
            .as_deref()
            .map(BudgetName::new)
            .transpose()
            .map_err(|e| fail(ErrorCode::InvalidRequest, e.to_string()))?;
        let submission = Submission {
            priority: step.priority,
            app: run.app.clone(),
            owner: SubmissionOwner::Run(run.id),
            subject: None,
            step: Some(step.key.clone()),
            effect_key,
            kind: step.kind,
            request,
            model: step.model.clone(),
            source,
            budget,
        };
        let tollgate = Tollgate {
            inner: self.inner.clone(),
        };
        // docs/telemetry.md: the step is the parent of its task's trace.
        let span = self.inner.traces.pipeline_step(run, &step.key, attempt);
        match span
            .in_scope(tollgate.submit_keyed(
                submission,
                Some(EngineKeySpace::PipelineStep),
                crate::facade::Start::Queued,
            ))
            .await
        {
            Ok(submitted) => {
                let task = submitted.task;
                let ours = task.owner == (TaskOwner::Run { run_id: run.id })
                    && task.step == step.key
                    && task.kind == step.kind;
                if !ours {
                    return Err(fail(
                        ErrorCode::InvalidState,
                        format!(
                            "effect key {} already names task {}, which is not this step's",
                            task.effect_key, task.id
                        ),
                    ));
                }
                let outcome = if submitted.created {
                    "created"
                } else {
                    "existing"
                };
                metrics::counter!(m::PIPELINE_STEPS_SUBMITTED_TOTAL, "outcome" => outcome)
                    .increment(1);
                Ok(task)
            }
            // docs/conformance.md#cost-limits: a spend or token-rate refusal that will pass in time waits like
            // any admission; one that never can (no output bound, a reservation above
            // the limit itself) fails the run.
            Err(EngineError::Cost(rejection)) => {
                let config = &self.inner.config.pipelines;
                match rejection.retry_after() {
                    Some(wait) if config.admission_retry => Err(Refused::Defer(wait)),
                    _ => Err(fail(rejection.code(), rejection.to_string())),
                }
            }
            Err(EngineError::Admission(rejection)) => {
                let config = &self.inner.config.pipelines;
                if config.admission_retry {
                    Err(Refused::Defer(
                        rejection
                            .retry_after()
                            .unwrap_or(config.admission_default_delay),
                    ))
                } else {
                    Err(fail(rejection.code(), rejection.to_string()))
                }
            }
            Err(
                EngineError::RunCanceled(_)
                | EngineError::RunNotFound(_)
                | EngineError::InvalidState(_),
            ) => Err(Refused::Stop),
            Err(e) if e.is_database() => Err(Refused::Store(e)),
            Err(e) => {
                let code = e.code().unwrap_or(ErrorCode::InvalidRequest);
                Err(fail(code, e.to_string()))
            }
        }
    }

    /// Finishes the run (a run that ended meanwhile — canceled, or finished by a driver
    /// that took over — is left as it is).
    async fn finish(&self, run: &Run, result: RunResult) -> Result<(), EngineError> {
        let outcome = match &result {
            RunResult::Succeeded(_) => "succeeded",
            RunResult::Failed(_) => "failed",
        };
        match self.inner.store.finish_run(&run.app, run.id, result).await {
            Ok(_) => {
                metrics::counter!(m::PIPELINE_RUNS_FINISHED_TOTAL, "outcome" => outcome)
                    .increment(1);
                tracing::info!(run = %run.id, outcome, "pipeline run finished");
                Ok(())
            }
            Err(StoreError::InvalidState(_)) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Fails the run, then cancels its tasks still queued or running: nothing needs them.
    async fn fail(&self, run: &Run, error: TaskError) -> Result<(), EngineError> {
        self.finish(run, RunResult::Failed(error)).await?;
        let store = &self.inner.store;
        for task in store.run_tasks(&run.app, run.id).await? {
            if matches!(task.status, TaskStatus::Queued | TaskStatus::Running)
                && let Some(transition) = store.request_cancel(&run.app, task.id).await?
            {
                self.inner.publish_transition(&transition);
            }
        }
        Ok(())
    }
}

/// A step's resolved `source`: `{"id", "revision", "recompute"?}`, the id and revision
/// strings (numbers are taken as their text).
fn source_spec(v: &Value) -> Result<SourceSpec, String> {
    fn text(v: Option<&Value>, field: &str) -> Result<String, String> {
        match v {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(Value::Number(n)) => Ok(n.to_string()),
            Some(other) => Err(format!("`{field}` must be a string, got {other}")),
            None => Err(format!("`{field}` is missing")),
        }
    }
    let id = text(v.get("id"), "id")?;
    let revision = text(v.get("revision"), "revision")?;
    let recompute = match v.get("recompute") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(format!("`recompute` must be true or false, got {other}")),
    };
    Ok(SourceSpec {
        id: SourceId::new(id).map_err(|e| e.to_string())?,
        revision: SourceRevision::new(revision).map_err(|e| e.to_string())?,
        recompute,
    })
}

/// Now, for deferring a run. The store compares it with its own clock (PostgreSQL's, on
/// that backend); a skew between the two only moves a retry by as much.
fn now() -> Timestamp {
    SystemClock.now()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sources_take_text_and_numbers() {
        let s = source_spec(&json!({"id": "inv-7", "revision": 3})).unwrap();
        assert_eq!(
            (s.id.as_str(), s.revision.as_str(), s.recompute),
            ("inv-7", "3", false)
        );
        let s = source_spec(&json!({"id": "a", "revision": "v1", "recompute": true})).unwrap();
        assert!(s.recompute);
        assert!(source_spec(&json!({"id": {"x": 1}, "revision": "v1"})).is_err());
        assert!(source_spec(&json!({"id": "a", "revision": ""})).is_err());
        assert!(source_spec(&json!({"id": "a", "revision": "v", "recompute": "yes"})).is_err());
    }
}
