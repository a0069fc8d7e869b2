//! Workflow runs (docs/conformance.md#workflow-runs).

use crate::error::EngineError;
use crate::notify::Event;
use tollgate_core::{AppId, NewRun, Run, RunId, TaskId, TaskStatus};
use tollgate_store::{RunCancel, RunResult, WaitOutcome};

use super::*;

impl Tollgate {
    /// docs/conformance.md#workflow-runs: creates a workflow run. With traces on, a `run`
    /// span (a child of the current span: the request's, which continues the caller's
    /// `traceparent`) is stored on the run as the parent of its tasks (docs/telemetry.md,
    /// "Runs").
    pub async fn create_run(&self, mut new: NewRun) -> Result<Run, EngineError> {
        let traces = &self.inner.traces;
        let span = traces.start_under("run", None);
        if let Some(position) = span.trace_parent() {
            new.trace_parent = Some(position);
        }
        span.set_with(crate::telemetry::attr::APP, || new.app.to_string());
        let created = self.inner.store.create_run(new).await;
        match &created {
            Ok(run) => span.set_with(crate::telemetry::attr::RUN_ID, || run.id.to_string()),
            Err(e) => span.error(e.to_string()),
        }
        Ok(created?)
    }

    /// A run of the app by id.
    pub async fn get_run(&self, app: &AppId, id: RunId) -> Result<Option<Run>, EngineError> {
        Ok(self.inner.store.get_run(app, id).await?)
    }

    /// docs/conformance.md#workflow-runs: cancels the run and its queued and running tasks (their workers stop).
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
                    task: None,
                });
            }
        }
        Ok(answer)
    }

    /// docs/conformance.md#workflow-runs: the run's step waits on one of its tasks; it is woken (and a
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
}
