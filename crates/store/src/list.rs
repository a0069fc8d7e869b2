//! Listings (SPEC §15): the queries, pages, opaque cursors and the dialect-free SQL both
//! backends run. Each listing is one indexed statement of the app's rows, newest first
//! (keyset on `(created_at, id)`, so pages never skip or repeat a row that existed when
//! the first page was read, whatever is inserted meanwhile). The backends only bind the
//! arguments built here ([`ListSql`]) and turn rows into answers.

use crate::StoreResult;
use async_trait::async_trait;
use tollgate_core::{
    AppId, ErrorCode, InvalidInput, PipelineName, Run, RunId, RunState, ScopeId, SourceId, StepKey,
    Subject, Task, TaskKind, TaskStatus, Timestamp,
};

/// Largest page of a listing.
pub const LIST_MAX_PAGE: u32 = 500;
/// Page size when a listing names none.
pub const LIST_DEFAULT_PAGE: u32 = 50;
/// Most finished tasks [`ListStore::task_stats`] reads for its percentiles.
pub const STATS_SAMPLE: u32 = 10_000;

/// A page size as every SPEC §15 listing reads it: 0 means [`LIST_DEFAULT_PAGE`], larger
/// than [`LIST_MAX_PAGE`] is capped.
pub fn list_page_size(requested: u32) -> u32 {
    match requested {
        0 => LIST_DEFAULT_PAGE,
        n => n.min(LIST_MAX_PAGE),
    }
}

/// Where a keyset page ends: the sort key of its last row. Opaque to callers
/// ([`ListCursor::encode`]); a cursor of another listing is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListCursor {
    /// Tasks or runs: `(created_at, id)` of the last row, newest first.
    Newest {
        /// Which listing it came from (`t` tasks, `r` runs).
        listing: char,
        /// The last row's creation time.
        at: Timestamp,
        /// The last row's id.
        id: String,
    },
    /// Scopes or pipelines: the last name, in name order.
    Name {
        /// Which listing it came from (`s` scopes, `p` pipelines).
        listing: char,
        /// The last name shown.
        name: String,
    },
}

impl ListCursor {
    /// The cursor as text: opaque to callers, who pass it back as given. It reads
    /// `<listing>1.<created ms>.<id>` or `<listing>1.<name>`, so the OpenAPI document can
    /// say exactly which texts are cursors.
    pub fn encode(&self) -> String {
        match self {
            ListCursor::Newest { listing, at, id } => format!("{listing}1.{}.{id}", at.0),
            ListCursor::Name { listing, name } => format!("{listing}1.{name}"),
        }
    }

    /// Reads a cursor `listing` gave out; anything else is [`InvalidInput`] on `next`.
    pub fn decode(text: &str, listing: char) -> Result<ListCursor, InvalidInput> {
        let bad = || InvalidInput::field("next", "not a cursor this listing gave out");
        let rest = text
            .strip_prefix(listing)
            .and_then(|r| r.strip_prefix("1."))
            .ok_or_else(bad)?;
        match listing {
            't' | 'r' => {
                let (at, id) = rest.split_once('.').ok_or_else(bad)?;
                if at.is_empty() || at.len() > 16 {
                    return Err(bad());
                }
                let at: i64 = at.parse().map_err(|_| bad())?;
                let id = if listing == 't' {
                    tollgate_core::TaskId::parse(id).map(|i| i.to_string())
                } else {
                    RunId::parse(id).map(|i| i.to_string())
                }
                .map_err(|_| bad())?;
                Ok(ListCursor::Newest {
                    listing,
                    at: Timestamp(at),
                    id,
                })
            }
            _ => {
                tollgate_core::ids::check_identifier("next", rest).map_err(|_| bad())?;
                Ok(ListCursor::Name {
                    listing,
                    name: rest.to_string(),
                })
            }
        }
    }
}

/// Query of [`ListStore::list_tasks`]. Every filter narrows; none given lists the app's
/// tasks.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskListQuery {
    /// Only this scope.
    pub scope: Option<ScopeId>,
    /// Only these statuses (empty: any).
    pub statuses: Vec<TaskStatus>,
    /// Only this kind.
    pub kind: Option<TaskKind>,
    /// Only this step key.
    pub step: Option<StepKey>,
    /// Only this source.
    pub source: Option<SourceId>,
    /// Only tasks of this run.
    pub run: Option<RunId>,
    /// Created at or after this instant.
    pub created_after: Option<Timestamp>,
    /// Created before this instant.
    pub created_before: Option<Timestamp>,
    /// Only tasks done for this subject (a caller bound to a subject sees only its own).
    pub subject: Option<Subject>,
    /// Only tasks that ended with this error code (failed or canceled ones;
    /// `WORKFLOW_AI_INTERRUPTED` also matches those that ended without a code, as the
    /// stats count them).
    pub error_code: Option<String>,
    /// Keyset cursor: the page after this one.
    pub after: Option<ListCursor>,
    /// Page size as [`list_page_size`] reads it.
    pub limit: u32,
}

/// Query of [`ListStore::list_runs`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RunListQuery {
    /// Only this scope.
    pub scope: Option<ScopeId>,
    /// Only these states (empty: any).
    pub states: Vec<RunState>,
    /// Only runs of this pipeline.
    pub pipeline: Option<PipelineName>,
    /// Only runs done for this subject.
    pub subject: Option<Subject>,
    /// Keyset cursor.
    pub after: Option<ListCursor>,
    /// Page size as [`list_page_size`] reads it.
    pub limit: u32,
}

/// A page of a listing: rows in order, and the cursor of the next page (`None` on the
/// last one).
#[derive(Debug, Clone, PartialEq)]
pub struct ListPage<T> {
    /// The rows.
    pub items: Vec<T>,
    /// Where the next page starts.
    pub next: Option<ListCursor>,
}

/// A run in a listing, with the pipeline it runs (if any).
#[derive(Debug, Clone, PartialEq)]
pub struct ListedRun {
    /// The run.
    pub run: Run,
    /// Pipeline name and version, for pipeline runs.
    pub pipeline: Option<crate::PipelineRef>,
}

/// One version of a pipeline in [`ListStore::list_pipelines`].
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineVersionSummary {
    /// Content hash.
    pub version: String,
    /// When it was registered.
    pub created_at: Timestamp,
}

/// A pipeline name with its versions, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct PipelineSummary {
    /// The name.
    pub name: PipelineName,
    /// Its versions, newest first (the first is what a run without a version runs).
    pub versions: Vec<PipelineVersionSummary>,
}

/// What the store keeps about a scope's admission (SPEC §4), read without changing it.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScopeSnapshot {
    /// The scope.
    pub scope: Option<ScopeId>,
    /// "Now" as the store's clock read it for this snapshot.
    pub now: Option<Timestamp>,
    /// Token bucket as last stored (units of `TOKEN_UNITS`) and when; `None` before the
    /// scope's first admission.
    pub bucket: Option<tollgate_core::admission::BucketState>,
    /// Admitted tasks still queued or running.
    pub active: u64,
    /// Distinct sources admitted in the 24 h window.
    pub sources_in_window: u64,
    /// Distinct logical steps admitted in the window (all sources).
    pub steps_in_window: u64,
    /// The most distinct steps one source has in the window (what the per-source limit
    /// compares).
    pub busiest_source_steps: u64,
    /// Admission records in the window.
    pub admissions_in_window: u64,
    /// The newest admission in the window.
    pub last_admitted_at: Option<Timestamp>,
}

/// One finished task as [`ListStore::task_stats`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSample {
    /// Its terminal status.
    pub status: TaskStatus,
    /// The error code, when failed or canceled.
    pub error_code: Option<String>,
    /// Served from the cache.
    pub cached: bool,
    /// Claimed → finished, in milliseconds (tasks a worker ran).
    pub run_ms: Option<i64>,
    /// When it finished.
    pub completed_at: Timestamp,
}

/// Raw counts of an app's tasks for `GET /v1/stats`; the engine aggregates them.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskStatsRaw {
    /// "Now" as the store's clock reads it.
    pub now: Option<Timestamp>,
    /// Tasks queued now.
    pub queued: u64,
    /// Tasks running now.
    pub running: u64,
    /// Tasks that finished since the window's start, newest first (at most
    /// [`STATS_SAMPLE`]).
    pub finished: Vec<FinishedSample>,
    /// Whether more finished in the window than `finished` holds.
    pub truncated: bool,
}

/// The SPEC §15 listings. Every method reads only the app's rows; another app's rows
/// never appear. Each is one indexed statement (plus bounded lookups per page).
#[async_trait]
pub trait ListStore: Send + Sync {
    /// The app's tasks, newest first, filtered.
    async fn list_tasks(&self, app: &AppId, query: &TaskListQuery) -> StoreResult<ListPage<Task>>;

    /// The app's runs, newest first, filtered.
    async fn list_runs(
        &self,
        app: &AppId,
        query: &RunListQuery,
    ) -> StoreResult<ListPage<ListedRun>>;

    /// The app's pipelines in name order with their versions.
    async fn list_pipelines(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<PipelineSummary>>;

    /// The app's scopes with admission activity in the 24 h window (admitted tasks still
    /// active, or a source admitted in the window), in name order.
    async fn list_scopes(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<ScopeSnapshot>>;

    /// One scope's admission state (zeros for a scope never admitted into).
    async fn scope_snapshot(&self, app: &AppId, scope: &ScopeId) -> StoreResult<ScopeSnapshot>;

    /// Queued and running counts now, and the tasks that finished since `since`.
    async fn task_stats(&self, app: &AppId, since: Option<Timestamp>) -> StoreResult<TaskStatsRaw>;
}

/// Which placeholders a backend's SQL uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// `?`
    #[allow(dead_code)]
    Sqlite,
    /// `$1`, `$2`, …
    #[allow(dead_code)]
    Postgres,
}

/// An argument to bind, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    /// Text.
    Text(String),
    /// An integer.
    Int(i64),
}

/// A statement and its arguments, built once for both backends.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListSql {
    pub(crate) text: String,
    pub(crate) args: Vec<Arg>,
    dialect: Option<Dialect>,
}

impl ListSql {
    fn new(dialect: Dialect, head: &str) -> ListSql {
        ListSql {
            text: head.to_string(),
            args: Vec::new(),
            dialect: Some(dialect),
        }
    }

    /// The next placeholder, binding `arg` to it.
    fn bind(&mut self, arg: Arg) -> String {
        self.args.push(arg);
        match self.dialect {
            Some(Dialect::Postgres) => format!("${}", self.args.len()),
            _ => "?".to_string(),
        }
    }

    fn text_arg(&mut self, s: &str) -> String {
        self.bind(Arg::Text(s.to_string()))
    }

    fn push(&mut self, s: &str) {
        self.text.push_str(s);
    }

    /// ` AND column = <arg>`.
    fn eq(&mut self, column: &str, value: &str) {
        let p = self.text_arg(value);
        self.push(&format!(" AND {column} = {p}"));
    }

    /// ` AND column IN (<args>)`, nothing for an empty set.
    fn one_of(&mut self, column: &str, values: &[&str]) {
        if values.is_empty() {
            return;
        }
        let ps: Vec<String> = values.iter().map(|v| self.text_arg(v)).collect();
        self.push(&format!(" AND {column} IN ({})", ps.join(", ")));
    }

    fn subject(&mut self, subject: Option<&Subject>) {
        if let Some(s) = subject {
            self.eq("subject_type", s.kind.as_str());
            self.eq("subject_id", &s.id);
        }
    }

    /// ` AND` older than the cursor, newest first.
    fn after(&mut self, after: Option<&ListCursor>) {
        if let Some(ListCursor::Newest { at, id, .. }) = after {
            let a = self.bind(Arg::Int(at.0));
            let i = self.text_arg(id);
            self.push(&format!(" AND (created_at, id) < ({a}, {i})"));
        }
    }

    /// Newest first after the cursor, one row more than the page.
    fn newest_page(&mut self, after: Option<&ListCursor>, limit: u32) {
        self.after(after);
        let l = self.bind(Arg::Int(crate::keyset_fetch(list_page_size(limit))));
        self.push(&format!(" ORDER BY created_at DESC, id DESC LIMIT {l}"));
    }
}

/// The predicate of the partial index `tasks_app_unsucceeded`, spelled out so that both
/// planners (SQLite only matches a partial index whose terms the query repeats) use it
/// for a status filter that leaves `succeeded` out. Redundant with that filter.
const UNSUCCEEDED: &str = " AND status <> 'succeeded'";

/// Most tasks one page of a listing with a walked filter examines (SPEC §15: no listing
/// reads a whole table). Kind, step and a status set that includes `succeeded`
/// have no index of their own (each index is written by every admission, migration 0005);
/// such a page walks at most this many of the newest-first tasks its indexed filters
/// select, so it may hold fewer than `limit` tasks and still carry `next`.
pub const LIST_WALK: u32 = 5_000;

/// Whether a task listing filters on something no index serves (see [`LIST_WALK`]).
pub(crate) fn tasks_walked(q: &TaskListQuery) -> bool {
    q.kind.is_some()
        || q.step.is_some()
        || q.error_code.is_some()
        || q.statuses.contains(&TaskStatus::Succeeded)
}

/// Where a walked page that ended short stopped: the `(created_at, id)` of the
/// [`LIST_WALK`]th newest task its indexed filters select after the cursor (no row: fewer
/// remain, the walk reached the end).
pub(crate) fn task_walk_floor_sql(dialect: Dialect, app: &AppId, q: &TaskListQuery) -> ListSql {
    let mut sql = ListSql::new(dialect, "SELECT created_at, id FROM tasks WHERE app = ");
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    indexed_task_filters(&mut sql, q);
    sql.after(q.after.as_ref());
    let o = sql.bind(Arg::Int(i64::from(LIST_WALK) - 1));
    sql.push(&format!(
        " ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET {o}"
    ));
    sql
}

/// The filters of a task listing that an index serves: scope, source, run, subject, the
/// creation range and a status set without `succeeded`. The subject comes first among
/// them, so a walk of a subject's listing only ever reads (and hands out cursors of) that
/// subject's tasks (migration 0015, `tasks_app_subject_created`).
fn indexed_task_filters(sql: &mut ListSql, q: &TaskListQuery) {
    if q.subject.is_some() {
        sql.subject(q.subject.as_ref());
        // The partial index's predicate, spelled out for SQLite's planner.
        sql.push(" AND subject_id IS NOT NULL");
    }
    if let Some(scope) = &q.scope {
        sql.eq("scope", scope.as_str());
    }
    if !q.statuses.is_empty() && !q.statuses.contains(&TaskStatus::Succeeded) {
        let statuses: Vec<&str> = q.statuses.iter().map(|s| s.as_str()).collect();
        sql.one_of("status", &statuses);
        sql.push(UNSUCCEEDED);
    }
    if let Some(source) = &q.source {
        sql.eq("source_id", source.as_str());
    }
    if let Some(run) = &q.run {
        sql.eq("run_id", &run.to_string());
    }
    if let Some(t) = q.created_after {
        let p = sql.bind(Arg::Int(t.0));
        sql.push(&format!(" AND created_at >= {p}"));
    }
    if let Some(t) = q.created_before {
        let p = sql.bind(Arg::Int(t.0));
        sql.push(&format!(" AND created_at < {p}"));
    }
}

/// The task listing's statement (SPEC §15). Indexed by `tasks_app_created` and, for the
/// narrower filters, `tasks_app_scope_created`, `tasks_app_unsucceeded` (statuses other
/// than `succeeded`), `tasks_app_source_created` and `tasks_run`. With a walked filter
/// ([`tasks_walked`]) an inner select reads at most [`LIST_WALK`] tasks in index order
/// and the outer one filters them: a LIMIT in index order is what keeps both planners
/// on the index whatever the filter's selectivity.
pub(crate) fn tasks_sql(dialect: Dialect, app: &AppId, q: &TaskListQuery) -> ListSql {
    let walked = tasks_walked(q);
    let mut sql = ListSql::new(
        dialect,
        if walked {
            concat!(
                "SELECT * FROM (SELECT ",
                crate::shared::rows::task_columns!(),
                " FROM tasks WHERE app = "
            )
        } else {
            concat!(
                "SELECT ",
                crate::shared::rows::task_columns!(),
                " FROM tasks WHERE app = "
            )
        },
    );
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    indexed_task_filters(&mut sql, q);
    if walked {
        sql.after(q.after.as_ref());
        let w = sql.bind(Arg::Int(i64::from(LIST_WALK)));
        sql.push(&format!(
            " ORDER BY created_at DESC, id DESC LIMIT {w}) AS walk WHERE TRUE"
        ));
    }
    if q.statuses.contains(&TaskStatus::Succeeded) {
        let statuses: Vec<&str> = q.statuses.iter().map(|s| s.as_str()).collect();
        sql.one_of("status", &statuses);
    }
    if let Some(kind) = q.kind {
        sql.eq("kind", kind.as_str());
    }
    if let Some(step) = &q.step {
        sql.eq("step", step.as_str());
    }
    if let Some(code) = &q.error_code {
        let p = sql.text_arg(code);
        // The stats count a failed or canceled task without a code as interrupted.
        let unset = if code == ErrorCode::Interrupted.as_str() {
            " OR (error_code IS NULL AND status IN ('failed', 'canceled'))"
        } else {
            ""
        };
        sql.push(&format!(" AND (error_code = {p}{unset})"));
    }
    if walked {
        let l = sql.bind(Arg::Int(crate::keyset_fetch(list_page_size(q.limit))));
        sql.push(&format!(" ORDER BY created_at DESC, id DESC LIMIT {l}"));
    } else {
        sql.newest_page(q.after.as_ref(), q.limit);
    }
    sql
}

/// The run listing's statement (SPEC §15), indexed by `runs_app_created` and
/// `pipeline_runs_app_pipeline`.
pub(crate) fn runs_sql(dialect: Dialect, app: &AppId, q: &RunListQuery) -> ListSql {
    let mut sql = ListSql::new(
        dialect,
        concat!(
            "SELECT ",
            crate::shared::rows::run_columns!(),
            " FROM runs WHERE app = "
        ),
    );
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    if let Some(scope) = &q.scope {
        sql.eq("scope", scope.as_str());
    }
    let states: Vec<&str> = q.states.iter().map(|s| s.as_str()).collect();
    sql.one_of("state", &states);
    if let Some(pipeline) = &q.pipeline {
        let a = sql.text_arg(app.as_str());
        let n = sql.text_arg(pipeline.as_str());
        sql.push(&format!(
            " AND id IN (SELECT run_id FROM pipeline_runs WHERE app = {a} AND pipeline = {n})"
        ));
    }
    sql.subject(q.subject.as_ref());
    sql.newest_page(q.after.as_ref(), q.limit);
    sql
}

/// The pipeline run rows of a page of runs (primary-key lookups).
pub(crate) fn run_pipelines_sql(dialect: Dialect, runs: &[Run]) -> ListSql {
    let mut sql = ListSql::new(
        dialect,
        "SELECT run_id, pipeline, version FROM pipeline_runs WHERE run_id IN (",
    );
    let ps: Vec<String> = runs
        .iter()
        .map(|r| sql.text_arg(&r.id.to_string()))
        .collect();
    sql.push(&ps.join(", "));
    sql.push(")");
    sql
}

/// Names of a page of pipelines (the primary key's prefix).
pub(crate) fn pipeline_names_sql(
    dialect: Dialect,
    app: &AppId,
    after: Option<&ListCursor>,
    limit: u32,
) -> ListSql {
    let mut sql = ListSql::new(dialect, "SELECT DISTINCT name FROM pipelines WHERE app = ");
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    if let Some(ListCursor::Name { name, .. }) = after {
        let n = sql.text_arg(name);
        sql.push(&format!(" AND name > {n}"));
    }
    let l = sql.bind(Arg::Int(crate::keyset_fetch(list_page_size(limit))));
    sql.push(&format!(" ORDER BY name LIMIT {l}"));
    sql
}

/// Versions of the pipelines named `first..=last`.
pub(crate) fn pipeline_versions_sql(
    dialect: Dialect,
    app: &AppId,
    first: &str,
    last: &str,
) -> ListSql {
    let mut sql = ListSql::new(
        dialect,
        "SELECT name, version, created_at FROM pipelines WHERE app = ",
    );
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    let f = sql.text_arg(first);
    let l = sql.text_arg(last);
    sql.push(&format!(
        " AND name >= {f} AND name <= {l} ORDER BY name, created_at DESC, version"
    ));
    sql
}

/// Scopes with activity in the window, in name order (the `scope_state` primary key;
/// `scope_sources_scope_age` for the window).
pub(crate) fn scopes_sql(
    dialect: Dialect,
    app: &AppId,
    cutoff: Timestamp,
    after: Option<&ListCursor>,
    limit: u32,
) -> ListSql {
    let mut sql = ListSql::new(dialect, "SELECT s.scope FROM scope_state s WHERE s.app = ");
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    if let Some(ListCursor::Name { name, .. }) = after {
        let n = sql.text_arg(name);
        sql.push(&format!(" AND s.scope > {n}"));
    }
    let c = sql.bind(Arg::Int(cutoff.0));
    sql.push(&format!(
        " AND (s.active > 0 OR EXISTS (SELECT 1 FROM scope_sources ss WHERE ss.app = s.app \
         AND ss.scope = s.scope AND ss.last_admitted_at > {c}))"
    ));
    let l = sql.bind(Arg::Int(crate::keyset_fetch(list_page_size(limit))));
    sql.push(&format!(" ORDER BY s.scope LIMIT {l}"));
    sql
}

/// The statements of one scope's snapshot: state row, sources in the window, and the
/// admissions of the window (`admissions_source`'s `(app, scope)` prefix).
pub(crate) fn scope_sqls(
    dialect: Dialect,
    app: &AppId,
    scope: &ScopeId,
    cutoff: Timestamp,
) -> [ListSql; 3] {
    let mut state = ListSql::new(
        dialect,
        "SELECT bucket_units, bucket_at, active FROM scope_state WHERE app = ",
    );
    let a = state.text_arg(app.as_str());
    let s = state.text_arg(scope.as_str());
    state.push(&format!("{a} AND scope = {s}"));

    let mut sources = ListSql::new(dialect, "SELECT COUNT(*) FROM scope_sources WHERE app = ");
    let a = sources.text_arg(app.as_str());
    let s = sources.text_arg(scope.as_str());
    let c = sources.bind(Arg::Int(cutoff.0));
    sources.push(&format!("{a} AND scope = {s} AND last_admitted_at > {c}"));

    let mut steps = ListSql::new(
        dialect,
        "SELECT source_id, COUNT(*) AS n, COUNT(DISTINCT logical_key) AS steps, \
         MAX(admitted_at) AS last FROM admissions WHERE app = ",
    );
    let a = steps.text_arg(app.as_str());
    let s = steps.text_arg(scope.as_str());
    let c = steps.bind(Arg::Int(cutoff.0));
    steps.push(&format!(
        "{a} AND scope = {s} AND admitted_at > {c} GROUP BY source_id"
    ));
    [state, sources, steps]
}

/// Distinct steps of a scope in the window.
pub(crate) fn scope_steps_sql(
    dialect: Dialect,
    app: &AppId,
    scope: &ScopeId,
    cutoff: Timestamp,
) -> ListSql {
    let mut sql = ListSql::new(
        dialect,
        "SELECT COUNT(DISTINCT logical_key) FROM admissions WHERE app = ",
    );
    let a = sql.text_arg(app.as_str());
    let s = sql.text_arg(scope.as_str());
    let c = sql.bind(Arg::Int(cutoff.0));
    sql.push(&format!(
        "{a} AND scope = {s} AND admitted_at > {c} AND logical_key IS NOT NULL"
    ));
    sql
}

/// Queued and running counts (`tasks_app_unsucceeded`).
pub(crate) fn active_counts_sql(dialect: Dialect, app: &AppId) -> ListSql {
    let mut sql = ListSql::new(dialect, "SELECT status, COUNT(*) FROM tasks WHERE app = ");
    let a = sql.text_arg(app.as_str());
    sql.push(&format!(
        "{a} AND status IN ('queued', 'running'){UNSUCCEEDED} GROUP BY status"
    ));
    sql
}

/// Tasks finished since `since`, newest first (`tasks_app_completed`).
pub(crate) fn finished_sql(dialect: Dialect, app: &AppId, since: Timestamp) -> ListSql {
    let mut sql = ListSql::new(
        dialect,
        "SELECT status, error_code, cached_from IS NOT NULL AS cached, \
         completed_at - claimed_at AS run_ms, completed_at FROM tasks WHERE app = ",
    );
    let a = sql.text_arg(app.as_str());
    let s = sql.bind(Arg::Int(since.0));
    let l = sql.bind(Arg::Int(i64::from(STATS_SAMPLE) + 1));
    sql.push(&format!(
        "{a} AND completed_at >= {s} ORDER BY completed_at DESC LIMIT {l}"
    ));
    sql
}

/// A page from the `keyset_fetch(limit)` rows read, with the next cursor made by `key`.
pub(crate) fn page_of<T>(rows: Vec<T>, limit: u32, key: impl Fn(&T) -> ListCursor) -> ListPage<T> {
    let limit = list_page_size(limit) as usize;
    let mut items = rows;
    let next = if items.len() > limit {
        items.truncate(limit);
        items.last().map(key)
    } else {
        None
    };
    ListPage { items, next }
}

/// A snapshot from its rows: (units, at, active), the sources count, and per source
/// (admissions, distinct steps, newest admission).
pub(crate) fn snapshot_of(
    scope: &ScopeId,
    now: Timestamp,
    state: Option<(i64, i64, i64)>,
    sources: i64,
    per_source: &[(String, i64, i64, Option<i64>)],
    steps: i64,
) -> ScopeSnapshot {
    ScopeSnapshot {
        scope: Some(scope.clone()),
        now: Some(now),
        bucket: state.map(|(units, at, _)| tollgate_core::admission::BucketState {
            units,
            at: Timestamp(at),
        }),
        active: state.map_or(0, |s| s.2.max(0) as u64),
        sources_in_window: sources.max(0) as u64,
        steps_in_window: steps.max(0) as u64,
        busiest_source_steps: per_source
            .iter()
            .map(|s| s.2.max(0) as u64)
            .max()
            .unwrap_or(0),
        admissions_in_window: per_source.iter().map(|s| s.1.max(0) as u64).sum(),
        last_admitted_at: per_source.iter().filter_map(|s| s.3).max().map(Timestamp),
    }
}

/// A finished-task row.
pub(crate) fn sample_of(
    status: &str,
    error_code: Option<String>,
    cached: bool,
    run_ms: Option<i64>,
    completed_at: i64,
) -> Option<FinishedSample> {
    Some(FinishedSample {
        status: TaskStatus::parse(status)?,
        error_code,
        cached,
        run_ms: run_ms.filter(|_| !cached),
        completed_at: Timestamp(completed_at),
    })
}

/// Pipeline summaries from a page of names and the versions of those names (name order,
/// newest version first).
pub(crate) fn pipelines_of(
    names: &[(String,)],
    versions: &[(String, String, i64)],
) -> Vec<PipelineSummary> {
    names
        .iter()
        .filter_map(|(name,)| {
            Some(PipelineSummary {
                name: PipelineName::new(name.clone()).ok()?,
                versions: versions
                    .iter()
                    .filter(|v| &v.0 == name)
                    .map(|v| PipelineVersionSummary {
                        version: v.1.clone(),
                        created_at: Timestamp(v.2),
                    })
                    .collect(),
            })
        })
        .collect()
}

/// A row of [`finished_sql`]: status, error code, cached, run time, completion time.
pub(crate) type FinishedRow = (String, Option<String>, bool, Option<i64>, i64);

/// Raw stats from the counts by status and the finished rows (status, error code,
/// cached, run time, completion time).
pub(crate) fn stats_of(
    now: Timestamp,
    counts: &[(String, i64)],
    rows: Vec<FinishedRow>,
) -> TaskStatsRaw {
    let count = |status: &str| {
        counts
            .iter()
            .find(|c| c.0 == status)
            .map_or(0, |c| c.1.max(0) as u64)
    };
    let truncated = rows.len() > STATS_SAMPLE as usize;
    TaskStatsRaw {
        now: Some(now),
        queued: count("queued"),
        running: count("running"),
        finished: rows
            .into_iter()
            .take(STATS_SAMPLE as usize)
            .filter_map(|(status, code, cached, ms, at)| sample_of(&status, code, cached, ms, at))
            .collect(),
        truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_refuse_other_listings() {
        let c = ListCursor::Name {
            listing: 's',
            name: "scope-1".into(),
        };
        assert_eq!(ListCursor::decode(&c.encode(), 's').unwrap(), c);
        assert!(ListCursor::decode(&c.encode(), 'p').is_err());
        assert!(ListCursor::decode("zz", 's').is_err());
        assert!(ListCursor::decode("t1.12.not-an-id", 't').is_err());
        let t = ListCursor::Newest {
            listing: 't',
            at: Timestamp(12),
            id: "0190a0a0-0000-7000-8000-000000000000".into(),
        };
        assert_eq!(ListCursor::decode(&t.encode(), 't').unwrap(), t);
        assert!(ListCursor::decode(&t.encode(), 'r').is_err());
        assert!(ListCursor::decode("", 't').is_err());
    }

    #[test]
    fn page_sizes() {
        assert_eq!(list_page_size(0), LIST_DEFAULT_PAGE);
        assert_eq!(list_page_size(9_999), LIST_MAX_PAGE);
        assert_eq!(list_page_size(3), 3);
    }
}
