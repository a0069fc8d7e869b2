//! Workflow runs (docs/conformance.md#workflow-runs): their states, what a waiting step waits on, and the stored run.

use super::{Subject, TaskError};
use crate::ids::{AppId, RunId, ScopeId, TaskId};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A workflow run's state (docs/conformance.md#workflow-runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Runnable: its workflow worker may drive it.
    Running,
    /// A step waits on a task.
    Waiting,
    /// Finished with an output.
    Succeeded,
    /// Finished with an error.
    Failed,
    /// Canceled by request.
    Canceled,
}

impl RunState {
    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Waiting => "waiting",
            RunState::Succeeded => "succeeded",
            RunState::Failed => "failed",
            RunState::Canceled => "canceled",
        }
    }

    /// Parses the stable string form.
    pub fn parse(s: &str) -> Option<RunState> {
        match s {
            "running" => Some(RunState::Running),
            "waiting" => Some(RunState::Waiting),
            "succeeded" => Some(RunState::Succeeded),
            "failed" => Some(RunState::Failed),
            "canceled" => Some(RunState::Canceled),
            _ => None,
        }
    }

    /// Succeeded, failed or canceled.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            RunState::Succeeded | RunState::Failed | RunState::Canceled
        )
    }
}

/// A dependency a run's step waits on (docs/conformance.md#workflow-runs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    /// Always `"ai.workflow-task"`.
    pub kind: String,
    /// The task id.
    pub key: TaskId,
}

impl Dependency {
    /// The dependency kind for AI tasks.
    pub const AI_TASK: &'static str = "ai.workflow-task";

    /// A dependency on a task.
    pub fn on_task(task: TaskId) -> Dependency {
        Dependency {
            kind: Self::AI_TASK.to_string(),
            key: task,
        }
    }
}

/// Everything needed to create a run.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// The app.
    pub app: AppId,
    /// The scope its tasks are admitted and cached in.
    pub scope: ScopeId,
    /// The subject its tasks are done for.
    pub subject: Option<Subject>,
    /// The run's input.
    pub input: Value,
    /// Where its tasks' traces continue (docs/telemetry.md, "Runs"): the run's span, the
    /// parent of every task submitted for it. `None` when traces are off.
    pub trace_parent: Option<crate::trace::TraceParent>,
}

/// A stored workflow run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// Identifier.
    pub id: RunId,
    /// Owning tenant.
    pub app: AppId,
    /// Scope of its tasks.
    pub scope: ScopeId,
    /// Subject of its tasks.
    pub subject: Option<Subject>,
    /// Lifecycle state.
    pub state: RunState,
    /// Whether cancellation was requested.
    pub cancel_requested: bool,
    /// The run's input.
    pub input: Value,
    /// The output, once succeeded.
    pub output: Option<Value>,
    /// The error, once failed or canceled.
    pub error: Option<TaskError>,
    /// What a waiting step waits on.
    pub waiting_on: Option<Dependency>,
    /// When it was created.
    pub created_at: Timestamp,
    /// Last change.
    pub updated_at: Timestamp,
    /// Last time it was woken by a terminal task (for its workflow worker).
    pub woken_at: Option<Timestamp>,
    /// Where its tasks' traces continue (docs/telemetry.md, "Runs"); `None` when it was
    /// created with traces off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_parent: Option<crate::trace::TraceParent>,
}
