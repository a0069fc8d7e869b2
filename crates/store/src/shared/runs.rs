//! SPEC §7's dialect-free rules of a run's step, between the reads and the write: when a
//! run may wait on a task, when it may finish, and the columns of its ending.

use crate::{RunResult, StoreError, StoreResult};
use tollgate_core::canonical::canonical_json;
use tollgate_core::{AppId, Run, RunId, RunState, Task, TaskId, truncate_message};

/// A run may wait only while it exists in the app and is not finished.
pub(crate) fn may_wait(run: RunId, current: Option<&Run>) -> StoreResult<()> {
    let Some(current) = current else {
        return Err(StoreError::RunNotFound(run.to_string()));
    };
    if current.state.is_terminal() {
        return Err(StoreError::InvalidState(format!(
            "run {run} is {} and cannot wait",
            current.state.as_str()
        )));
    }
    Ok(())
}

/// A run waits only on a task of its own (another app's or run's task is missing).
/// Returns the task when it is already terminal: the run stays runnable and reads it now.
pub(crate) fn ready_task(
    app: &AppId,
    run: RunId,
    task_id: TaskId,
    task: Option<Task>,
) -> StoreResult<Option<Task>> {
    match task {
        Some(t) if t.app == *app && t.run_id() == Some(run) => {
            Ok(t.status.is_terminal().then_some(t))
        }
        _ => Err(StoreError::TaskNotFound(task_id.to_string())),
    }
}

/// A finished run is final.
pub(crate) fn may_finish(run: RunId, current: &Run) -> StoreResult<()> {
    if current.state.is_terminal() {
        return Err(StoreError::InvalidState(format!(
            "run {run} is already {}",
            current.state.as_str()
        )));
    }
    Ok(())
}

/// The columns a run's ending writes.
pub(crate) struct RunEnding {
    pub(crate) state: RunState,
    pub(crate) output: Option<String>,
    pub(crate) error_code: Option<&'static str>,
    pub(crate) error_message: Option<String>,
}

impl RunEnding {
    pub(crate) fn of(result: &RunResult) -> StoreResult<RunEnding> {
        Ok(match result {
            RunResult::Succeeded(out) => RunEnding {
                state: RunState::Succeeded,
                output: Some(canonical_json(out).map_err(|e| e.within("output"))?),
                error_code: None,
                error_message: None,
            },
            RunResult::Failed(err) => RunEnding {
                state: RunState::Failed,
                output: None,
                error_code: Some(err.code.as_str()),
                error_message: Some(truncate_message(&err.message)),
            },
        })
    }
}
