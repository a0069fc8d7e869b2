//! One id per request: generated here, answered in the `x-request-id` header of every
//! response and written into every log line of a failed request, so a generic 500 message
//! can be matched with the details in the server's log.

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

/// The response header that carries the request id.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

tokio::task_local! {
    static REQUEST_ID: String;
}

/// The id of the request being handled (`-` outside one).
pub fn current() -> String {
    REQUEST_ID
        .try_with(Clone::clone)
        .unwrap_or_else(|_| "-".to_string())
}

/// The id of the request's trace (docs/telemetry.md), logged beside the request id so a
/// log line leads to its trace (`-` when traces are off).
pub fn current_trace_id() -> String {
    tollgate_engine::telemetry::current_trace_id().unwrap_or_else(|| "-".to_string())
}

/// Middleware: a fresh id for the request, in scope while it is handled and in the
/// response's `x-request-id` header.
pub(crate) async fn layer(request: Request, next: Next) -> Response {
    let id = uuid::Uuid::now_v7().simple().to_string();
    let mut response = REQUEST_ID.scope(id.clone(), next.run(request)).await;
    if let Ok(v) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    response
}
