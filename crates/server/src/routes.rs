//! The routes. Each handler authenticates, turns JSON into engine calls, and turns the
//! answer (or the typed error) into JSON.

use crate::auth::{Caller, single_header};
use crate::dto::*;
use crate::error::ApiError;
use crate::{AppState, BATCH_BODY_LIMIT, body_limit};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::time::Duration;
use tollgate_core::kinds::{output_schema, request_schema};
use tollgate_core::{
    BudgetName, EffectKey, ModelId, PipelineName, Run, RunId, ScopeId, SourceId, SourceRevision,
    StepKey, Task, TaskId, TaskKind, TaskOwner, ValidatedRequest,
};
use tollgate_engine::{
    CallerView, PipelineStart, SourceSpec, Submission, SubmissionOwner, Submitted,
};
use tollgate_store::{ScopedSource, UnreleasedQuery};

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/tasks",
            post(submit).get(crate::list_routes::list_tasks),
        )
        .route("/v1/tasks/batch", post(submit_batch))
        .route("/v1/tasks/release", post(release))
        .route("/v1/tasks/{id}", get(get_task))
        .route("/v1/tasks/{id}/cancel", post(cancel_task))
        .route(
            "/v1/scopes/{scope}/unreleased-sources",
            get(unreleased_sources),
        )
        .route("/v1/scopes/{scope}/tasks", delete(delete_owner_data))
        .route("/v1/runs", post(create_run))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/runs/{id}/cancel", post(cancel_run))
        .route("/v1/pipelines", post(register_pipeline))
        .route("/v1/pipelines/{name}", get(get_pipeline))
        .route("/v1/pipelines/{name}/runs", post(start_pipeline_run))
        .route("/v1/kinds", get(kinds))
        .route("/v1/models", get(models))
        .route("/openapi.json", get(openapi))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(crate::list_routes::routes())
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
        .layer(axum::middleware::map_response(envelope_errors))
        // Bodies are read by `read_body` with each route's own limit.
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn(crate::request_id::layer))
        .with_state(state)
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

/// Largest body a client may keep sending after it went over its limit: it is read and
/// thrown away so the client gets a clean 413 instead of a reset connection.
const DRAIN_LIMIT: usize = 64 << 20;

/// Bodies of the small endpoints (release, runs, pipeline definitions).
const SMALL_BODY_LIMIT: usize = 1 << 20;

/// Reads a body of at most `limit` bytes within `s.body_read_timeout`. A longer one is
/// drained (up to [`DRAIN_LIMIT`]) and answered 413, so nothing of it is kept in memory
/// and the client, still sending, gets a clean answer rather than a reset connection.
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
    if declared > DRAIN_LIMIT as u64 || (expects_continue && declared > limit as u64) {
        return Err(ApiError::too_large(format!(
            "the HTTP body is larger than {limit} bytes"
        )));
    }
    let read = async {
        let mut stream = body.into_data_stream();
        let mut buf = Vec::new();
        let mut total = 0usize;
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| ApiError::malformed(format!("cannot read the body: {e}")))?;
            total = total.saturating_add(chunk.len());
            if total > limit {
                if total > DRAIN_LIMIT {
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

/// The query parameters of a route (each route's struct refuses unknown and repeated
/// parameters: 400 naming them).
fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::malformed(e.body_text()))
}

/// The query of a route that takes no parameters: any parameter is refused.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoParams {}

/// The engine as the caller sees it (its app, and its subject's share of it).
fn view(s: &AppState, caller: &Caller) -> CallerView {
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
/// (`500ms`, `30s`, `2m`), at most nine digits; capped at the server's maximum. The
/// OpenAPI document declares exactly this syntax as the parameter's pattern.
fn parse_wait(text: Option<&str>, max: Duration) -> Result<Option<Duration>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let millis_per = match unit {
        "ms" => Some(1),
        "" | "s" => Some(1_000),
        "m" => Some(60_000),
        "h" => Some(3_600_000),
        _ => None,
    };
    let (Some(per), Ok(n), 1..=9) = (millis_per, number.parse::<u64>(), digits) else {
        return Err(ApiError::malformed(format!(
            "wait={text:?} is not a duration like 30s: give a number of seconds, or a number \
             (at most nine digits) with ms, s, m or h"
        )));
    };
    Ok(Some(Duration::from_millis(n * per).min(max)))
}

fn task_id(text: &str) -> Result<TaskId, ApiError> {
    // An id that cannot exist is reported like a missing one.
    TaskId::parse(text).map_err(|_| ApiError::not_found("task"))
}

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|_| ApiError::not_found("run"))
}

/// A submission from its JSON body and the caller; `header_key` is `Idempotency-Key`.
fn submission(
    caller: &Caller,
    body: SubmitBody,
    header_key: Option<&EffectKey>,
) -> Result<Submission, ApiError> {
    let kind = TaskKind::parse(&body.kind).ok_or_else(|| {
        ApiError::invalid(format!(
            "unknown kind {:?}: use generate_text, classify, classify_many or extract_data",
            body.kind
        ))
    })?;
    let owner = match (body.scope, body.run_id) {
        (Some(scope), None) => SubmissionOwner::Application {
            scope: ScopeId::new(scope)?,
        },
        (None, Some(run)) => SubmissionOwner::Run(
            RunId::parse(&run)
                .map_err(|_| ApiError::invalid(format!("run_id {run:?} is not a valid run id")))?,
        ),
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "give exactly one owner: `scope` (application) or `run_id` (workflow run), not both",
            ));
        }
        (None, None) => {
            return Err(ApiError::invalid(
                "give exactly one owner: `scope` (application) or `run_id` (workflow run)",
            ));
        }
    };
    let key = match (header_key, body.effect_key.as_deref()) {
        (Some(h), Some(b)) if h.as_str() != b => {
            return Err(ApiError::invalid(
                "the Idempotency-Key header and the effect_key field differ",
            ));
        }
        (Some(k), _) => k.clone(),
        (None, Some(k)) => EffectKey::new(k)?,
        (None, None) => {
            return Err(ApiError::invalid(
                "an effect key is required: send the Idempotency-Key header or an effect_key field",
            ));
        }
    };
    Ok(Submission {
        app: caller.app.clone(),
        owner,
        subject: caller.subject.clone(),
        step: body.step.map(StepKey::new).transpose()?,
        effect_key: key,
        kind,
        request: body.request,
        model: body.model.map(ModelId::new).transpose()?,
        source: body
            .source
            .map(|s| -> Result<SourceSpec, ApiError> {
                Ok(SourceSpec {
                    id: SourceId::new(s.id)?,
                    revision: SourceRevision::new(s.revision)?,
                    recompute: s.recompute,
                })
            })
            .transpose()?,
        budget: body.budget.map(BudgetName::new).transpose()?,
    })
}

/// SPEC §3 step 2 answers the existing task for a taken effect key; over HTTP that is
/// only right when the submission is the same one (409 otherwise).
pub(crate) fn check_same_submission(
    s: &AppState,
    sub: &Submission,
    task: &Task,
) -> Result<(), ApiError> {
    let conflict = |what: &str| {
        Err(ApiError::idempotency_conflict(format!(
            "effect key {:?} already names task {} with a different {what}",
            task.effect_key.as_str(),
            task.id
        )))
    };
    if task.kind != sub.kind {
        return conflict("kind");
    }
    let step = sub.step.as_ref().map_or(sub.kind.as_str(), StepKey::as_str);
    if task.step.as_str() != step {
        return conflict("step");
    }
    let model = sub
        .model
        .clone()
        .unwrap_or_else(|| s.tollgate.models().default_id().clone());
    if task.model != model {
        return conflict("model");
    }
    let same_owner = match (&sub.owner, task.owner) {
        (SubmissionOwner::Application { scope }, TaskOwner::Application) => *scope == task.scope,
        (SubmissionOwner::Run(run), TaskOwner::Run { run_id }) => *run == run_id,
        _ => false,
    };
    if !same_owner {
        return conflict("owner");
    }
    let same_source = match (&sub.source, &task.source) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.id == b.id && a.revision == b.revision && a.recompute == b.recompute
        }
        _ => false,
    };
    if !same_source {
        return conflict("source");
    }
    let request = ValidatedRequest::new(sub.kind, &sub.request, usize::MAX)?;
    if request.input_hash() != task.input_hash {
        return conflict("request");
    }
    Ok(())
}

/// 201 for a new queued task; 200 for an existing one or a new one served from cache.
fn submit_status(submitted: &Submitted) -> StatusCode {
    if submitted.created && !submitted.task.cached() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitQuery {
    wait: Option<String>,
}

#[utoipa::path(post, path = "/v1/tasks", tag = "tasks",
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the effect key (or the body's `effect_key`; one of them is required, and they must agree)"),
           ("wait" = Option<String>, Query, pattern = r"^[0-9]{1,9}(ms|s|m|h)?$", description = "wait up to this long for a terminal state: a number of seconds, or a number with `ms`, `s`, `m` or `h` (at most the server's `max_wait`)")),
    request_body = SubmitBody,
    responses((status = 201, body = TaskView, description = "created and queued"),
              (status = 200, body = TaskView, description = "existing task, or served from cache"),
              (status = 404, body = crate::error::ErrorBody, description = "`run_id` names no run of the caller's app"),
              (status = 409, body = crate::error::ErrorBody, description = "the effect key names a task with another request")),
    security(("api_key" = [])))]
pub(crate) async fn submit(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<WaitQuery>, QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let wait = parse_wait(q.wait.as_deref(), s.max_wait)?;
    let header_key = idempotency_key(&headers)?;
    let body: SubmitBody = json_body(
        &s,
        &headers,
        body,
        body_limit(s.tollgate.config().max_request_bytes),
    )
    .await?;
    let sub = submission(&caller, body, header_key.as_ref())?;
    let view = view(&s, &caller);
    let submitted = view.submit(sub.clone()).await?;
    if !submitted.created {
        check_same_submission(&s, &sub, &submitted.task)?;
    }
    let status = submit_status(&submitted);
    let task = waited_task(&view, submitted.task, wait).await?;
    Ok((status, Json(TaskView::of(&task, submitted.created))).into_response())
}

/// The task after waiting up to `wait` for it to end (as it was if it vanished meanwhile).
async fn waited_task(
    view: &CallerView,
    task: Task,
    wait: Option<Duration>,
) -> Result<Task, ApiError> {
    match wait {
        Some(wait) if !task.status.is_terminal() => {
            Ok(view.wait(task.id, wait).await?.unwrap_or(task))
        }
        _ => Ok(task),
    }
}

#[utoipa::path(post, path = "/v1/tasks/batch", tag = "tasks", request_body = BatchBody,
    responses((status = 200, body = BatchAnswer, description = "one result per item, in order")),
    security(("api_key" = [])))]
pub(crate) async fn submit_batch(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
    body: Body,
) -> Result<Json<BatchAnswer>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::ambiguous(
            "a batch takes each item's effect_key, not an Idempotency-Key header",
        ));
    }
    let body: BatchBody = json_body(&s, &headers, body, BATCH_BODY_LIMIT).await?;
    if body.tasks.len() > tollgate_engine::MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "a batch holds at most {} tasks, got {}",
            tollgate_engine::MAX_BATCH,
            body.tasks.len()
        )));
    }
    let mut prepared: Vec<Result<Submission, ApiError>> = Vec::with_capacity(body.tasks.len());
    for (i, item) in body.tasks.into_iter().enumerate() {
        prepared.push(
            serde_json::from_value::<SubmitBody>(item)
                .map_err(|e| ApiError::malformed(format!("tasks[{i}]: {e}")))
                .and_then(|b| submission(&caller, b, None)),
        );
    }
    let valid: Vec<Submission> = prepared
        .iter()
        .filter_map(|p| p.as_ref().ok().cloned())
        .collect();
    let mut answers = view(&s, &caller)
        .submit_many(valid.clone())
        .await?
        .into_iter();
    let mut valid = valid.into_iter();
    let mut results = Vec::with_capacity(prepared.len());
    for p in prepared {
        let outcome = match p {
            Err(e) => Err(e),
            Ok(_) => {
                let sub = valid.next();
                match (answers.next(), sub) {
                    (Some(Ok(submitted)), Some(sub)) => {
                        if submitted.created {
                            Ok(submitted)
                        } else {
                            check_same_submission(&s, &sub, &submitted.task).map(|()| submitted)
                        }
                    }
                    (Some(Err(e)), _) => Err(ApiError::from(e)),
                    _ => Err(ApiError::internal(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal",
                        "a batch item got no answer",
                    )),
                }
            }
        };
        results.push(match outcome {
            Ok(submitted) => BatchItem {
                status: submit_status(&submitted).as_u16(),
                task: Some(TaskView::of(&submitted.task, submitted.created)),
                error: None,
            },
            Err(e) => BatchItem {
                status: e.status().as_u16(),
                task: None,
                error: Some(e.body().error),
            },
        });
    }
    Ok(Json(BatchAnswer { results }))
}

#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks",
    params(("id" = String, Path, description = "the task id"),
        ("wait" = Option<String>, Query, pattern = r"^[0-9]{1,9}(ms|s|m|h)?$", description = "long-poll: answer once the task is terminal or this long passed: a number of seconds, or a number with `ms`, `s`, `m` or `h` (at most the server's `max_wait`), like submit's wait")),
    responses((status = 200, body = TaskView), (status = 404, body = crate::error::ErrorBody, description = "no such task in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_task(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Json<TaskView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let wait = parse_wait(query(q)?.wait.as_deref(), s.max_wait)?;
    let view = view(&s, &caller);
    let task = view
        .get(task_id(&id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("task"))?;
    let task = waited_task(&view, task, wait).await?;
    Ok(Json(TaskView::detail(&task)))
}

#[utoipa::path(post, path = "/v1/tasks/{id}/cancel", tag = "tasks",
    params(("id" = String, Path, description = "the task id")),
    responses((status = 200, body = TaskView, description = "the task, canceled unless it had ended"), (status = 404, body = crate::error::ErrorBody, description = "no such task in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn cancel_task(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<TaskView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let task = view(&s, &caller)
        .cancel(task_id(&id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("task"))?;
    Ok(Json(TaskView::of(&task, false)))
}

#[utoipa::path(post, path = "/v1/tasks/release", tag = "tasks", request_body = ReleaseBody,
    responses((status = 200, body = ReleaseAnswer), (status = 404, body = crate::error::ErrorBody, description = "no application task with that effect key in that scope")),
    security(("api_key" = [])))]
pub(crate) async fn release(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
    body: Body,
) -> Result<Json<ReleaseAnswer>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let body: ReleaseBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let scope = ScopeId::new(body.scope)?;
    let key = EffectKey::new(body.effect_key)?;
    if view(&s, &caller).release(&scope, &key).await? {
        Ok(Json(ReleaseAnswer { released: true }))
    } else {
        Err(ApiError::not_found(
            "application task with that effect key in that scope",
        ))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnreleasedParams {
    step: Option<String>,
    after: Option<String>,
}

#[utoipa::path(get, path = "/v1/scopes/{scope}/unreleased-sources", tag = "scopes",
    params(("scope" = String, Path, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the scope"),
           ("step" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only tasks of this step"),
           ("after" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the `next` of the previous page")),
    responses((status = 200, body = UnreleasedPageView)), security(("api_key" = [])))]
pub(crate) async fn unreleased_sources(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(scope): Path<String>,
    q: Result<Query<UnreleasedParams>, QueryRejection>,
) -> Result<Json<UnreleasedPageView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let scope = ScopeId::new(scope)?;
    let query = UnreleasedQuery {
        scope: Some(scope.clone()),
        step: q.step.map(StepKey::new).transpose()?,
        after: q
            .after
            .map(|a| -> Result<ScopedSource, ApiError> {
                Ok(ScopedSource {
                    scope: scope.clone(),
                    source: SourceId::new(a)?,
                })
            })
            .transpose()?,
        limit: 0,
        subject: None,
    };
    let page = view(&s, &caller).list_unreleased_sources(&query).await?;
    Ok(Json(UnreleasedPageView {
        sources: page
            .sources
            .into_iter()
            .map(|p| UnreleasedSourceView {
                scope: p.scope.into_string(),
                source: p.source.into_string(),
            })
            .collect(),
        next: page.next.map(|c| c.source.into_string()),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteParams {
    source: Option<String>,
}

#[utoipa::path(delete, path = "/v1/scopes/{scope}/tasks", tag = "scopes",
    params(("scope" = String, Path, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the scope"),
           ("source" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only this source's tasks")),
    responses((status = 200, body = DeletedAnswer)), security(("api_key" = [])))]
pub(crate) async fn delete_owner_data(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(scope): Path<String>,
    q: Result<Query<DeleteParams>, QueryRejection>,
) -> Result<Json<DeletedAnswer>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let scope = ScopeId::new(scope)?;
    let source = q.source.map(SourceId::new).transpose()?;
    let deleted = view(&s, &caller)
        .delete_owner_data(&scope, source.as_ref())
        .await?;
    Ok(Json(DeletedAnswer { deleted }))
}

#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = RunBody,
    responses((status = 201, body = RunView)), security(("api_key" = [])))]
pub(crate) async fn create_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let body: RunBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let run = s
        .tollgate
        .create_run(tollgate_core::NewRun {
            app: caller.app,
            scope: ScopeId::new(body.scope)?,
            subject: caller.subject,
            input: Value::Object(body.input),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(RunView::from(&run))).into_response())
}

#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "the run id"),
           ("wait" = Option<String>, Query, pattern = r"^[0-9]{1,9}(ms|s|m|h)?$", description = "wait up to this long for a terminal state: a number of seconds, or a number with `ms`, `s`, `m` or `h` (at most the server's `max_wait`)")),
    responses((status = 200, body = RunView, description = "the run; a pipeline run shows its steps under `pipeline`"),
              (status = 404, body = crate::error::ErrorBody, description = "no such run in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Json<RunView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let wait = parse_wait(query(q)?.wait.as_deref(), s.max_wait)?;
    let id = run_id(&id)?;
    let view = view(&s, &caller);
    let run = match wait {
        Some(wait) => view.wait_run(id, wait).await?,
        None => view.get_run(id).await?,
    }
    .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(run_view(&view, &run).await?))
}

/// A run's view, with its steps when it is a pipeline run.
async fn run_view(view: &CallerView, run: &Run) -> Result<RunView, ApiError> {
    let pipeline = view.pipeline_run(run).await?;
    Ok(RunView::with_pipeline(run, pipeline.as_ref()))
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "the run id")),
    responses((status = 200, body = RunView), (status = 404, body = crate::error::ErrorBody, description = "no such run in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn cancel_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<RunView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let view = view(&s, &caller);
    let cancel = view
        .cancel_run(run_id(&id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(run_view(&view, &cancel.run).await?))
}

/// A pipeline name from a path: one that cannot exist is reported like a missing one.
fn pipeline_name(text: String) -> Result<PipelineName, ApiError> {
    PipelineName::new(text).map_err(|_| ApiError::not_found("pipeline"))
}

#[utoipa::path(post, path = "/v1/pipelines", tag = "pipelines", request_body = PipelineBody,
    responses((status = 201, body = PipelineView, description = "a new version was registered"),
              (status = 200, body = PipelineView, description = "the app had this version already"),
              (status = 422, body = crate::error::ErrorBody, description = "an invalid definition: the message names the field and the reason; nothing is stored")),
    security(("api_key" = [])))]
pub(crate) async fn register_pipeline(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let body: PipelineBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let name = PipelineName::new(body.name)?;
    let (stored, created) = s
        .tollgate
        .register_pipeline(&caller.app, &name, &body.definition)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(PipelineView::of(&stored, created))).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VersionQuery {
    version: Option<String>,
}

#[utoipa::path(get, path = "/v1/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "the pipeline's name"),
           ("version" = Option<String>, Query, description = "a version (default: the newest)")),
    responses((status = 200, body = PipelineView), (status = 404, body = crate::error::ErrorBody, description = "no such pipeline (or version) in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_pipeline(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Result<Query<VersionQuery>, QueryRejection>,
) -> Result<Json<PipelineView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let version = query(q)?.version;
    let stored = s
        .tollgate
        .get_pipeline(&caller.app, &pipeline_name(name)?, version.as_deref())
        .await?
        .ok_or_else(|| ApiError::not_found(not_found_pipeline(version.as_deref())))?;
    Ok(Json(PipelineView::of(&stored, false)))
}

fn not_found_pipeline(version: Option<&str>) -> &'static str {
    if version.is_some() {
        "pipeline version"
    } else {
        "pipeline"
    }
}

#[utoipa::path(post, path = "/v1/pipelines/{name}/runs", tag = "pipelines",
    params(("name" = String, Path, description = "the pipeline's name"),
           ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "starts the run once per key: a retried start answers the run it started"),
           ("wait" = Option<String>, Query, pattern = r"^[0-9]{1,9}(ms|s|m|h)?$", description = "wait up to this long for the run to end: a number of seconds, or a number with `ms`, `s`, `m` or `h` (at most the server's `max_wait`)")),
    request_body = PipelineRunBody,
    responses((status = 201, body = RunView, description = "the run was started; `pipeline` shows its steps"),
              (status = 200, body = RunView, description = "the run this Idempotency-Key started earlier"),
              (status = 404, body = crate::error::ErrorBody, description = "no such pipeline (or version) in the caller's app"),
              (status = 409, body = crate::error::ErrorBody, description = "the Idempotency-Key started a different run (another pipeline, version, scope or input)"),
              (status = 422, body = crate::error::ErrorBody, description = "the input lacks what a step reads, or an invalid scope")),
    security(("api_key" = [])))]
pub(crate) async fn start_pipeline_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Result<Query<WaitQuery>, QueryRejection>,
    body: Body,
) -> Result<Response, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let wait = parse_wait(query(q)?.wait.as_deref(), s.max_wait)?;
    let start_key = idempotency_key(&headers)?;
    let body: PipelineRunBody = json_body(
        &s,
        &headers,
        body,
        body_limit(s.tollgate.config().max_request_bytes),
    )
    .await?;
    let name = pipeline_name(name)?;
    let scope = ScopeId::new(body.scope)?;
    let view = view(&s, &caller);
    let started = view
        .start_pipeline(PipelineStart {
            app: caller.app.clone(),
            subject: caller.subject.clone(),
            name: name.clone(),
            version: body.version.clone(),
            scope: scope.clone(),
            input: body.input.clone(),
            start_key,
        })
        .await?
        .ok_or_else(|| ApiError::not_found(not_found_pipeline(body.version.as_deref())))?;
    if !started.created {
        check_same_start(
            &s,
            &started.run,
            &name,
            body.version.as_deref(),
            &scope,
            &body.input,
        )
        .await?;
    }
    let status = if started.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let run = waited(&view, started.run, wait).await?;
    Ok((status, Json(run_view(&view, &run).await?)).into_response())
}

/// Equal as stored: the canonical forms (key order and number spelling aside).
fn same_json(a: &Value, b: &Value) -> bool {
    use tollgate_core::canonical::canonical_json;
    match (canonical_json(a), canonical_json(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

/// A replayed `Idempotency-Key` answers its run only for the same start (409 otherwise),
/// like a replayed task submission.
async fn check_same_start(
    s: &AppState,
    run: &Run,
    name: &PipelineName,
    version: Option<&str>,
    scope: &ScopeId,
    input: &Value,
) -> Result<(), ApiError> {
    let pipeline = s.tollgate.store().run_pipeline(&run.app, run.id).await;
    let pipeline = pipeline.map_err(tollgate_engine::EngineError::from)?;
    let what = match pipeline {
        Some(p) if &p.name != name => Some("pipeline"),
        Some(p) if version.is_some_and(|v| v != p.version) => Some("version"),
        None => Some("pipeline"),
        Some(_) if &run.scope != scope => Some("scope"),
        Some(_) if !same_json(&run.input, input) => Some("input"),
        Some(_) => None,
    };
    match what {
        None => Ok(()),
        Some(what) => Err(ApiError::idempotency_conflict(format!(
            "the Idempotency-Key already started run {} with a different {what}",
            run.id
        ))),
    }
}

/// The run after waiting up to `wait` for it to end (as it was if it vanished meanwhile).
async fn waited(view: &CallerView, run: Run, wait: Option<Duration>) -> Result<Run, ApiError> {
    let Some(wait) = wait else {
        return Ok(run);
    };
    Ok(view.wait_run(run.id, wait).await?.unwrap_or(run))
}

#[utoipa::path(get, path = "/v1/kinds", tag = "discovery",
    responses((status = 200, body = KindsAnswer)), security(("api_key" = [])))]
pub(crate) async fn kinds(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<KindsAnswer>, ApiError> {
    s.auth.authenticate(&headers)?;
    query(q)?;
    Ok(Json(KindsAnswer {
        kinds: TaskKind::ALL
            .into_iter()
            .map(|k| KindView {
                kind: k.as_str().to_string(),
                request_schema: request_schema(k),
                output_schema: output_schema(k),
            })
            .collect(),
    }))
}

#[utoipa::path(get, path = "/v1/models", tag = "discovery",
    responses((status = 200, body = ModelsAnswer)), security(("api_key" = [])))]
pub(crate) async fn models(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<ModelsAnswer>, ApiError> {
    s.auth.authenticate(&headers)?;
    query(q)?;
    let registry = s.tollgate.models();
    let mut models = Vec::new();
    for id in registry.ids() {
        let m = registry.resolve(Some(&id))?;
        models.push(ModelView {
            id: id.to_string(),
            provider: m.model_ref.provider.clone(),
            model: m.model_ref.model.clone(),
            config_hash: m.config_hash.as_str().to_string(),
            default: &id == registry.default_id(),
        });
    }
    Ok(Json(ModelsAnswer { models }))
}

pub(crate) async fn openapi(q: Result<Query<NoParams>, QueryRejection>) -> Response {
    if let Err(e) = query(q) {
        return e.into_response();
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::openapi_json(),
    )
        .into_response()
}

pub(crate) async fn healthz(q: Result<Query<NoParams>, QueryRejection>) -> Response {
    if let Err(e) = query(q) {
        return e.into_response();
    }
    Json(serde_json::json!({"status": "ok"})).into_response()
}

/// Longest `/readyz` waits for the database: a probe must get an answer, not a hang.
const READY_BOUND: std::time::Duration = std::time::Duration::from_secs(3);

pub(crate) async fn readyz(
    State(s): State<AppState>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Response {
    if let Err(e) = query(q) {
        return e.into_response();
    }
    let unavailable = |why: String| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "database_unavailable", why).into_response()
    };
    match tokio::time::timeout(READY_BOUND, s.tollgate.store().ping()).await {
        Ok(Ok(())) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Ok(Err(e)) => ApiError::internal(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            format!("the database does not answer: {e}"),
        )
        .into_response(),
        Err(_) => unavailable(format!(
            "the database did not answer within {}s",
            READY_BOUND.as_secs()
        )),
    }
}

pub(crate) async fn metrics(
    State(s): State<AppState>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Response {
    if let Err(e) = query(q) {
        return e.into_response();
    }
    let text = s.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
