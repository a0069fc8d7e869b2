//! The store's typed errors.

use tollgate_core::{AdmissionRejection, CostRejection, ErrorCode, InvalidInput, OutputViolation};

/// What a store call can fail with. Every variant changes nothing in the database.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The input is invalid (docs/conformance.md#create-validate).
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// Admission refused the task (docs/conformance.md#admission).
    #[error(transparent)]
    Admission(#[from] AdmissionRejection),
    /// The cost checks refused the task (docs/conformance.md#money-and-tokens).
    #[error(transparent)]
    Cost(#[from] CostRejection),
    /// The run a task names does not exist in the caller's app.
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
    /// The database cannot be reached right now (connection lost, pool timed out). The
    /// call did not take effect; retrying later is safe.
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
}

impl StoreError {
    /// The stable error code where one applies.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            StoreError::Invalid(e) => Some(e.code()),
            StoreError::Admission(r) => Some(r.code()),
            StoreError::Cost(r) => Some(r.code()),
            StoreError::RunNotFound(_) => Some(ErrorCode::RunNotFound),
            StoreError::RunCanceled(_) => Some(ErrorCode::RunCanceled),
            StoreError::InvalidOutput(_) => Some(ErrorCode::InvalidModelOutput),
            StoreError::InvalidState(_) => Some(ErrorCode::InvalidState),
            _ => None,
        }
    }

    /// Whether the error concerns one item of a batch (its input, owner or admission)
    /// rather than the database: a batch reports it in the item's place and goes on.
    pub fn is_per_item(&self) -> bool {
        matches!(
            self,
            StoreError::Invalid(_)
                | StoreError::Admission(_)
                | StoreError::Cost(_)
                | StoreError::RunNotFound(_)
                | StoreError::RunCanceled(_)
                | StoreError::TaskNotFound(_)
                | StoreError::InvalidState(_)
                | StoreError::InvalidOutput(_)
        )
    }

    /// Whether retrying the same call later may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

impl From<sqlx::Error> for StoreError {
    fn from(e: sqlx::Error) -> Self {
        match &e {
            sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_) => StoreError::Unavailable(e.to_string()),
            sqlx::Error::Database(db) => {
                // SQLite busy/locked and Postgres connection-class (08xxx), shutdown (57P0x)
                // and serialization failures are transient.
                let code = db.code().map(|c| c.to_string()).unwrap_or_default();
                let transient =
                    matches!(code.as_str(), "5" | "6" | "517" | "261" | "40001" | "40P01")
                        || code.starts_with("08")
                        || code.starts_with("57P");
                if transient {
                    StoreError::Unavailable(e.to_string())
                } else {
                    StoreError::Database(e.to_string())
                }
            }
            _ => StoreError::Database(e.to_string()),
        }
    }
}

impl From<sqlx::migrate::MigrateError> for StoreError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        match e {
            sqlx::migrate::MigrateError::Execute(inner) => inner.into(),
            other => StoreError::Database(other.to_string()),
        }
    }
}
