//! `/v1/pipelines…`: register, read, start runs.

use super::listing::{PageParams, cursor, limit, query};
use super::runs::{RunView, run_view};
use super::{
    NoParams, SMALL_BODY_LIMIT, StrictQuery, WaitQuery, idempotency_key, json_body, parse_wait,
    view,
};
use crate::auth::Caller;
use crate::dto::{HashableObject, Identifier, KindName, TaskErrorView};
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
use tollgate_core::{PipelineName, Run, ScopeId};
use tollgate_engine::{CallerView, PipelineProgress, PipelineStart, PipelineStep};
use tollgate_store::StoredPipeline;
use tollgate_store::list::PipelineSummary;
use utoipa::ToSchema;

/// A pipeline definition's outline (the full rules are in docs/pipelines.md). Schema
/// only.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct DefinitionOutline {
    /// What the pipeline is for.
    #[serde(default)]
    description: Option<String>,
    /// The steps, each `{key, kind, request, model?, source?, budget?, depends_on?,
    /// retries?}`.
    #[schema(value_type = Vec<Object>, min_items = 1)]
    steps: Vec<Value>,
    /// The run's output: name → JSON Pointer (`/steps/<key>/output…` or `/input…`).
    output: std::collections::BTreeMap<String, String>,
}

/// A pipeline step's status.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum StepStatusName {
    /// Waiting for its dependencies, admission or a retry.
    Pending,
    /// Its task is queued.
    Queued,
    /// Its task runs.
    Running,
    /// Done, with an output.
    Succeeded,
    /// Done, with an error.
    Failed,
    /// Canceled.
    Canceled,
}

/// `POST /v1/pipelines` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineBody {
    /// The pipeline's name (letters, digits, `_`, `-`, `.`; not starting with `.`; at
    /// most 128 bytes): new versions are registered under the same name.
    #[schema(pattern = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,127}$")]
    pub name: String,
    /// The definition: `{"description"?, "steps": [...], "output": {...}}` (see
    /// docs/pipelines.md).
    #[schema(value_type = DefinitionOutline)]
    pub definition: Value,
}

/// A registered pipeline version.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineView {
    /// The pipeline's name.
    pub name: String,
    /// The version: SHA-256 of the canonical definition (the same definition always has
    /// the same version).
    pub version: String,
    /// Whether this call registered the version (false: the app had it already; reads
    /// say false).
    pub created: bool,
    /// The definition as stored (normalized).
    #[schema(value_type = Object)]
    pub definition: Value,
    /// When this version was first registered.
    pub created_at: String,
}

impl PipelineView {
    /// The view of a stored version; `created` says whether this call registered it.
    pub fn of(p: &StoredPipeline, created: bool) -> PipelineView {
        PipelineView {
            name: p.name.to_string(),
            version: p.version.clone(),
            created,
            definition: p.definition.clone(),
            created_at: p.created_at.to_rfc3339(),
        }
    }
}

fn empty_object() -> Value {
    Value::Object(Default::default())
}

/// A JSON object (anything else is refused as not the body's shape).
fn object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
    serde_json::Map::<String, Value>::deserialize(d).map(Value::Object)
}

/// `POST /v1/pipelines/{name}/runs` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PipelineRunBody {
    /// The scope the run's tasks are admitted and cached in.
    #[schema(value_type = Identifier)]
    pub scope: String,
    /// The run's input: what the steps' `/input…` references read (default `{}`).
    #[serde(default = "empty_object", deserialize_with = "object")]
    #[schema(value_type = HashableObject)]
    pub input: Value,
    /// The version to run (default: the newest).
    #[serde(default)]
    #[schema(value_type = Option<Identifier>)]
    pub version: Option<String>,
}

/// One step of a pipeline run.
#[derive(Debug, Serialize, ToSchema)]
pub struct StepView {
    /// The step's key.
    pub key: String,
    /// The step's task kind.
    #[schema(value_type = KindName)]
    pub kind: String,
    /// `pending` (waiting for dependencies, admission or a retry), `queued`, `running`,
    /// `succeeded`, `failed` or `canceled`.
    #[schema(value_type = StepStatusName)]
    pub status: String,
    /// Attempts submitted so far.
    pub attempts: u32,
    /// The latest attempt's task.
    #[schema(required = true)]
    pub task_id: Option<String>,
    /// The step's output, once succeeded.
    #[schema(value_type = Option<Value>, required = true)]
    pub output: Option<Value>,
    /// The latest attempt's error, once failed or canceled.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
}

impl From<&PipelineStep> for StepView {
    fn from(s: &PipelineStep) -> Self {
        StepView {
            key: s.key.to_string(),
            kind: s.kind.as_str().to_string(),
            status: s.status.as_str().to_string(),
            attempts: s.attempts,
            task_id: s.task_id.map(|t| t.to_string()),
            output: s.output.clone(),
            error: s.error.as_ref().map(TaskErrorView::from),
        }
    }
}

/// The pipeline side of a run.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineProgressView {
    /// The pipeline's name.
    pub name: String,
    /// The version the run runs.
    pub version: String,
    /// Every step, each after its dependencies.
    pub steps: Vec<StepView>,
}

impl From<&PipelineProgress> for PipelineProgressView {
    fn from(p: &PipelineProgress) -> Self {
        PipelineProgressView {
            name: p.name.to_string(),
            version: p.version.clone(),
            steps: p.steps.iter().map(StepView::from).collect(),
        }
    }
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
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Response, ApiError> {
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
           ("version" = Option<Identifier>, Query, description = "a version (default: the newest); an identifier")),
    responses((status = 200, body = PipelineView), (status = 404, body = crate::error::ErrorBody, description = "no such pipeline (or version) in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_pipeline(
    State(s): State<AppState>,
    Path(name): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<VersionQuery>,
) -> Result<Json<PipelineView>, ApiError> {
    let version = q.version;
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
           ("Idempotency-Key" = Option<Identifier>, Header, nullable = false, description = "starts the run once per key: a retried start answers the run it started"),
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
    caller: Caller,
    StrictQuery(q): StrictQuery<WaitQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let wait = parse_wait(q.wait.as_deref(), s.max_wait)?;
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
    let status = if started.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let run = waited(&view, started.run, wait).await?;
    Ok((status, Json(run_view(&view, &run).await?)).into_response())
}

/// The run after waiting up to `wait` for it to end (as it was if it vanished meanwhile).
async fn waited(view: &CallerView, run: Run, wait: Option<Duration>) -> Result<Run, ApiError> {
    let Some(wait) = wait else {
        return Ok(run);
    };
    Ok(view.wait_run(run.id, wait).await?.unwrap_or(run))
}

/// One version of a pipeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineVersionView {
    /// Content hash.
    pub version: String,
    /// When it was registered.
    pub created_at: String,
}

/// A pipeline with its versions.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelineSummaryView {
    /// The name.
    pub name: String,
    /// Versions, newest first (the first is what a run naming no version runs).
    pub versions: Vec<PipelineVersionView>,
}

impl From<&PipelineSummary> for PipelineSummaryView {
    fn from(p: &PipelineSummary) -> Self {
        PipelineSummaryView {
            name: p.name.to_string(),
            versions: p
                .versions
                .iter()
                .map(|v| PipelineVersionView {
                    version: v.version.clone(),
                    created_at: v.created_at.to_rfc3339(),
                })
                .collect(),
        }
    }
}

/// `GET /v1/pipelines` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct PipelinePageView {
    /// Pipelines in name order.
    pub pipelines: Vec<PipelineSummaryView>,
    /// Pass as `next` for the following page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

#[utoipa::path(get, path = "/v1/pipelines", tag = "pipelines",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "page size (default 50, at most 500)"),
        ("next" = Option<String>, Query, max_length = 259, pattern = r"^p1\.[^\x00-\x1F\x7F-\x9F]+$", description = "the `next` of the previous page (opaque: pass it back as given)")),
    responses((status = 200, body = PipelinePageView, description = "the app's pipelines in name order, each with its versions")),
    security(("api_key" = [])))]
pub(crate) async fn list_pipelines(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<PipelinePageView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let after = cursor(q.next, 'p')?;
    let page = view(&s, &caller)
        .list_pipelines(after.as_ref(), limit(q.limit)?)
        .await?;
    Ok(Json(PipelinePageView {
        pipelines: page.items.iter().map(PipelineSummaryView::from).collect(),
        next: page.next.map(|c| c.encode()),
    }))
}
