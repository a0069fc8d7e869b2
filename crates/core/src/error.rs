//! Stable error codes (docs/conformance.md#error-codes) and the typed errors of the pure domain.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Every error code Tollgate reports. The string forms are part of the public contract:
/// they appear in task rows, HTTP bodies and logs, and never change once published.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ErrorCode {
    /// docs/conformance.md#admission: too many distinct steps for one source in 24 h.
    #[serde(rename = "WORKFLOW_AI_SOURCE_BUDGET")]
    SourceBudget,
    /// docs/conformance.md#admission: too many distinct sources in the scope in 24 h.
    #[serde(rename = "WORKFLOW_AI_DAILY_BUDGET")]
    DailyBudget,
    /// docs/conformance.md#admission: scope or global concurrency cap reached.
    #[serde(rename = "WORKFLOW_AI_CAPACITY")]
    Capacity,
    /// docs/conformance.md#admission: the scope's token bucket is empty.
    #[serde(rename = "WORKFLOW_AI_RATE_LIMIT")]
    RateLimit,
    /// docs/conformance.md#cost-limits: a scope's or app's `usd_per_24_hours` would be exceeded.
    #[serde(rename = "WORKFLOW_AI_SPEND_BUDGET")]
    SpendBudget,
    /// docs/conformance.md#cost-reservation: the scope's model-token bucket lacks the task's reservation.
    #[serde(rename = "WORKFLOW_AI_TOKEN_RATE_LIMIT")]
    TokenRateLimit,
    /// docs/conformance.md#cost-reservation: a task under a USD or token limit has no output-token bound
    /// (`max_output_tokens`).
    #[serde(rename = "output_bound_required")]
    OutputBoundRequired,
    /// docs/conformance.md#sweep-queue-timeout: queued longer than the queue timeout.
    #[serde(rename = "WORKFLOW_AI_QUEUE_TIMEOUT")]
    QueueTimeout,
    /// docs/conformance.md#sweep-liveness: running without a heartbeat for the liveness timeout.
    #[serde(rename = "WORKFLOW_AI_INTERRUPTED")]
    Interrupted,
    /// docs/conformance.md#lifecycle, docs/conformance.md#sweeps: canceled by request (task or run).
    #[serde(rename = "WORKFLOW_AI_CANCELED")]
    Canceled,
    /// The request is malformed or invalid for its kind.
    #[serde(rename = "invalid_request")]
    InvalidRequest,
    /// The request is larger than the configured limit (measured on the stored bytes).
    #[serde(rename = "request_too_large")]
    RequestTooLarge,
    /// The model id is not configured.
    #[serde(rename = "unknown_model")]
    UnknownModel,
    /// The budget policy does not exist or the app may not use it.
    #[serde(rename = "budget_not_allowed")]
    BudgetNotAllowed,
    /// The model provider failed (after bounded retries).
    #[serde(rename = "provider_error")]
    ProviderError,
    /// The model's output violated the kind's contract (after bounded re-asks).
    #[serde(rename = "invalid_model_output")]
    InvalidModelOutput,
    /// The model's output is larger than the configured output limit
    /// (`max_output_bytes`, measured on the JSON that would be stored).
    #[serde(rename = "output_too_large")]
    OutputTooLarge,
    /// The run a task names does not exist (for this app).
    #[serde(rename = "run_not_found")]
    RunNotFound,
    /// The run a task names is canceled.
    #[serde(rename = "run_canceled")]
    RunCanceled,
    /// The state transition is not allowed from the current state.
    #[serde(rename = "invalid_state")]
    InvalidState,
}

impl ErrorCode {
    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::SourceBudget => "WORKFLOW_AI_SOURCE_BUDGET",
            ErrorCode::DailyBudget => "WORKFLOW_AI_DAILY_BUDGET",
            ErrorCode::Capacity => "WORKFLOW_AI_CAPACITY",
            ErrorCode::RateLimit => "WORKFLOW_AI_RATE_LIMIT",
            ErrorCode::SpendBudget => "WORKFLOW_AI_SPEND_BUDGET",
            ErrorCode::TokenRateLimit => "WORKFLOW_AI_TOKEN_RATE_LIMIT",
            ErrorCode::OutputBoundRequired => "output_bound_required",
            ErrorCode::QueueTimeout => "WORKFLOW_AI_QUEUE_TIMEOUT",
            ErrorCode::Interrupted => "WORKFLOW_AI_INTERRUPTED",
            ErrorCode::Canceled => "WORKFLOW_AI_CANCELED",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::RequestTooLarge => "request_too_large",
            ErrorCode::UnknownModel => "unknown_model",
            ErrorCode::BudgetNotAllowed => "budget_not_allowed",
            ErrorCode::ProviderError => "provider_error",
            ErrorCode::InvalidModelOutput => "invalid_model_output",
            ErrorCode::OutputTooLarge => "output_too_large",
            ErrorCode::RunNotFound => "run_not_found",
            ErrorCode::RunCanceled => "run_canceled",
            ErrorCode::InvalidState => "invalid_state",
        }
    }

    /// Every code, for documentation and round-trip tests.
    pub const ALL: [ErrorCode; 20] = [
        ErrorCode::SourceBudget,
        ErrorCode::DailyBudget,
        ErrorCode::Capacity,
        ErrorCode::RateLimit,
        ErrorCode::SpendBudget,
        ErrorCode::TokenRateLimit,
        ErrorCode::OutputBoundRequired,
        ErrorCode::QueueTimeout,
        ErrorCode::Interrupted,
        ErrorCode::Canceled,
        ErrorCode::InvalidRequest,
        ErrorCode::RequestTooLarge,
        ErrorCode::UnknownModel,
        ErrorCode::BudgetNotAllowed,
        ErrorCode::ProviderError,
        ErrorCode::InvalidModelOutput,
        ErrorCode::OutputTooLarge,
        ErrorCode::RunNotFound,
        ErrorCode::RunCanceled,
        ErrorCode::InvalidState,
    ];

    /// Parses the stable string form.
    pub fn parse(s: &str) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|c| c.as_str() == s)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Input that Tollgate refuses before writing anything (docs/conformance.md#create-validate).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidInput {
    /// A field is missing, of the wrong type, out of range or otherwise invalid.
    #[error("invalid {field}: {reason}")]
    Field {
        /// The field's path, e.g. `request.labels[2]`.
        field: String,
        /// What is wrong, in words a caller can act on.
        reason: String,
    },
    /// The canonical (stored) form of the request exceeds the size limit.
    #[error("request is {actual} bytes as stored, over the limit of {limit} bytes")]
    TooLarge {
        /// Bytes of the canonical JSON that would be stored.
        actual: usize,
        /// The configured limit.
        limit: usize,
    },
}

impl InvalidInput {
    /// Shorthand for a field error.
    pub fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidInput::Field {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// The error code this input error reports.
    pub fn code(&self) -> ErrorCode {
        match self {
            InvalidInput::Field { .. } => ErrorCode::InvalidRequest,
            InvalidInput::TooLarge { .. } => ErrorCode::RequestTooLarge,
        }
    }

    /// The same error about a field of another name (an identifier that arrived in a
    /// header rather than a body field, say).
    pub fn for_field(self, name: &str) -> Self {
        match self {
            InvalidInput::Field { reason, .. } => InvalidInput::Field {
                field: name.to_string(),
                reason,
            },
            other => other,
        }
    }

    /// Prefixes the field path (used when validating nested values).
    pub fn within(self, prefix: &str) -> Self {
        match self {
            InvalidInput::Field { field, reason } => InvalidInput::Field {
                field: if field.is_empty() {
                    prefix.to_string()
                } else if field.starts_with('[') {
                    format!("{prefix}{field}")
                } else {
                    format!("{prefix}.{field}")
                },
                reason,
            },
            other => other,
        }
    }
}

/// An output larger than the output limit: never stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the output is larger than the limit of {limit} bytes (max_output_bytes)")]
pub struct OutputTooLarge {
    /// The configured limit, in bytes of the stored JSON.
    pub limit: usize,
}

/// A model output that violates its kind's contract (docs/conformance.md#task-kinds). Never stored as success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid model output: {0}")]
pub struct OutputViolation(pub String);
