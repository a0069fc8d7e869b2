//! `/v1/runs…`: workflow runs.

use super::listing::{cursor, filter, limit, list_of, query};
use super::pipelines::PipelineProgressView;
use super::{NoParams, SMALL_BODY_LIMIT, StrictQuery, WaitQuery, json_body, parse_wait, view};
use crate::AppState;
use crate::auth::Caller;
use crate::dto::{HashableObject, Identifier, RunStateName, SubjectView, TaskErrorView};
use crate::error::ApiError;
use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tollgate_core::{PipelineName, Run, RunId, RunState, ScopeId};
use tollgate_engine::{CallerView, PipelineProgress};
use tollgate_store::list::{ListedRun, RunListQuery};
use utoipa::ToSchema;

/// `POST /v1/runs` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunBody {
    /// The scope the run's tasks are admitted and cached in.
    #[schema(value_type = Identifier)]
    pub scope: String,
    /// The run's input: a JSON object (default `{}`).
    #[serde(default)]
    #[schema(value_type = HashableObject)]
    pub input: serde_json::Map<String, Value>,
}

/// A workflow run (docs/conformance.md#workflow-runs).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunView {
    /// Run id.
    pub id: String,
    /// Scope.
    pub scope: String,
    /// `running`, `waiting`, `succeeded`, `failed` or `canceled`.
    #[schema(value_type = RunStateName)]
    pub state: String,
    /// The subject the run's tasks are done for (`null`: none).
    pub subject: Option<SubjectView>,
    /// Whether cancellation was requested.
    pub cancel_requested: bool,
    /// The run's input (a JSON object).
    #[schema(value_type = HashableObject)]
    pub input: Value,
    /// The output, once succeeded.
    #[schema(value_type = Option<Value>, required = true)]
    pub output: Option<Value>,
    /// The error, once failed or canceled.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
    /// The task a waiting step waits on.
    #[schema(required = true)]
    pub waiting_on: Option<String>,
    /// Creation time.
    pub created_at: String,
    /// Last change.
    pub updated_at: String,
    /// For a run of a pipeline: its version and where each step stands (absent for
    /// other runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pipeline: Option<PipelineProgressView>,
}

impl RunView {
    /// The view of a run with its pipeline progress, if it is a pipeline run.
    pub fn with_pipeline(run: &Run, pipeline: Option<&PipelineProgress>) -> RunView {
        let mut view = RunView::from(run);
        view.pipeline = pipeline.map(PipelineProgressView::from);
        view
    }
}

impl From<&Run> for RunView {
    fn from(r: &Run) -> Self {
        RunView {
            id: r.id.to_string(),
            scope: r.scope.to_string(),
            state: r.state.as_str().to_string(),
            subject: SubjectView::of(r.subject.as_ref()),
            cancel_requested: r.cancel_requested,
            input: r.input.clone(),
            output: r.output.clone(),
            error: r.error.as_ref().map(TaskErrorView::from),
            waiting_on: r.waiting_on.as_ref().map(|d| d.key.to_string()),
            created_at: r.created_at.to_rfc3339(),
            updated_at: r.updated_at.to_rfc3339(),
            pipeline: None,
        }
    }
}

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|_| ApiError::not_found("run"))
}

#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = RunBody,
    responses((status = 201, body = RunView)), security(("api_key" = [])))]
pub(crate) async fn create_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Response, ApiError> {
    let body: RunBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let run = s
        .tollgate
        .create_run(tollgate_core::NewRun {
            trace_parent: None,
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
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<WaitQuery>,
) -> Result<Json<RunView>, ApiError> {
    let wait = parse_wait(q.wait.as_deref(), s.max_wait)?;
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
pub(crate) async fn run_view(view: &CallerView, run: &Run) -> Result<RunView, ApiError> {
    let pipeline = view.pipeline_run(run).await?;
    Ok(RunView::with_pipeline(run, pipeline.as_ref()))
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "the run id")),
    responses((status = 200, body = RunView), (status = 404, body = crate::error::ErrorBody, description = "no such run in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn cancel_run(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Json<RunView>, ApiError> {
    let view = view(&s, &caller);
    let cancel = view
        .cancel_run(run_id(&id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(run_view(&view, &cancel.run).await?))
}

/// A pipeline name and version, for runs of a pipeline.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunPipelineRef {
    /// The pipeline's name.
    pub name: String,
    /// The version the run runs.
    pub version: String,
}

/// A run in a listing (`GET /v1/runs/{id}` has its input, output and steps).
#[derive(Debug, Serialize, ToSchema)]
pub struct RunSummaryView {
    /// Run id.
    pub id: String,
    /// Scope.
    pub scope: String,
    /// `running`, `waiting`, `succeeded`, `failed` or `canceled`.
    #[schema(value_type = RunStateName)]
    pub state: String,
    /// The subject the run's tasks are done for (`null`: none).
    pub subject: Option<SubjectView>,
    /// Whether cancellation was requested.
    pub cancel_requested: bool,
    /// The error, once failed or canceled.
    #[schema(required = true)]
    pub error: Option<TaskErrorView>,
    /// The pipeline it runs (`null` for a plain workflow run).
    #[schema(required = true)]
    pub pipeline: Option<RunPipelineRef>,
    /// Creation time (RFC 3339, UTC).
    pub created_at: String,
    /// Last change.
    pub updated_at: String,
}

impl From<&ListedRun> for RunSummaryView {
    fn from(l: &ListedRun) -> Self {
        let r = &l.run;
        RunSummaryView {
            id: r.id.to_string(),
            scope: r.scope.to_string(),
            state: r.state.as_str().to_string(),
            subject: SubjectView::of(r.subject.as_ref()),
            cancel_requested: r.cancel_requested,
            error: r.error.as_ref().map(TaskErrorView::from),
            pipeline: l.pipeline.as_ref().map(|p| RunPipelineRef {
                name: p.name.to_string(),
                version: p.version.clone(),
            }),
            created_at: r.created_at.to_rfc3339(),
            updated_at: r.updated_at.to_rfc3339(),
        }
    }
}

/// `GET /v1/runs` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct RunPageView {
    /// Runs, newest first.
    pub runs: Vec<RunSummaryView>,
    /// Pass as `next` for the following page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RunListParams {
    scope: Option<String>,
    state: Option<String>,
    pipeline: Option<String>,
    limit: Option<u32>,
    next: Option<String>,
}

#[utoipa::path(get, path = "/v1/runs", tag = "runs",
    params(
        ("scope" = Option<Identifier>, Query, description = "only runs of this scope"),
        ("state" = Option<Vec<RunStateName>>, Query, style = Form, explode = false, description = "only runs in one of these states, comma-separated (`running,waiting`)"),
        ("pipeline" = Option<String>, Query, min_length = 1, max_length = 128, pattern = r"^[A-Za-z0-9_-][A-Za-z0-9_.-]*$", description = "only runs of this pipeline (a pipeline name: 1 to 128 letters, digits, `_`, `-` and `.`, not starting with `.`)"),
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "page size (default 50, at most 500)"),
        ("next" = Option<String>, Query, pattern = r"^r1\.[0-9]{1,15}\.[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", description = "the `next` of the previous page (opaque: pass it back as given)")),
    responses((status = 200, body = RunPageView, description = "the app's runs, newest first")),
    security(("api_key" = [])))]
pub(crate) async fn list_runs(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<RunListParams>, QueryRejection>,
) -> Result<Json<RunPageView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let query = RunListQuery {
        scope: filter("scope", q.scope, ScopeId::new)?,
        states: list_of(
            "state",
            q.state,
            RunState::parse,
            "running, waiting, succeeded, failed, canceled",
        )?,
        pipeline: filter("pipeline", q.pipeline, |name| {
            // The rule names are registered under, so a name no pipeline can have is 400.
            tollgate_core::pipeline::check_pipeline_name(&name)?;
            PipelineName::new(name)
        })?,
        subject: None,
        after: cursor(q.next, 'r')?,
        limit: limit(q.limit)?,
    };
    let page = view(&s, &caller).list_runs(&query).await?;
    Ok(Json(RunPageView {
        runs: page.items.iter().map(RunSummaryView::from).collect(),
        next: page.next.map(|c| c.encode()),
    }))
}
