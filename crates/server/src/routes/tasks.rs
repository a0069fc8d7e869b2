//! `/v1/tasks…`: submit (one or a batch), get, wait, cancel, release; the listing (`GET /v1/tasks`).

use super::listing::{cursor, filter, limit, list_of, parse_rfc3339, query};
use super::{
    NoParams, SMALL_BODY_LIMIT, StrictQuery, WaitQuery, idempotency_key, json_body, parse_wait,
    view,
};
use crate::auth::Caller;
use crate::dto::{HashableObject, Identifier, KindName, TaskStatusName, TaskView};
use crate::error::ApiError;
use crate::{AppState, body_limit};
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;
use tollgate_core::{
    BudgetName, EffectKey, ModelId, RunId, ScopeId, SourceId, SourceRevision, StepKey, Task,
    TaskId, TaskKind, TaskStatus,
};
use tollgate_engine::{CallerView, SourceSpec, Submission, SubmissionOwner, Submitted, TaskWaiter};
use tollgate_store::list::TaskListQuery;
use utoipa::ToSchema;

/// `POST /v1/tasks` body.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SubmitBody {
    /// A kind: `generate_text`, `classify`, `classify_many`, `extract_data`, `chat`, …
    /// (`GET /v1/kinds`).
    #[schema(value_type = KindName)]
    pub kind: String,
    /// Model id (one of `GET /v1/models`); defaults to the configured default model.
    #[serde(default)]
    #[schema(value_type = Option<Identifier>)]
    pub model: Option<String>,
    /// The caller's name for the step; defaults to the kind.
    #[serde(default)]
    #[schema(value_type = Option<Identifier>)]
    pub step: Option<String>,
    /// The kind's request object (its schema per kind: `GET /v1/kinds`).
    #[schema(value_type = HashableObject)]
    pub request: Value,
    /// Application owner's scope. Exactly one of `scope` and `run_id`.
    #[serde(default)]
    #[schema(value_type = Option<Identifier>)]
    pub scope: Option<String>,
    /// Owning workflow run. Exactly one of `scope` and `run_id`.
    #[serde(default)]
    #[schema(
        pattern = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
    )]
    pub run_id: Option<String>,
    /// Makes the task scoped: cache and admission apply.
    #[serde(default)]
    pub source: Option<SourceBody>,
    /// Budget policy name; defaults to the app's default policy.
    #[serde(default)]
    #[schema(value_type = Option<Identifier>)]
    pub budget: Option<String>,
    /// The effect key, when not sent as the `Idempotency-Key` header.
    #[serde(default)]
    #[schema(value_type = Option<Identifier>)]
    pub effect_key: Option<String>,
    /// docs/conformance.md#priority: priority within its scope, 0 (lowest) to 9 (highest); default 5. Each
    /// level counts as one ageing step (default 60 s) of waiting, so low priority is
    /// never starved. Not compared on a replay of the effect key.
    #[serde(default)]
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i64>,
}

/// The source a scoped task is about.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SourceBody {
    /// Source id.
    #[schema(value_type = Identifier)]
    pub id: String,
    /// Source revision.
    #[schema(value_type = Identifier)]
    pub revision: String,
    /// Skip the cache and count as a new step.
    #[serde(default)]
    pub recompute: bool,
}

/// `POST /v1/tasks/batch` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// Up to 1,000 submissions, each with its own `effect_key`. Each item is answered
    /// in place: one that is not a valid submission gets its error in its result.
    #[schema(value_type = Vec<Value>, max_items = 1000)]
    pub tasks: Vec<Value>,
}

/// One item of a batch answer: the task, or the error it got.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchItem {
    /// HTTP status this item would have had on its own.
    #[schema(minimum = 200, maximum = 599)]
    pub status: u16,
    /// The task, when submitted.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub task: Option<TaskView>,
    /// The error, when refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub error: Option<crate::error::ErrorDetail>,
}

/// `POST /v1/tasks/batch` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchAnswer {
    /// One item per submission, in order.
    pub results: Vec<BatchItem>,
}

/// `POST /v1/tasks/release` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The task's effect key.
    #[schema(value_type = Identifier)]
    pub effect_key: String,
    /// The task's scope.
    #[schema(value_type = Identifier)]
    pub scope: String,
}

/// `POST /v1/tasks/release` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseAnswer {
    /// Always true: an unmatched release answers 404.
    pub released: bool,
}

pub(super) fn task_id(text: &str) -> Result<TaskId, ApiError> {
    // An id that cannot exist is reported like a missing one.
    TaskId::parse(text).map_err(|_| ApiError::not_found("task"))
}

/// A submission from its JSON body and the caller; `header_key` is `Idempotency-Key`.
fn submission(
    caller: &Caller,
    body: SubmitBody,
    header_key: Option<&EffectKey>,
) -> Result<Submission, ApiError> {
    let kind = TaskKind::parse(&body.kind).ok_or_else(|| {
        ApiError::invalid(format!(
            "unknown kind {:?}: use one of {}",
            body.kind,
            TaskKind::ALL.map(TaskKind::as_str).join(", ")
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
        priority: body
            .priority
            .map(tollgate_core::Priority::new)
            .transpose()?,
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

/// 201 for a new queued task; 200 for an existing one or a new one served from cache.
fn submit_status(submitted: &Submitted) -> StatusCode {
    if submitted.created && !submitted.task.cached() {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    }
}

#[utoipa::path(post, path = "/v1/tasks", tag = "tasks",
    params(("Idempotency-Key" = Option<Identifier>, Header, nullable = false, description = "the effect key (or the body's `effect_key`; one of them is required, and they must agree)"),
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
    caller: Caller,
    StrictQuery(q): StrictQuery<WaitQuery>,
    body: Body,
) -> Result<Response, ApiError> {
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
    // Hears the task's end from before it exists: nothing to read again to wait on it.
    // Its waiter slot is taken first: a call refused for want of one submits nothing.
    let waiter = wait.map(|_| view.waiter_with_slot()).transpose()?;
    // docs/engine.md, "Tasks claimed at creation": a task its caller waits for may start
    // at once; one it does not is answered `queued`.
    let submitted = match waiter {
        Some(_) => view.submit_awaited(sub).await?,
        None => view.submit(sub).await?,
    };
    let status = submit_status(&submitted);
    let task = waited_task(&view, waiter, submitted.task, wait).await?;
    Ok((status, Json(TaskView::of(&task, submitted.created))).into_response())
}

/// The task after waiting up to `wait` for it to end (as it was if it vanished meanwhile);
/// `waiter` was made before `task` was submitted or read.
async fn waited_task(
    view: &CallerView,
    waiter: Option<TaskWaiter>,
    task: Task,
    wait: Option<Duration>,
) -> Result<Task, ApiError> {
    match (wait, waiter) {
        (Some(wait), Some(waiter)) if !task.status.is_terminal() => Ok(view
            .wait_known(waiter, task.clone(), wait)
            .await?
            .unwrap_or(task)),
        _ => Ok(task),
    }
}

/// Items of a batch the engine is given at once (docs/api.md, "Batches").
const BATCH_PART: usize = 100;

/// A batch item answered with its error.
fn refused_item(e: ApiError) -> BatchItem {
    BatchItem {
        status: e.status().as_u16(),
        task: None,
        error: Some(e.body().error),
    }
}

#[utoipa::path(post, path = "/v1/tasks/batch", tag = "tasks", request_body = BatchBody,
    responses((status = 200, body = BatchAnswer, description = "one result per item, in order")),
    security(("api_key" = [])))]
pub(crate) async fn submit_batch(
    State(s): State<AppState>,
    headers: HeaderMap,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Json<BatchAnswer>, ApiError> {
    if headers.contains_key("idempotency-key") {
        return Err(ApiError::ambiguous(
            "a batch takes each item's effect_key, not an Idempotency-Key header",
        ));
    }
    // Held from before the body is read until the answer is built (docs/api.md, "Batches").
    let _slot = s.batches.enter(&caller.app)?;
    let body: BatchBody = json_body(&s, &headers, body, s.batches.max_body_bytes).await?;
    if body.tasks.len() > tollgate_engine::MAX_BATCH {
        return Err(ApiError::invalid(format!(
            "a batch holds at most {} tasks, got {}",
            tollgate_engine::MAX_BATCH,
            body.tasks.len()
        )));
    }
    // Each item is moved, never copied: the valid ones to the engine, the refused ones'
    // errors kept in place.
    let mut prepared: Vec<Result<(), ApiError>> = Vec::with_capacity(body.tasks.len());
    let mut valid: Vec<Submission> = Vec::with_capacity(body.tasks.len());
    for (i, item) in body.tasks.into_iter().enumerate() {
        match serde_json::from_value::<SubmitBody>(item)
            .map_err(|e| ApiError::malformed(format!("tasks[{i}]: {e}")))
            .and_then(|b| submission(&caller, b, None))
        {
            Ok(sub) => {
                valid.push(sub);
                prepared.push(Ok(()));
            }
            Err(e) => prepared.push(Err(e)),
        }
    }
    // In order, a part at a time: what the engine makes of a part (validated requests,
    // created tasks) lives only while that part is submitted, and each answer is cut
    // down to what is shown at once (docs/api.md, "Batches").
    let view = view(&s, &caller);
    let mut answered = Vec::with_capacity(valid.len());
    let mut valid = valid.into_iter();
    loop {
        let part: Vec<Submission> = valid.by_ref().take(BATCH_PART).collect();
        if part.is_empty() {
            break;
        }
        for answer in view.submit_many(part).await? {
            answered.push(match answer {
                Ok(submitted) => BatchItem {
                    status: submit_status(&submitted).as_u16(),
                    task: Some(TaskView::of(&submitted.task, submitted.created)),
                    error: None,
                },
                Err(e) => refused_item(ApiError::from(e)),
            });
        }
    }
    let mut answered = answered.into_iter();
    let mut results = Vec::with_capacity(prepared.len());
    for p in prepared {
        results.push(match p {
            Ok(()) => answered.next().unwrap_or_else(|| {
                refused_item(ApiError::internal(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "a batch item got no answer",
                ))
            }),
            Err(e) => refused_item(e),
        });
    }
    crate::memory::give_back_freed();
    Ok(Json(BatchAnswer { results }))
}

#[utoipa::path(get, path = "/v1/tasks/{id}", tag = "tasks",
    params(("id" = String, Path, description = "the task id"),
        ("wait" = Option<String>, Query, pattern = r"^[0-9]{1,9}(ms|s|m|h)?$", description = "long-poll: answer once the task is terminal or this long passed: a number of seconds, or a number with `ms`, `s`, `m` or `h` (at most the server's `max_wait`), like submit's wait")),
    responses((status = 200, body = TaskView), (status = 404, body = crate::error::ErrorBody, description = "no such task in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_task(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<WaitQuery>,
) -> Result<Json<TaskView>, ApiError> {
    let wait = parse_wait(q.wait.as_deref(), s.max_wait)?;
    let view = view(&s, &caller);
    let id = task_id(&id)?;
    let waiter = wait.map(|_| view.waiter());
    let task = view
        .get(id)
        .await?
        .ok_or_else(|| ApiError::not_found("task"))?;
    let task = waited_task(&view, waiter, task, wait).await?;
    let attempts = view.attempts(&task).await?;
    Ok(Json(TaskView::detail(&task, &attempts)))
}

#[utoipa::path(post, path = "/v1/tasks/{id}/cancel", tag = "tasks",
    params(("id" = String, Path, description = "the task id")),
    responses((status = 200, body = TaskView, description = "the task, canceled unless it had ended"), (status = 404, body = crate::error::ErrorBody, description = "no such task in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn cancel_task(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Json<TaskView>, ApiError> {
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
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Json<ReleaseAnswer>, ApiError> {
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

/// A page of `GET /v1/tasks`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskPageView {
    /// Tasks, newest first.
    pub tasks: Vec<TaskView>,
    /// Pass as `next` for the following page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

/// Query of `GET /v1/tasks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TaskListParams {
    effect_key: Option<String>,
    scope: Option<String>,
    status: Option<String>,
    kind: Option<String>,
    step: Option<String>,
    source: Option<String>,
    run_id: Option<String>,
    created_after: Option<String>,
    created_before: Option<String>,
    error_code: Option<String>,
    limit: Option<u32>,
    next: Option<String>,
}

impl TaskListParams {
    fn is_listing(&self) -> bool {
        self.scope.is_some()
            || self.status.is_some()
            || self.kind.is_some()
            || self.step.is_some()
            || self.source.is_some()
            || self.run_id.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
            || self.error_code.is_some()
            || self.limit.is_some()
            || self.next.is_some()
    }
}

/// The `GET /v1/tasks` answer: one task for `?effect_key=`, a page otherwise.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum TasksAnswer {
    /// `?effect_key=…`: the task with that effect key.
    Task(Box<TaskView>),
    /// Without `effect_key`: a page of tasks.
    Page(TaskPageView),
}

#[utoipa::path(get, path = "/v1/tasks", tag = "tasks",
    params(
        ("effect_key" = Option<Identifier>, Query, description = "the task with this effect key (answers one task, not a page; no other parameter may be given with it)"),
        ("scope" = Option<Identifier>, Query, description = "only tasks of this scope"),
        ("status" = Option<Vec<TaskStatusName>>, Query, style = Form, explode = false, description = "only tasks in one of these statuses, comma-separated (`queued,running`)"),
        ("kind" = Option<crate::dto::KindName>, Query, description = "only tasks of this kind"),
        ("step" = Option<Identifier>, Query, description = "only tasks of this step key"),
        ("source" = Option<Identifier>, Query, description = "only tasks of this source id"),
        ("run_id" = Option<String>, Query, pattern = r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", description = "only tasks of this run"),
        ("created_after" = Option<String>, Query, format = DateTime, description = "only tasks created at or after this instant (RFC 3339)"),
        ("created_before" = Option<String>, Query, format = DateTime, description = "only tasks created before this instant (RFC 3339)"),
        ("error_code" = Option<String>, Query, min_length = 1, max_length = 64, pattern = r"^[A-Za-z0-9_]+$", description = "only tasks that ended with this error code (as `GET /v1/stats` counts them in `failures_by_code`)"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "page size (default 50, at most 500)"),
        ("next" = Option<String>, Query, pattern = r"^t1\.[0-9]{1,15}\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", description = "the `next` of the previous page (opaque: pass it back as given)")),
    responses((status = 200, body = TasksAnswer, description = "with `effect_key`: that task (`TaskView`); otherwise a page of the app's tasks, newest first (`TaskPageView`)"),
              (status = 404, body = crate::error::ErrorBody, description = "`effect_key` names no task of the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn list_tasks(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<TaskListParams>, QueryRejection>,
) -> Result<Json<TasksAnswer>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let view = view(&s, &caller);
    if let Some(key) = q.effect_key.clone() {
        if q.is_listing() {
            return Err(ApiError::ambiguous(
                "effect_key names one task: give it alone, or list with the other parameters",
            ));
        }
        let key = EffectKey::new(key).map_err(|_| ApiError::not_found("task"))?;
        let task = view
            .get_by_effect_key(&key)
            .await?
            .ok_or_else(|| ApiError::not_found("task"))?;
        let attempts = view.attempts(&task).await?;
        return Ok(Json(TasksAnswer::Task(Box::new(TaskView::detail(
            &task, &attempts,
        )))));
    }
    let query = TaskListQuery {
        scope: filter("scope", q.scope, ScopeId::new)?,
        statuses: list_of(
            "status",
            q.status,
            TaskStatus::parse,
            "queued, running, succeeded, failed, canceled",
        )?,
        kind: filter("kind", q.kind, |k| {
            TaskKind::parse(&k).ok_or("not one of the kinds (GET /v1/kinds lists them)")
        })?,
        step: filter("step", q.step, StepKey::new)?,
        source: filter("source", q.source, SourceId::new)?,
        run: filter("run_id", q.run_id, |r| RunId::parse(&r))?,
        created_after: filter("created_after", q.created_after, |t| parse_rfc3339(&t))?,
        created_before: filter("created_before", q.created_before, |t| parse_rfc3339(&t))?,
        error_code: filter("error_code", q.error_code, |c| {
            let valid = (1..=64).contains(&c.len())
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if valid {
                Ok(c)
            } else {
                Err("an error code is 1 to 64 of A-Z, a-z, 0-9 and _")
            }
        })?,
        subject: None,
        after: cursor(q.next, 't')?,
        limit: limit(q.limit)?,
    };
    let page = view.list_tasks(&query).await?;
    Ok(Json(TasksAnswer::Page(TaskPageView {
        tasks: page.items.iter().map(|t| TaskView::of(t, false)).collect(),
        next: page.next.map(|c| c.encode()),
    })))
}
