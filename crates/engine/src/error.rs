//! The engine's typed errors, each with a stable [`ErrorCode`] where one applies.

use crate::config::ConfigError;
use std::time::Duration;
use tollgate_core::{ErrorCode, InvalidInput};
use tollgate_store::StoreError;

/// What a [`Tollgate`](crate::Tollgate) call can fail with. A failed submission wrote
/// nothing.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The store refused or failed (admission, run not found, database unavailable, …).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The input is invalid or too large (SPEC §3 step 1).
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The model id is not configured.
    #[error("unknown model `{model}` (configured models: {})", quoted(known))]
    UnknownModel {
        /// The id asked for.
        model: String,
        /// The configured ids.
        known: Vec<String>,
    },
    /// The budget policy does not exist or the app may not use it (SPEC §10).
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
}

impl EngineError {
    /// The stable error code, where one applies (`None` for infrastructure failures).
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            EngineError::Store(e) => e.code(),
            EngineError::Invalid(e) => Some(e.code()),
            EngineError::UnknownModel { .. } => Some(ErrorCode::UnknownModel),
            EngineError::BudgetNotAllowed { .. } => Some(ErrorCode::BudgetNotAllowed),
            EngineError::Config(_)
            | EngineError::Notify(_)
            | EngineError::EffectKeyTaken
            | EngineError::SubjectNotAllowed(_) => None,
        }
    }

    /// When to retry, where known (admission rate limit: when the next token arrives).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            EngineError::Store(StoreError::Admission(r)) => r.retry_after(),
            _ => None,
        }
    }

    /// Whether the same call may succeed later unchanged (database unavailable).
    pub fn is_retryable(&self) -> bool {
        matches!(self, EngineError::Store(e) if e.is_retryable())
    }
}

fn quoted(names: &[String]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}
