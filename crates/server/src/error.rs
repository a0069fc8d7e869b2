//! Every error answer: `{"error": {"code", "message", "retry_after_s"?}}` with the status
//! docs/conformance.md#error-codes gives it. One mapping from typed errors to statuses, here and nowhere else.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use std::time::Duration;
use tollgate_core::{ErrorCode, InvalidInput};
use tollgate_engine::EngineError;
use tollgate_store::StoreError;
use utoipa::ToSchema;

/// 429: the app has all its waiter slots taken (docs/api.md, "Waiting").
pub const TOO_MANY_WAITERS: &str = "WORKFLOW_AI_TOO_MANY_WAITERS";
/// 429: the app has all its batch slots taken (docs/api.md, "Batches").
pub const TOO_MANY_BATCHES: &str = "WORKFLOW_AI_TOO_MANY_BATCHES";

/// The body of every error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable code: a docs/conformance.md#error-codes code (`WORKFLOW_AI_RATE_LIMIT`, …) or one of the service's
    /// own (`invalid_request`, `malformed_request`, `request_too_large`, `unauthorized`,
    /// `not_found`, `idempotency_key_conflict`, `unknown_model`, `budget_not_allowed`,
    /// `ambiguous_request`, `subject_not_allowed`, `method_not_allowed`, `request_timeout`,
    /// `uri_too_long`, `unsupported_media_type`, `request_header_fields_too_large`,
    /// `database_unavailable`, `internal`). A 5xx message never carries details: it names
    /// the request id (also in the `x-request-id` header) under which the server logged
    /// them.
    pub code: String,
    /// Human-readable explanation.
    pub message: String,
    /// Seconds until a retry may succeed, where known (admission rate limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, minimum = 1)]
    pub retry_after_s: Option<u64>,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: String,
    message: String,
    retry_after: Option<Duration>,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
            retry_after: None,
        }
    }

    /// A failure of the server itself (database, corrupt row, …): the details go to the
    /// log under the request id; the caller gets a generic message naming that id, never
    /// the details (they can hold database text).
    pub fn internal(status: StatusCode, code: &str, detail: impl std::fmt::Display) -> Self {
        let id = crate::request_id::current();
        let trace_id = crate::request_id::current_trace_id();
        tracing::error!(request_id = %id, trace_id = %trace_id, code, detail = %detail, "request failed");
        Self::new(
            status,
            code,
            format!("internal error: the server's log has the details under request id {id}"),
        )
    }

    /// 400: two values where one is expected (headers, JSON keys, query parameters).
    pub fn ambiguous(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "ambiguous_request", message)
    }

    /// 400: the body is not the JSON the endpoint takes.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "malformed_request", message)
    }

    /// 422: well-formed but invalid.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_request", message)
    }

    /// 404: not found, or not the caller's (never revealed as different).
    pub fn not_found(what: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("{what} not found"),
        )
    }

    /// 401: no key, or an unknown one.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", message)
    }

    /// 413: too large.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(StatusCode::PAYLOAD_TOO_LARGE, "request_too_large", message)
    }

    /// 429: one of the service's fair-share bounds (`code`), with when to retry.
    pub fn too_many(code: &str, message: impl Into<String>, retry_after: Duration) -> Self {
        ApiError {
            retry_after: Some(retry_after),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, code, message)
        }
    }

    /// 409: the effect key names a task with another request.
    pub fn idempotency_conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "idempotency_key_conflict", message)
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The body, for batch items that report errors in place.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.clone(),
                message: self.message.clone(),
                retry_after_s: self.retry_after.map(retry_seconds),
            },
        }
    }
}

/// Whole seconds to wait, rounded up, at least 1.
fn retry_seconds(d: Duration) -> u64 {
    let ms = d.as_millis();
    (ms.div_ceil(1000) as u64).max(1)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            let id = crate::request_id::current();
            let trace_id = crate::request_id::current_trace_id();
            tracing::error!(request_id = %id, trace_id = %trace_id, code = %self.code, message = %self.message, "request failed");
        }
        let retry = self.retry_after.map(retry_seconds);
        let mut response = (self.status, Json(self.body())).into_response();
        if let Some(s) = retry
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            response.headers_mut().insert(header::RETRY_AFTER, v);
        }
        response
    }
}

impl From<InvalidInput> for ApiError {
    fn from(e: InvalidInput) -> Self {
        match e {
            InvalidInput::TooLarge { .. } => ApiError::too_large(e.to_string()),
            InvalidInput::Field { .. } => ApiError::invalid(e.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        EngineError::from(e).into()
    }
}

/// The one mapping from the engine's errors to statuses and codes.
impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Invalid(i) => i.into(),
            // docs/api.md, "Effect keys".
            EngineError::ReservedEffectKey(i) => ApiError::new(
                StatusCode::BAD_REQUEST,
                "reserved_effect_key",
                i.to_string(),
            ),
            EngineError::Admission(r) => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: r.code().as_str().to_string(),
                message: r.to_string(),
                retry_after: r.retry_after(),
            },
            // docs/conformance.md#cost-limits: spend and token limits are admission (429, Retry-After where
            // known); a missing output bound is bad input (422).
            EngineError::Cost(r) if r.code() == ErrorCode::OutputBoundRequired => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                r.code().as_str(),
                r.to_string(),
            ),
            EngineError::Cost(r) => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: r.code().as_str().to_string(),
                message: r.to_string(),
                retry_after: r.retry_after(),
            },
            EngineError::RunNotFound(_) | EngineError::TaskNotFound(_) => {
                ApiError::new(StatusCode::NOT_FOUND, "not_found", e.to_string())
            }
            EngineError::RunCanceled(_) | EngineError::InvalidState(_) => ApiError::new(
                StatusCode::CONFLICT,
                e.code().map_or("conflict", ErrorCode::as_str),
                e.to_string(),
            ),
            EngineError::InvalidOutput(_) => ApiError::invalid(e.to_string()),
            EngineError::TaskConflict { .. }
            | EngineError::RunConflict { .. }
            | EngineError::EffectKeyTaken => ApiError::idempotency_conflict(e.to_string()),
            EngineError::TooManyWaiters { .. } => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                code: TOO_MANY_WAITERS.to_string(),
                message: e.to_string(),
                retry_after: e.retry_after(),
            },
            EngineError::SubjectNotAllowed(why) => {
                ApiError::new(StatusCode::FORBIDDEN, "subject_not_allowed", why)
            }
            EngineError::UnknownModel { .. } | EngineError::BudgetNotAllowed { .. } => {
                let code = e.code().map_or("invalid_request", ErrorCode::as_str);
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string())
            }
            EngineError::Unavailable(_) => {
                ApiError::internal(StatusCode::SERVICE_UNAVAILABLE, "database_unavailable", e)
            }
            EngineError::SchemaTooNew { .. }
            | EngineError::Corrupt(_)
            | EngineError::Database(_)
            | EngineError::Config(_)
            | EngineError::Notify(_) => {
                ApiError::internal(StatusCode::INTERNAL_SERVER_ERROR, "internal", e)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_failures_never_show_their_details() {
        let secret = "error returned from database: relation \"tasks\" does not exist";
        for e in [
            ApiError::from(StoreError::Database(secret.into())),
            ApiError::from(StoreError::Corrupt(secret.into())),
            ApiError::from(StoreError::Unavailable(secret.into())),
            ApiError::from(EngineError::Notify(secret.into())),
        ] {
            assert!(e.status().is_server_error(), "{e:?}");
            let body = e.body().error;
            assert!(!body.message.contains("relation"), "{}", body.message);
            assert!(body.message.contains("request id"), "{}", body.message);
        }
    }
}
