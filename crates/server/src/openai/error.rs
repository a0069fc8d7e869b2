//! Errors of the OpenAI-compatible door in OpenAI's shape,
//! `{"error": {"message", "type", "param", "code"}}`, so the official SDKs raise their
//! own exception classes (`BadRequestError`, `RateLimitError`, …). Statuses come from
//! [`ApiError`] (the one mapping of typed errors to statuses), except that request-shape
//! errors, which Tollgate answers 422, are 400 here as OpenAI answers them.

use crate::error::ApiError;
use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tollgate_core::InvalidInput;
use tollgate_engine::EngineError;

/// An error answer of the door.
#[derive(Debug)]
pub(crate) struct OpenAiError {
    status: StatusCode,
    message: String,
    param: Option<String>,
    code: String,
    retry_after_s: Option<u64>,
    /// `x-should-retry`: tells the SDKs whether their own retry can help (a replay of a
    /// finished task answers the same error; an exhausted daily budget stays exhausted).
    should_retry: Option<bool>,
    task_id: Option<String>,
}

impl OpenAiError {
    pub(crate) fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        OpenAiError {
            status,
            message: message.into(),
            param: None,
            code: code.to_string(),
            retry_after_s: None,
            should_retry: None,
            task_id: None,
        }
    }

    /// 400 for a request OpenAI's API would refuse, or that Tollgate does not support.
    pub(crate) fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        OpenAiError::new(StatusCode::BAD_REQUEST, "invalid_request", message).param(param)
    }

    /// 400 for a field Tollgate does not support (never silently ignored).
    pub(crate) fn unsupported(param: impl Into<String>, message: impl Into<String>) -> Self {
        OpenAiError::new(StatusCode::BAD_REQUEST, "unsupported_parameter", message).param(param)
    }

    /// Names the parameter at fault (`""`: the body as a whole, `param: null`).
    pub(crate) fn param(mut self, param: impl Into<String>) -> Self {
        let param = param.into();
        self.param = (!param.is_empty()).then_some(param);
        self
    }

    pub(crate) fn should_retry(mut self, retry: bool) -> Self {
        self.should_retry = Some(retry);
        self
    }

    pub(crate) fn task(mut self, id: impl ToString) -> Self {
        self.task_id = Some(id.to_string());
        self
    }

    #[cfg(test)]
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    #[cfg(test)]
    pub(crate) fn param_name(&self) -> Option<&str> {
        self.param.as_deref()
    }

    /// The answer's body, `{"error": {"message", "type", "param", "code"}}` (also the
    /// data of a stream's error event).
    pub(crate) fn body(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind(),
                "param": self.param,
                "code": self.code,
            }
        })
    }

    /// OpenAI's `type` for a status.
    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            408 | 504 => "timeout_error",
            429 => "rate_limit_error",
            s if s >= 500 => "server_error",
            _ => "invalid_request_error",
        }
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        let body = e.body().error;
        let status = match e.status() {
            StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
            other => other,
        };
        let should_retry = match body.code.as_str() {
            // A window of 24 h does not free up within an SDK's retries.
            "WORKFLOW_AI_SOURCE_BUDGET" | "WORKFLOW_AI_DAILY_BUDGET" => Some(false),
            // The same key answers the same conflict.
            "idempotency_key_conflict" => Some(false),
            _ => None,
        };
        OpenAiError {
            status,
            message: body.message,
            param: None,
            code: body.code,
            retry_after_s: body.retry_after_s,
            should_retry,
            task_id: None,
        }
    }
}

/// The one mapping of the engine's errors to the door's answers: the status and code
/// [`ApiError`] gives them, in OpenAI's shape; a conflicting replay of a key names the
/// caller's task the key already names.
impl From<EngineError> for OpenAiError {
    fn from(e: EngineError) -> Self {
        let task = match &e {
            EngineError::TaskConflict { task, .. } => Some(*task),
            _ => None,
        };
        let error = OpenAiError::from(ApiError::from(e));
        match task {
            Some(id) => error.task(id),
            None => error,
        }
    }
}

impl From<InvalidInput> for OpenAiError {
    fn from(e: InvalidInput) -> Self {
        match &e {
            InvalidInput::Field { field, .. } => {
                let param = request_param(field);
                OpenAiError::from(ApiError::from(e.clone())).param(param)
            }
            InvalidInput::TooLarge { .. } => ApiError::from(e).into(),
        }
    }
}

/// The chat completions parameter a Tollgate request path names
/// (`request.max_output_tokens` → `max_tokens`, `request.messages[2]` → `messages[2]`).
fn request_param(field: &str) -> String {
    let rest = field
        .strip_prefix("request.")
        .or_else(|| field.strip_prefix("request"))
        .unwrap_or(field);
    match rest {
        "max_output_tokens" => "max_tokens".to_string(),
        "schema" => "response_format.json_schema.schema".to_string(),
        "" => String::new(),
        other => other.to_string(),
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(code = %self.code, message = %self.message, "openai door error");
        }
        let body = self.body();
        let mut response = (self.status, Json(body)).into_response();
        let headers = response.headers_mut();
        if let Some(s) = self.retry_after_s
            && let Ok(v) = HeaderValue::from_str(&s.to_string())
        {
            headers.insert(header::RETRY_AFTER, v);
        }
        if let Some(retry) = self.should_retry {
            headers.insert(
                "x-should-retry",
                HeaderValue::from_static(if retry { "true" } else { "false" }),
            );
        }
        if let Some(id) = self.task_id
            && let Ok(v) = HeaderValue::from_str(&id)
        {
            headers.insert(super::TASK_ID_HEADER, v);
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_paths_name_the_chat_parameter() {
        assert_eq!(request_param("request.max_output_tokens"), "max_tokens");
        assert_eq!(request_param("request.messages[1]"), "messages[1]");
        assert_eq!(request_param("request.top_p"), "top_p");
        assert_eq!(request_param("request"), "");
    }

    #[test]
    fn request_errors_are_400_and_budget_refusals_429() {
        let e = OpenAiError::from(ApiError::invalid("nope"));
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.kind(), "invalid_request_error");
        let e = OpenAiError::new(StatusCode::TOO_MANY_REQUESTS, "WORKFLOW_AI_RATE_LIMIT", "x");
        assert_eq!(e.kind(), "rate_limit_error");
    }
}
