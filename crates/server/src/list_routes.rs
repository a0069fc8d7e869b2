//! SPEC §15 over HTTP: `GET /v1/tasks` (list, or one task by `?effect_key=`),
//! `GET /v1/runs`, `GET /v1/pipelines`, `GET /v1/scopes`, `GET /v1/scopes/{scope}` and
//! `GET /v1/stats`. Every answer is the caller's app alone (and, for a key bound to a
//! subject, that subject's tasks and runs alone); a bad filter or cursor is a 400 with
//! the error envelope, and nothing changes.

use crate::AppState;
use crate::auth::Caller;
use crate::dto::{RunStateName, SubjectView, TaskErrorView, TaskStatusName, TaskView};
use crate::error::ApiError;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::{Json, Router, routing::get};
use serde::{Deserialize, Serialize};
use tollgate_core::{
    EffectKey, PipelineName, RunId, RunState, ScopeId, SourceId, StepKey, TaskKind, TaskStatus,
    Timestamp,
};
use tollgate_engine::{CallerView, ScopeState, TaskStats, UsageReport};
use tollgate_store::list::{
    LIST_MAX_PAGE, ListCursor, ListedRun, PipelineSummary, RunListQuery, TaskListQuery,
};
use utoipa::ToSchema;

/// The listing routes, merged into the API's router.
pub(crate) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/runs", get(list_runs))
        .route("/v1/pipelines", get(list_pipelines))
        .route("/v1/scopes", get(list_scopes))
        .route("/v1/scopes/{scope}", get(get_scope))
        .route("/v1/stats", get(stats))
        .route("/v1/scopes/{scope}/usage", get(scope_usage))
        .route("/v1/usage", get(app_usage))
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    q.map(|Query(v)| v)
        .map_err(|e| ApiError::malformed(e.body_text()))
}

fn view(s: &AppState, caller: &Caller) -> CallerView {
    s.tollgate
        .as_caller(caller.app.clone(), caller.visibility.clone())
}

/// A filter's value, or 400 naming the parameter.
fn filter<T, E: std::fmt::Display>(
    name: &str,
    value: Option<String>,
    parse: impl FnOnce(String) -> Result<T, E>,
) -> Result<Option<T>, ApiError> {
    value
        .map(|v| parse(v).map_err(|e| ApiError::malformed(format!("{name}: {e}"))))
        .transpose()
}

fn limit(value: Option<u32>) -> Result<u32, ApiError> {
    match value {
        None => Ok(tollgate_store::list::LIST_DEFAULT_PAGE),
        Some(n @ 1..=LIST_MAX_PAGE) => Ok(n),
        Some(n) => Err(ApiError::malformed(format!(
            "limit: must be between 1 and {LIST_MAX_PAGE}, got {n}"
        ))),
    }
}

fn cursor(next: Option<String>, listing: char) -> Result<Option<ListCursor>, ApiError> {
    filter("next", next, |n| {
        ListCursor::decode(&n, listing).map_err(|_| "not a cursor this listing gave out")
    })
}

/// Values of a comma-separated list parameter (`status=queued,running`); empty items
/// (`status=queued,`) are refused.
fn list_of<T>(
    name: &str,
    value: Option<String>,
    parse: impl Fn(&str) -> Option<T>,
    allowed: &str,
) -> Result<Vec<T>, ApiError> {
    // An empty value is the empty list (`state=`, how an empty array is sent): no filter.
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(Vec::new());
    };
    value
        .split(',')
        .map(|v| {
            parse(v).ok_or_else(|| {
                ApiError::malformed(format!("{name}: {v:?} is not one of {allowed}"))
            })
        })
        .collect()
}

/// An RFC 3339 date-time (`2026-12-01T10:00:00Z`, `2026-12-01T11:00:00.5+01:00`) as
/// milliseconds since the epoch.
pub(crate) fn parse_rfc3339(text: &str) -> Result<Timestamp, String> {
    let bad = || format!("{text:?} is not an RFC 3339 date-time like 2026-12-01T10:00:00Z");
    let b = text.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let s = text.get(r).ok_or_else(bad)?;
        if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        s.parse::<i64>().map_err(|_| bad())
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return Err(bad());
    }
    if b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let mut i = 19;
    let mut millis = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let digits = &text[start..i.min(start + 3)];
        millis = digits.parse::<i64>().map_err(|_| bad())? * 10i64.pow(3 - digits.len() as u32);
    }
    let offset_minutes = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return Err(bad());
            }
            if *sign == b'+' {
                h * 60 + m
            } else {
                -(h * 60 + m)
            }
        }
        _ => return Err(bad()),
    };
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days_in_month = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Err(bad()),
    };
    if day < 1 || day > days_in_month || hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    // Days from the civil date (Howard Hinnant's algorithm); a leap second counts as :59.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_minutes * 60;
    Ok(Timestamp(seconds * 1000 + millis))
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
        ("effect_key" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the task with this effect key (answers one task, not a page; no other parameter may be given with it)"),
        ("scope" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only tasks of this scope"),
        ("status" = Option<Vec<TaskStatusName>>, Query, style = Form, explode = false, description = "only tasks in one of these statuses, comma-separated (`queued,running`)"),
        ("kind" = Option<crate::dto::KindName>, Query, description = "only tasks of this kind"),
        ("step" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only tasks of this step key"),
        ("source" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only tasks of this source id"),
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
        return Ok(Json(TasksAnswer::Task(Box::new(TaskView::detail(&task)))));
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
            TaskKind::parse(&k)
                .ok_or("not one of generate_text, classify, classify_many, extract_data")
        })?,
        step: filter("step", q.step, StepKey::new)?,
        source: filter("source", q.source, SourceId::new)?,
        run: filter("run_id", q.run_id, |r| RunId::parse(&r))?,
        created_after: filter("created_after", q.created_after, |t| parse_rfc3339(&t))?,
        created_before: filter("created_before", q.created_before, |t| parse_rfc3339(&t))?,
        subject: None,
        error_code: filter("error_code", q.error_code, |c| {
            let valid = (1..=64).contains(&c.len())
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if valid {
                Ok(c)
            } else {
                Err("an error code is 1 to 64 of A-Z, a-z, 0-9 and _")
            }
        })?,
        after: cursor(q.next, 't')?,
        limit: limit(q.limit)?,
    };
    let page = view.list_tasks(&query).await?;
    Ok(Json(TasksAnswer::Page(TaskPageView {
        tasks: page.items.iter().map(|t| TaskView::of(t, false)).collect(),
        next: page.next.map(|c| c.encode()),
    })))
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
        ("scope" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only runs of this scope"),
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct PageParams {
    limit: Option<u32>,
    next: Option<String>,
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

/// The budget policy in force for a scope (SPEC §10): the app's default policy.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyView {
    /// The policy's name.
    pub name: String,
    /// Distinct logical steps one source may have admitted in 24 h.
    pub max_steps_per_source: u32,
    /// Distinct sources the scope may have admitted in 24 h.
    pub sources_per_24_hours: u32,
    /// Admitted tasks of the scope that may be queued or running at once.
    pub scope_concurrent: u32,
    /// Admitted tasks of the whole server that may be queued or running at once.
    pub global_concurrent: u32,
    /// Token-bucket capacity.
    pub burst: u32,
    /// Token-bucket refill, tasks per minute.
    pub tasks_per_minute: u32,
    /// SPEC §13: the scope's spend limit in 24 h, USD (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_per_24_hours: Option<f64>,
    /// SPEC §13: the scope's model-token bucket refill, tokens per minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// SPEC §13: the scope's model-token bucket capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_burst: Option<u32>,
}

/// A scope's policy and live admission state (SPEC §4, §15).
#[derive(Debug, Serialize, ToSchema)]
pub struct ScopeView {
    /// The scope.
    pub scope: String,
    /// The policy in force (the app's default; a task may name another allowed one).
    pub policy: PolicyView,
    /// Tokens in the bucket now, out of `policy.burst` (fractions refill continuously).
    pub bucket_tokens: f64,
    /// Admitted tasks queued or running now, against `policy.scope_concurrent`.
    pub active: u64,
    /// Distinct sources admitted in the 24 h window, against `policy.sources_per_24_hours`.
    pub sources_in_window: u64,
    /// Distinct steps admitted in the window, all sources together.
    pub steps_in_window: u64,
    /// The most distinct steps any one source has in the window, against
    /// `policy.max_steps_per_source`.
    pub busiest_source_steps: u64,
    /// Admissions in the window.
    pub admissions_in_window: u64,
    /// The newest admission in the window.
    #[schema(required = true)]
    pub last_admitted_at: Option<String>,
    /// Spend and tokens in the window, settled plus reserved (SPEC §13; see
    /// `GET /v1/scopes/{scope}/usage` for the split).
    #[schema(required = true)]
    pub cost: Option<CostView>,
}

/// Spend and tokens of a scope (SPEC §13).
#[derive(Debug, Serialize, ToSchema)]
pub struct CostView {
    /// Settled plus reserved spend in the window, micro-dollars (US).
    pub spent_micros: u64,
    /// Settled plus reserved model tokens in the window.
    pub tokens: u64,
}

impl From<&ScopeState> for ScopeView {
    fn from(s: &ScopeState) -> Self {
        ScopeView {
            scope: s.scope.to_string(),
            policy: PolicyView {
                name: s.policy_name.to_string(),
                max_steps_per_source: s.policy.max_steps_per_source.get(),
                sources_per_24_hours: s.policy.sources_per_24_hours.get(),
                scope_concurrent: s.policy.scope_concurrent.get(),
                global_concurrent: s.policy.global_concurrent.get(),
                burst: s.policy.burst.get(),
                tasks_per_minute: s.policy.tasks_per_minute.get(),
                usd_per_24_hours: s
                    .policy
                    .cost
                    .scope_nano_per_24_hours
                    .map(|n| tollgate_core::cost::nano_to_usd(n.get() as i64)),
                tokens_per_minute: s.policy.cost.token_rate.map(|r| r.tokens_per_minute.get()),
                token_burst: s.policy.cost.token_rate.map(|r| r.token_burst.get()),
            },
            bucket_tokens: (s.bucket_tokens * 1000.0).round() / 1000.0,
            active: s.active,
            sources_in_window: s.sources_in_window,
            steps_in_window: s.steps_in_window,
            busiest_source_steps: s.busiest_source_steps,
            admissions_in_window: s.admissions_in_window,
            last_admitted_at: s.last_admitted_at.map(|t| t.to_rfc3339()),
            cost: s.cost.as_ref().map(|c| CostView {
                spent_micros: c.spent_micros,
                tokens: c.tokens,
            }),
        }
    }
}

/// `GET /v1/scopes` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScopePageView {
    /// Scopes with admission activity in the 24 h window, in name order.
    pub scopes: Vec<ScopeView>,
    /// Pass as `next` for the following page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

#[utoipa::path(get, path = "/v1/scopes", tag = "scopes",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "page size (default 50, at most 500)"),
        ("next" = Option<String>, Query, max_length = 259, pattern = r"^s1\.[^\x00-\x1F\x7F-\x9F]+$", description = "the `next` of the previous page (opaque: pass it back as given)")),
    responses((status = 200, body = ScopePageView, description = "the app's scopes with admitted tasks still active or an admission in the last 24 h, in name order"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: scopes count every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn list_scopes(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<ScopePageView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let after = cursor(q.next, 's')?;
    let page = view(&s, &caller)
        .list_scopes(after.as_ref(), limit(q.limit)?)
        .await?;
    Ok(Json(ScopePageView {
        scopes: page.items.iter().map(ScopeView::from).collect(),
        next: page.next.map(|c| c.encode()),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoParams {}

#[utoipa::path(get, path = "/v1/scopes/{scope}", tag = "scopes",
    params(("scope" = String, Path, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the scope")),
    responses((status = 200, body = ScopeView, description = "the policy in force and the live state (a scope never admitted into shows a full bucket and zeros)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: a scope's state counts every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn get_scope(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(scope): Path<String>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<ScopeView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let scope = ScopeId::new(scope)?;
    let state = view(&s, &caller).scope(&scope).await?;
    Ok(Json(ScopeView::from(&state)))
}

/// SPEC §13 `GET /v1/scopes/{scope}/usage` and `GET /v1/usage` answer: spend and model
/// tokens in the 24 h window (settled: what ended tasks cost; reserved: the worst case
/// of tasks still queued or running), the limits in force, and what cache hits saved.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageReportView {
    /// The scope (absent: the whole app).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Start of the window's oldest hourly bucket: the window read is 24 to 25 hours
    /// long (spend leaves it up to an hour late, never early).
    pub since: String,
    /// The server's now.
    pub now: String,
    /// What ended tasks cost, USD (failed and canceled attempts included).
    pub settled_usd: f64,
    /// Reserved by tasks not yet ended, USD.
    pub reserved_usd: f64,
    /// Model tokens ended tasks used.
    pub settled_tokens: u64,
    /// Model tokens reserved by tasks not yet ended.
    pub reserved_tokens: u64,
    /// Settled spend above its reservation (a provider reported more than the bound), USD.
    pub overrun_usd: f64,
    /// What cache hits saved, USD.
    pub saved_usd: f64,
    /// The USD limit of this window: the default policy's `usd_per_24_hours` for a scope,
    /// the app's for the app (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_usd: Option<f64>,
    /// The default policy's `tokens_per_minute` (scope reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// The default policy's `token_burst` (scope reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_burst: Option<u32>,
    /// Model tokens in the scope's bucket now, out of `token_burst`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_available: Option<f64>,
    /// The policy the limits are of (scope reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

impl From<UsageReport> for UsageReportView {
    fn from(u: UsageReport) -> Self {
        let round = |usd: f64| (usd * 1e9).round() / 1e9;
        UsageReportView {
            scope: u.scope.map(|s| s.to_string()),
            since: u.since.to_rfc3339(),
            now: u.now.to_rfc3339(),
            settled_usd: round(u.settled_usd),
            reserved_usd: round(u.reserved_usd),
            settled_tokens: u.settled_tokens,
            reserved_tokens: u.reserved_tokens,
            overrun_usd: round(u.overrun_usd),
            saved_usd: round(u.saved_usd),
            limit_usd: u.limit_usd,
            tokens_per_minute: u.tokens_per_minute,
            token_burst: u.token_burst,
            tokens_available: u.tokens_available.map(|t| (t * 1000.0).round() / 1000.0),
            policy: u.policy_name.map(|p| p.to_string()),
        }
    }
}

#[utoipa::path(get, path = "/v1/scopes/{scope}/usage", tag = "scopes",
    params(("scope" = String, Path, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the scope")),
    responses((status = 200, body = UsageReportView, description = "the scope's spend and tokens in the 24 h window (SPEC §13)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: spend counts every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn scope_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(scope): Path<String>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<UsageReportView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let scope = ScopeId::new(scope)?;
    let report = view(&s, &caller).usage(Some(&scope)).await?;
    Ok(Json(report.into()))
}

#[utoipa::path(get, path = "/v1/usage", tag = "discovery",
    responses((status = 200, body = UsageReportView, description = "the app's spend and tokens in the 24 h window, all scopes (SPEC §13)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: spend counts every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn app_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<UsageReportView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let report = view(&s, &caller).usage(None).await?;
    Ok(Json(report.into()))
}

/// Failures of one error code.
#[derive(Debug, Serialize, ToSchema)]
pub struct FailureCount {
    /// The error code.
    pub code: String,
    /// How many tasks ended with it.
    pub count: u64,
}

/// Tasks that finished in one minute of the stats window.
#[derive(Debug, Serialize, ToSchema)]
pub struct MinuteCountView {
    /// The minute's start (RFC 3339).
    pub start: String,
    /// Succeeded in it.
    pub succeeded: u64,
    /// Failed in it.
    pub failed: u64,
    /// Canceled in it.
    pub canceled: u64,
}

/// Claimed → finished times, in milliseconds.
#[derive(Debug, Serialize, ToSchema)]
pub struct LatencyView {
    /// Median.
    pub p50: i64,
    /// 90th percentile.
    pub p90: i64,
    /// 99th percentile.
    pub p99: i64,
}

/// `GET /v1/stats` answer: the app's tasks now and over the last hour, computed from the
/// database (per app, unlike `/metrics`, which counts the whole server).
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsView {
    /// Always `database`: where these numbers come from.
    pub source: String,
    /// The window's length, in seconds (3600).
    pub window_seconds: u64,
    /// The window's start (RFC 3339).
    pub since: String,
    /// Tasks queued now.
    pub queued: u64,
    /// Tasks running now.
    pub running: u64,
    /// Tasks that succeeded in the window.
    pub succeeded: u64,
    /// Tasks that failed in the window.
    pub failed: u64,
    /// Tasks canceled in the window.
    pub canceled: u64,
    /// Tasks finished per minute over the window (the hour's average).
    pub throughput_per_minute: f64,
    /// The recent window's length, in seconds (60).
    pub recent_window_seconds: u64,
    /// Tasks finished per minute over the recent window: the current rate.
    pub recent_throughput_per_minute: f64,
    /// The window minute by minute, oldest first (60 buckets, the last one ending now):
    /// what finished in each.
    pub per_minute: Vec<MinuteCountView>,
    /// Failed and canceled tasks of the window by error code, most frequent first.
    pub failures_by_code: Vec<FailureCount>,
    /// Succeeded tasks of the window served from the cache.
    pub cache_hits: u64,
    /// `cache_hits / succeeded` (`null` when nothing succeeded).
    #[schema(required = true)]
    pub cache_hit_rate: Option<f64>,
    /// Provider latency: claimed → finished of tasks a worker ran in the window (`null`
    /// when none ran).
    #[schema(required = true)]
    pub latency_ms: Option<LatencyView>,
    /// True when the window held more than 10,000 finished tasks: the figures are of the
    /// newest 10,000.
    pub sampled: bool,
}

impl From<&TaskStats> for StatsView {
    fn from(t: &TaskStats) -> Self {
        let finished = t.succeeded + t.failed + t.canceled;
        let window = tollgate_engine::STATS_WINDOW.as_secs();
        let recent = tollgate_engine::STATS_RECENT_WINDOW;
        StatsView {
            source: "database".to_string(),
            window_seconds: window,
            since: t.since.to_rfc3339(),
            queued: t.queued,
            running: t.running,
            succeeded: t.succeeded,
            failed: t.failed,
            canceled: t.canceled,
            throughput_per_minute: ((finished as f64 * 60.0 / window as f64) * 100.0).round()
                / 100.0,
            recent_window_seconds: recent.as_secs(),
            recent_throughput_per_minute: t.per_minute.last().map_or(0.0, |m| {
                ((m.finished() as f64 * 60.0 / recent.as_secs_f64()) * 100.0).round() / 100.0
            }),
            per_minute: t
                .per_minute
                .iter()
                .map(|m| MinuteCountView {
                    start: m.start.to_rfc3339(),
                    succeeded: m.succeeded,
                    failed: m.failed,
                    canceled: m.canceled,
                })
                .collect(),
            failures_by_code: t
                .failures_by_code
                .iter()
                .map(|(code, count)| FailureCount {
                    code: code.clone(),
                    count: *count,
                })
                .collect(),
            cache_hits: t.cache_hits,
            cache_hit_rate: t.cache_hit_rate.map(|r| (r * 10_000.0).round() / 10_000.0),
            latency_ms: t
                .run_ms_percentiles
                .map(|[p50, p90, p99]| LatencyView { p50, p90, p99 }),
            sampled: t.sampled,
        }
    }
}

#[utoipa::path(get, path = "/v1/stats", tag = "discovery",
    responses((status = 200, body = StatsView, description = "the app's queue, throughput, failures, cache hit rate and latency over the last hour (from the database)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: stats count every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn stats(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<StatsView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let stats = view(&s, &caller).stats().await?;
    Ok(Json(StatsView::from(&stats)))
}

#[cfg(test)]
mod tests {
    use super::parse_rfc3339;

    #[test]
    fn rfc3339() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z").unwrap().0, 0);
        assert_eq!(parse_rfc3339("1970-01-01T01:00:00.5+01:00").unwrap().0, 500);
        assert_eq!(
            parse_rfc3339("2026-12-01T10:00:00.123456Z").unwrap().0,
            1_796_119_200_123
        );
        assert_eq!(
            parse_rfc3339("0000-03-01T00:00:00Z").unwrap().0,
            -62_162_035_200_000
        );
        for bad in [
            "",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-12-01",
            "2026-12-01T10:00:00",
            "2026-12-01T10:00:00.Z",
        ] {
            assert!(parse_rfc3339(bad).is_err(), "{bad}");
        }
    }
}
