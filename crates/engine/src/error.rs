//! The engine's typed errors, each with a stable [`ErrorCode`] where one applies.
//!
//! Flat on purpose: a caller matches `EngineError::RunNotFound(_)` or
//! `EngineError::Admission(r)` directly. The store's errors are mapped here, once
//! ([`From<StoreError>`]); nothing else in the engine translates them.

use crate::config::ConfigError;
use std::fmt;
use std::time::Duration;
use tollgate_core::{
    AdmissionRejection, CostRejection, EffectKey, ErrorCode, InvalidInput, OutputViolation, RunId,
    TaskId,
};
use tollgate_store::StoreError;

/// The field in which a replayed submission (or pipeline start) differs from what its
/// idempotency key already names. docs/conformance.md#create-idempotency: the key decides; a replay that differs
/// is refused ([`EngineError::TaskConflict`], 409 over HTTP) naming this field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConflictField {
    /// The task's kind.
    Kind,
    /// The step name (default: the kind's name).
    Step,
    /// The model id (default: the configured default model).
    Model,
    /// The owner: another scope, another run, or run versus application.
    Owner,
    /// The source, its revision or `recompute`.
    Source,
    /// The request (compared by its canonical hash).
    Request,
    /// The pipeline a run was started from.
    Pipeline,
    /// The pipeline version a run was started from.
    Version,
    /// The run's scope.
    Scope,
    /// The run's input (compared in canonical form).
    Input,
}

impl ConflictField {
    /// The field's name as messages spell it (`kind`, `step`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictField::Kind => "kind",
            ConflictField::Step => "step",
            ConflictField::Model => "model",
            ConflictField::Owner => "owner",
            ConflictField::Source => "source",
            ConflictField::Request => "request",
            ConflictField::Pipeline => "pipeline",
            ConflictField::Version => "version",
            ConflictField::Scope => "scope",
            ConflictField::Input => "input",
        }
    }
}

impl fmt::Display for ConflictField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a [`Tollgate`](crate::Tollgate) call can fail with. A failed submission wrote
/// nothing.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The input is invalid or too large (docs/conformance.md#create-validate).
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The caller's effect key lies in a namespace the engine keeps for its own tasks
    /// (`run:` pipeline steps, `openai-` door calls; docs/api.md, "Effect keys").
    /// Nothing was written.
    #[error(transparent)]
    ReservedEffectKey(InvalidInput),
    /// Admission refused the task (docs/conformance.md#admission): rate limit, budget, concurrency, …
    #[error(transparent)]
    Admission(#[from] AdmissionRejection),
    /// docs/conformance.md#cost-limits refused the task: a spend limit (`WORKFLOW_AI_SPEND_BUDGET`), the token
    /// bucket (`WORKFLOW_AI_TOKEN_RATE_LIMIT`), or no output bound under a cost limit
    /// (`output_bound_required`). Nothing was written.
    #[error(transparent)]
    Cost(#[from] CostRejection),
    /// The run does not exist in the caller's app (or the caller may not see it).
    #[error("run {0} not found")]
    RunNotFound(String),
    /// The run a task names is canceled.
    #[error("run {0} is canceled")]
    RunCanceled(String),
    /// The task does not exist in the caller's app.
    #[error("task {0} not found")]
    TaskNotFound(String),
    /// The operation is not allowed in the row's current state.
    #[error("{0}")]
    InvalidState(String),
    /// A completion carried an output that violates the kind's contract.
    #[error(transparent)]
    InvalidOutput(#[from] OutputViolation),
    /// The effect key already names a task of the caller's that differs in `field`
    /// (raised by [`Tollgate::submit`](crate::Tollgate::submit) and every caller through
    /// it); nothing was created.
    #[error("effect key {:?} already names task {task} with a different {field}", effect_key.as_str())]
    TaskConflict {
        /// The key replayed.
        effect_key: EffectKey,
        /// The task it names.
        task: TaskId,
        /// The first field that differs.
        field: ConflictField,
    },
    /// The start key already started a run of the caller's that differs in `field`
    /// (raised by [`CallerView::start_pipeline`](crate::CallerView::start_pipeline)).
    #[error("the Idempotency-Key already started run {run} with a different {field}")]
    RunConflict {
        /// The run the key started.
        run: RunId,
        /// The first field that differs.
        field: ConflictField,
    },
    /// The database cannot be reached right now; retrying later is safe.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// The database holds a schema newer than this binary knows.
    #[error(
        "the database schema is at version {found}, newer than the {known} this binary knows; upgrade Tollgate"
    )]
    SchemaTooNew {
        /// Highest migration applied in the database.
        found: i64,
        /// Highest migration this binary ships.
        known: i64,
    },
    /// A stored row could not be read back (corruption or a foreign writer).
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// Any other database error.
    #[error("database error: {0}")]
    Database(String),
    /// The model id is not configured.
    #[error("unknown model `{model}` (configured models: {})", quoted(known))]
    UnknownModel {
        /// The id asked for.
        model: String,
        /// The configured ids.
        known: Vec<String>,
    },
    /// The budget policy does not exist or the app may not use it (docs/conformance.md#budget-policies).
    #[error(
        "budget policy `{budget}` is not allowed for app `{app}` (allowed: {})",
        quoted(allowed)
    )]
    BudgetNotAllowed {
        /// The caller's app.
        app: String,
        /// The policy asked for.
        budget: String,
        /// The policies the app may use.
        allowed: Vec<String>,
    },
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A notification transport could not be set up (NATS unreachable, …).
    #[error("notifications: {0}")]
    Notify(String),
    /// The effect key (or start key) names a task or run of the app that the caller may
    /// not see (another subject's): nothing of it is shown, and nothing was created.
    #[error(
        "this effect key is already used in the app by a task or run this key may not see: use another key"
    )]
    EffectKeyTaken,
    /// The call acts on every subject's tasks, and the caller is bound to one subject.
    #[error("{0}")]
    SubjectNotAllowed(&'static str),
    /// The app already has its `[notifications] waiters_per_app` calls waiting for tasks
    /// or runs (docs/api.md, "Waiting"): this one did not start (nothing was submitted).
    #[error(
        "app `{app}` already has {limit} calls waiting for tasks or runs, its limit of concurrent waiters ([notifications] waiters_per_app): retry shortly, or read without ?wait="
    )]
    TooManyWaiters {
        /// The caller's app.
        app: String,
        /// Its limit.
        limit: usize,
    },
}

/// The one translation of the store's errors.
impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Invalid(i) => EngineError::Invalid(i),
            StoreError::Admission(r) => EngineError::Admission(r),
            StoreError::Cost(r) => EngineError::Cost(r),
            StoreError::RunNotFound(r) => EngineError::RunNotFound(r),
            StoreError::RunCanceled(r) => EngineError::RunCanceled(r),
            StoreError::TaskNotFound(t) => EngineError::TaskNotFound(t),
            StoreError::InvalidState(m) => EngineError::InvalidState(m),
            StoreError::InvalidOutput(v) => EngineError::InvalidOutput(v),
            StoreError::Unavailable(m) => EngineError::Unavailable(m),
            StoreError::SchemaTooNew { found, known } => EngineError::SchemaTooNew { found, known },
            StoreError::Corrupt(m) => EngineError::Corrupt(m),
            StoreError::Database(m) => EngineError::Database(m),
        }
    }
}

impl EngineError {
    /// The stable error code, where one applies (`None` for infrastructure failures).
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            EngineError::Invalid(e) | EngineError::ReservedEffectKey(e) => Some(e.code()),
            EngineError::Admission(r) => Some(r.code()),
            EngineError::Cost(r) => Some(r.code()),
            EngineError::RunNotFound(_) => Some(ErrorCode::RunNotFound),
            EngineError::RunCanceled(_) => Some(ErrorCode::RunCanceled),
            EngineError::InvalidOutput(_) => Some(ErrorCode::InvalidModelOutput),
            EngineError::InvalidState(_) => Some(ErrorCode::InvalidState),
            EngineError::UnknownModel { .. } => Some(ErrorCode::UnknownModel),
            EngineError::BudgetNotAllowed { .. } => Some(ErrorCode::BudgetNotAllowed),
            EngineError::TaskNotFound(_)
            | EngineError::TaskConflict { .. }
            | EngineError::RunConflict { .. }
            | EngineError::Unavailable(_)
            | EngineError::SchemaTooNew { .. }
            | EngineError::Corrupt(_)
            | EngineError::Database(_)
            | EngineError::Config(_)
            | EngineError::Notify(_)
            | EngineError::EffectKeyTaken
            | EngineError::SubjectNotAllowed(_)
            | EngineError::TooManyWaiters { .. } => None,
        }
    }

    /// When to retry, where known (admission rate limit: when the next token arrives).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            EngineError::Admission(r) => r.retry_after(),
            EngineError::Cost(r) => r.retry_after(),
            // A waiter ends within the server's longest wait; most end much sooner.
            EngineError::TooManyWaiters { .. } => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// Whether the same call may succeed later unchanged (database unavailable).
    pub fn is_retryable(&self) -> bool {
        matches!(self, EngineError::Unavailable(_))
    }

    /// Whether the database failed (rather than the call's input, owner or admission).
    pub fn is_database(&self) -> bool {
        matches!(
            self,
            EngineError::Unavailable(_)
                | EngineError::Database(_)
                | EngineError::Corrupt(_)
                | EngineError::SchemaTooNew { .. }
        )
    }

    /// The same failure for another item of a batch (errors are not `Clone`): an
    /// unavailable database stays retryable, anything else keeps its message.
    pub(crate) fn copy_for_item(&self) -> EngineError {
        match self {
            EngineError::Unavailable(m) => EngineError::Unavailable(m.clone()),
            other => EngineError::Database(other.to_string()),
        }
    }
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
