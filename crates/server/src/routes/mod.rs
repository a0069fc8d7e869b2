//! The routes, one module per resource. Each handler takes its caller ([`Caller`],
//! authenticated by its extractor) and its query ([`StrictQuery`]), turns JSON into engine
//! calls, and turns the answer (or the typed error) into JSON. The rules themselves
//! (idempotency, defaults, visibility) are the engine's.

pub(crate) mod events;
mod listing;
pub(crate) mod meta;
pub(crate) mod pipelines;
pub(crate) mod runs;
pub(crate) mod scopes;
pub(crate) mod stats;
pub(crate) mod tasks;
pub(crate) mod webhooks;

use crate::AppState;
use crate::auth::{Caller, single_header};
use crate::error::ApiError;
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, FromRequestParts, Query};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, patch, post};
use futures::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use std::time::Duration;
use tollgate_core::{DurationSyntax, EffectKey, parse_duration};
use tollgate_engine::CallerView;

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/tasks", post(tasks::submit).get(tasks::list_tasks))
        .route("/v1/tasks/batch", post(tasks::submit_batch))
        .route("/v1/tasks/release", post(tasks::release))
        .route("/v1/tasks/{id}", get(tasks::get_task))
        .route("/v1/tasks/{id}/cancel", post(tasks::cancel_task))
        .route("/v1/tasks/{id}/events", get(events::task_events))
        .route(
            "/v1/scopes/{scope}/unreleased-sources",
            get(scopes::unreleased_sources),
        )
        .route(
            "/v1/scopes/{scope}/tasks",
            delete(scopes::delete_owner_data),
        )
        .route("/v1/runs", post(runs::create_run).get(runs::list_runs))
        .route("/v1/runs/{id}", get(runs::get_run))
        .route("/v1/runs/{id}/cancel", post(runs::cancel_run))
        .route(
            "/v1/pipelines",
            post(pipelines::register_pipeline).get(pipelines::list_pipelines),
        )
        .route("/v1/pipelines/{name}", get(pipelines::get_pipeline))
        .route(
            "/v1/pipelines/{name}/runs",
            post(pipelines::start_pipeline_run),
        )
        .route(
            "/v1/webhooks",
            post(webhooks::create_webhook).get(webhooks::list_webhooks),
        )
        .route(
            "/v1/webhooks/{id}",
            get(webhooks::get_webhook)
                .merge(patch(webhooks::update_webhook))
                .merge(delete(webhooks::delete_webhook)),
        )
        .route(
            "/v1/webhooks/{id}/deliveries",
            get(webhooks::list_deliveries),
        )
        .route(
            "/v1/webhooks/{id}/deliveries/{delivery}/replay",
            post(webhooks::replay_delivery),
        )
        .route("/v1/kinds", get(meta::kinds))
        .route("/v1/models", get(meta::models))
        .route("/openapi.json", get(meta::openapi))
        .route("/healthz", get(meta::healthz))
        .route("/readyz", get(meta::readyz))
        .route("/metrics", get(meta::metrics))
        .route("/v1/scopes", get(scopes::list_scopes))
        .route("/v1/scopes/{scope}", get(scopes::get_scope))
        .route("/v1/stats", get(stats::stats))
        .route("/v1/scopes/{scope}/usage", get(stats::scope_usage))
        .route("/v1/usage", get(stats::app_usage))
        .merge(crate::ui::routes())
        .fallback(|| async { ApiError::not_found("route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(axum::middleware::from_fn(require_json))
        .layer(axum::middleware::from_fn(refuse_invalid_query))
        .layer(axum::middleware::from_fn(refuse_large_heads))
        .layer(axum::middleware::map_response(envelope_errors))
        // Bodies are read by `read_body` with each route's own limit.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::telemetry::layer,
        ))
        .layer(axum::middleware::from_fn(crate::request_id::layer))
        .with_state(state)
}

/// `/metrics` alone (`[metrics] addr`): everything else is 404.
pub(crate) fn metrics_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(meta::metrics_only))
        .fallback(|| async { ApiError::not_found("route") })
        .layer(axum::middleware::map_response(envelope_errors))
        .with_state(state)
}

/// The most bytes a request's headers may take (each name, value and its `": "` and
/// line end): hyper refuses a head beyond its read buffer (about 400 KiB) only when it
/// meets the limit between two reads, so a larger head that arrives in one read could
/// pass; this makes the limit the same for every request (docs/api.md, 431).
const MOST_HEADER_BYTES: usize = 400 * 1024;

/// 431 for a request whose headers take more than [`MOST_HEADER_BYTES`].
async fn refuse_large_heads(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let size: usize = request
        .headers()
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if size > MOST_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "request_header_fields_too_large",
            format!(
                "the request's headers take {size} bytes; at most {MOST_HEADER_BYTES} are read"
            ),
        )
        .into_response();
    }
    next.run(request).await
}

/// 415 for a `POST` whose `Content-Type` says its body is not JSON (every body the API
/// takes is JSON; a request without the header is read as JSON).
async fn require_json(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    if request.method() == axum::http::Method::POST
        && let Some(value) = request.headers().get(header::CONTENT_TYPE)
    {
        let json = value
            .to_str()
            .ok()
            .and_then(|v| v.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase())
            .is_some_and(|m| m == "application/json" || m.ends_with("+json"));
        if !json {
            return ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "request bodies are JSON: send Content-Type: application/json",
            )
            .into_response();
        }
    }
    next.run(request).await
}

/// The code of an error answer that was not made by [`ApiError`] (axum's extractor
/// rejections and the like).
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "malformed_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::REQUEST_TIMEOUT => "request_timeout",
        StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
        StatusCode::URI_TOO_LONG => "uri_too_long",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "invalid_request",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => "request_header_fields_too_large",
        StatusCode::SERVICE_UNAVAILABLE => "unavailable",
        s if s.is_server_error() => "internal",
        _ => "client_error",
    }
}

/// Gives every error answer the JSON envelope: one that is not JSON already (an axum
/// extractor rejection's plain text, an empty body) keeps its status and headers, and its
/// text becomes the message.
async fn envelope_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (parts, body) = response.into_parts();
    let message = axum::body::to_bytes(body, 64 << 10)
        .await
        .ok()
        .and_then(|b| String::from_utf8(b.to_vec()).ok())
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| status.canonical_reason().unwrap_or("error").to_string());
    let mut enveloped = ApiError::new(status, code_for(status), message).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            enveloped
                .headers_mut()
                .entry(name)
                .or_insert_with(|| value.clone());
        }
    }
    enveloped
}

/// Most bytes a client may keep sending after it went over its limit: they are read and
/// thrown away so the client gets a clean 413 instead of a reset connection. Counted past
/// each route's own limit, so a body just over the largest limit (a batch's
/// `[server] max_batch_body_bytes`) is drained too, not cut off mid-write.
const DRAIN_LIMIT: usize = 64 << 20;

/// Bodies of the small endpoints (release, runs, pipeline definitions).
const SMALL_BODY_LIMIT: usize = 1 << 20;

/// Reads a body of at most `limit` bytes within `s.body_read_timeout`. A longer one is
/// drained (up to [`DRAIN_LIMIT`] bytes past `limit`) and answered 413, so nothing of it
/// is kept in memory and the client, still sending, gets a clean answer rather than a
/// reset connection.
/// A client that sent `Expect: 100-continue` is waiting for leave to send: a
/// `Content-Length` over the limit is answered 413 before a byte is read (never
/// `100 Continue`), and so is one over the drain limit. A body still unfinished at the
/// deadline is answered 408.
pub(crate) async fn read_body(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<Bytes, ApiError> {
    use http_body::Body as _;
    let expects_continue = headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    let declared = body.size_hint().lower();
    let drain = limit.saturating_add(DRAIN_LIMIT);
    if declared > drain as u64 || (expects_continue && declared > limit as u64) {
        return Err(ApiError::too_large(format!(
            "the HTTP body is larger than {limit} bytes"
        )));
    }
    let read = async {
        let mut stream = body.into_data_stream();
        // What the client declared, within the limit: no regrowth (and no doubled peak).
        let mut buf = Vec::with_capacity(usize::try_from(declared).unwrap_or(0).min(limit));
        let mut total = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::malformed(format!("cannot read the body: {e}")))?;
            total = total.saturating_add(chunk.len());
            if total > limit {
                if total > drain {
                    break;
                }
                continue;
            }
            buf.extend_from_slice(&chunk);
        }
        if total > limit {
            return Err(ApiError::too_large(format!(
                "the HTTP body is larger than {limit} bytes"
            )));
        }
        Ok(Bytes::from(buf))
    };
    tokio::time::timeout(s.body_read_timeout, read)
        .await
        .unwrap_or_else(|_| {
            Err(ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                format!(
                    "the request body did not arrive within {}",
                    humantime::format_duration(s.body_read_timeout)
                ),
            ))
        })
}

/// Reads a JSON body: 413 beyond `limit`, 400 for anything not the shape and for a
/// key named twice in one object, at any depth (`ambiguous_request`).
async fn json_body<T: DeserializeOwned>(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = read_body(s, headers, body, limit).await?;
    let value = tollgate_core::json::parse_unambiguous(&bytes).map_err(|e| {
        if e.is_data() {
            ApiError::ambiguous(format!("invalid JSON body: {e}"))
        } else {
            ApiError::malformed(format!("invalid JSON body: {e}"))
        }
    })?;
    serde_json::from_value(value)
        .map_err(|e| ApiError::malformed(format!("invalid JSON body: {e}")))
}

/// The query parameters of a route: each route's struct refuses unknown and repeated
/// parameters (`#[serde(deny_unknown_fields)]`), answered 400 naming them.
#[derive(Debug)]
pub(crate) struct StrictQuery<T>(pub(crate) T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for StrictQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| StrictQuery(v))
            .map_err(|e| ApiError::malformed(e.body_text()))
    }
}

/// Refuses a query string that is not UTF-8 once percent-decoded (400): decoding it
/// lossily would turn `?scope=%FF` into U+FFFD and match a scope of that name.
async fn refuse_invalid_query(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if let Some(query) = request.uri().query() {
        let bad = query
            .split('&')
            .flat_map(|pair| pair.splitn(2, '='))
            .find(|part| {
                percent_encoding::percent_decode_str(part)
                    .decode_utf8()
                    .is_err()
            });
        if let Some(part) = bad {
            return ApiError::malformed(format!(
                "the query parameter {part:?} is not UTF-8 once percent-decoded"
            ))
            .into_response();
        }
    }
    next.run(request).await
}

/// The authenticated caller of a route (401 without a valid key).
impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        state.auth.authenticate(&parts.headers)
    }
}

/// The query of a route that takes no parameters: any parameter is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoParams {}

/// The engine as the caller sees it (its app, and its subject's share of it).
pub(crate) fn view(s: &AppState, caller: &Caller) -> CallerView {
    s.tollgate
        .as_caller(caller.app.clone(), caller.visibility.clone())
}

/// The `Idempotency-Key` header: once, UTF-8, and an identifier like every other.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<EffectKey>, ApiError> {
    Ok(single_header(headers, "idempotency-key")?
        .map(|k| EffectKey::new(k).map_err(|e| e.for_field("Idempotency-Key")))
        .transpose()?)
}

/// `?wait=`: a number of seconds (`30`) or a number with a unit, `ms`, `s`, `m` or `h`
/// (`500ms`, `30s`, `2m`), at most nine digits ([`DurationSyntax::Strict`]); capped at the
/// server's maximum. The OpenAPI document declares exactly this syntax as the parameter's
/// pattern.
fn parse_wait(text: Option<&str>, max: Duration) -> Result<Option<Duration>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let wait = parse_duration(text, DurationSyntax::Strict)
        .map_err(|e| ApiError::malformed(format!("wait={e}")))?;
    Ok(Some(wait.min(max)))
}

/// `?wait=` alone.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitQuery {
    wait: Option<String>,
}
