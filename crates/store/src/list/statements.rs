//! The listings' statements (docs/conformance.md#listings), built once for both backends (`$n` placeholders,
//! see `shared::sql`), and the pure functions that turn their rows into pages.

use super::{
    FinishedSample, ListCursor, ListPage, PipelineSummary, PipelineVersionSummary, RunListQuery,
    STATS_SAMPLE, ScopeSnapshot, TaskListQuery, TaskStatsRaw, list_page_size,
};
use crate::shared::sql::{Arg, Statement};
use tollgate_core::{AppId, ErrorCode, PipelineName, Run, ScopeId, Subject, TaskStatus, Timestamp};

/// The pieces listings build their statements from.
impl Statement {
    fn text_arg(&mut self, s: &str) -> String {
        self.placeholder(Arg::from(s))
    }

    fn int_arg(&mut self, i: i64) -> String {
        self.placeholder(Arg::from(i))
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
            let a = self.int_arg(at.0);
            let i = self.text_arg(id);
            self.push(&format!(" AND (created_at, id) < ({a}, {i})"));
        }
    }

    /// Newest first after the cursor, one row more than the page.
    fn newest_page(&mut self, after: Option<&ListCursor>, limit: u32) {
        self.after(after);
        let l = self.int_arg(crate::keyset_fetch(list_page_size(limit)));
        self.push(&format!(" ORDER BY created_at DESC, id DESC LIMIT {l}"));
    }
}

/// The predicate of the partial index `tasks_app_unsucceeded`, spelled out so that both
/// planners (SQLite only matches a partial index whose terms the query repeats) use it
/// for a status filter that leaves `succeeded` out. Redundant with that filter.
const UNSUCCEEDED: &str = " AND status <> 'succeeded'";

/// Most tasks one page of a listing with a walked filter examines (docs/conformance.md#listings: no listing
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
pub(crate) fn task_walk_floor_sql(app: &AppId, q: &TaskListQuery) -> Statement {
    let mut sql = Statement::new("SELECT created_at, id FROM tasks WHERE app = ");
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    indexed_task_filters(&mut sql, q);
    sql.after(q.after.as_ref());
    let o = sql.int_arg(i64::from(LIST_WALK) - 1);
    sql.push(&format!(
        " ORDER BY created_at DESC, id DESC LIMIT 1 OFFSET {o}"
    ));
    sql
}

/// The filters of a task listing that an index serves: scope, source, run, subject, the
/// creation range and a status set without `succeeded`. The subject comes first among
/// them, so a walk of a subject's listing only ever reads (and hands out cursors of) that
/// subject's tasks (migration 0015, `tasks_app_subject_created`).
fn indexed_task_filters(sql: &mut Statement, q: &TaskListQuery) {
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
        let p = sql.int_arg(t.0);
        sql.push(&format!(" AND created_at >= {p}"));
    }
    if let Some(t) = q.created_before {
        let p = sql.int_arg(t.0);
        sql.push(&format!(" AND created_at < {p}"));
    }
}

/// The task listing's statement (docs/conformance.md#listings). Indexed by `tasks_app_created` and, for the
/// narrower filters, `tasks_app_scope_created`, `tasks_app_unsucceeded` (statuses other
/// than `succeeded`), `tasks_app_source_created` and `tasks_run`. With a walked filter
/// ([`tasks_walked`]) an inner select reads at most [`LIST_WALK`] tasks in index order
/// and the outer one filters them: a LIMIT in index order is what keeps both planners
/// on the index whatever the filter's selectivity.
pub(crate) fn tasks_sql(app: &AppId, q: &TaskListQuery) -> Statement {
    let walked = tasks_walked(q);
    let mut sql = Statement::new(if walked {
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
    });
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    indexed_task_filters(&mut sql, q);
    if walked {
        sql.after(q.after.as_ref());
        let w = sql.int_arg(i64::from(LIST_WALK));
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
        let l = sql.int_arg(crate::keyset_fetch(list_page_size(q.limit)));
        sql.push(&format!(" ORDER BY created_at DESC, id DESC LIMIT {l}"));
    } else {
        sql.newest_page(q.after.as_ref(), q.limit);
    }
    sql
}

/// The run listing's statement (docs/conformance.md#listings), indexed by `runs_app_created` and
/// `pipeline_runs_app_pipeline`.
pub(crate) fn runs_sql(app: &AppId, q: &RunListQuery) -> Statement {
    let mut sql = Statement::new(concat!(
        "SELECT ",
        crate::shared::rows::run_columns!(),
        " FROM runs WHERE app = "
    ));
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
pub(crate) fn run_pipelines_sql(runs: &[Run]) -> Statement {
    let mut sql =
        Statement::new("SELECT run_id, pipeline, version FROM pipeline_runs WHERE run_id IN (");
    let ps: Vec<String> = runs
        .iter()
        .map(|r| sql.text_arg(&r.id.to_string()))
        .collect();
    sql.push(&ps.join(", "));
    sql.push(")");
    sql
}

/// Names of a page of pipelines (the primary key's prefix).
pub(crate) fn pipeline_names_sql(app: &AppId, after: Option<&ListCursor>, limit: u32) -> Statement {
    let mut sql = Statement::new("SELECT DISTINCT name FROM pipelines WHERE app = ");
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    if let Some(ListCursor::Name { name, .. }) = after {
        let n = sql.text_arg(name);
        sql.push(&format!(" AND name > {n}"));
    }
    let l = sql.int_arg(crate::keyset_fetch(list_page_size(limit)));
    sql.push(&format!(" ORDER BY name LIMIT {l}"));
    sql
}

/// Versions of the pipelines named `first..=last`.
pub(crate) fn pipeline_versions_sql(app: &AppId, first: &str, last: &str) -> Statement {
    let mut sql = Statement::new("SELECT name, version, created_at FROM pipelines WHERE app = ");
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
    app: &AppId,
    cutoff: Timestamp,
    after: Option<&ListCursor>,
    limit: u32,
) -> Statement {
    let mut sql = Statement::new("SELECT s.scope FROM scope_state s WHERE s.app = ");
    let p = sql.text_arg(app.as_str());
    sql.push(&p);
    if let Some(ListCursor::Name { name, .. }) = after {
        let n = sql.text_arg(name);
        sql.push(&format!(" AND s.scope > {n}"));
    }
    let c = sql.int_arg(cutoff.0);
    sql.push(&format!(
        " AND (s.active > 0 OR EXISTS (SELECT 1 FROM scope_sources ss WHERE ss.app = s.app \
         AND ss.scope = s.scope AND ss.last_admitted_at > {c}))"
    ));
    let l = sql.int_arg(crate::keyset_fetch(list_page_size(limit)));
    sql.push(&format!(" ORDER BY s.scope LIMIT {l}"));
    sql
}

/// The statements of one scope's snapshot: state row, sources in the window, and the
/// admissions of the window (`admissions_source`'s `(app, scope)` prefix).
pub(crate) fn scope_sqls(app: &AppId, scope: &ScopeId, cutoff: Timestamp) -> [Statement; 3] {
    let mut state =
        Statement::new("SELECT bucket_units, bucket_at, active FROM scope_state WHERE app = ");
    let a = state.text_arg(app.as_str());
    let s = state.text_arg(scope.as_str());
    state.push(&format!("{a} AND scope = {s}"));

    let mut sources = Statement::new("SELECT COUNT(*) FROM scope_sources WHERE app = ");
    let a = sources.text_arg(app.as_str());
    let s = sources.text_arg(scope.as_str());
    let c = sources.int_arg(cutoff.0);
    sources.push(&format!("{a} AND scope = {s} AND last_admitted_at > {c}"));

    let mut steps = Statement::new(
        "SELECT source_id, COUNT(*) AS n, COUNT(DISTINCT logical_key) AS steps, \
         MAX(admitted_at) AS last FROM admissions WHERE app = ",
    );
    let a = steps.text_arg(app.as_str());
    let s = steps.text_arg(scope.as_str());
    let c = steps.int_arg(cutoff.0);
    steps.push(&format!(
        "{a} AND scope = {s} AND admitted_at > {c} GROUP BY source_id"
    ));
    [state, sources, steps]
}

/// Distinct steps of a scope in the window.
pub(crate) fn scope_steps_sql(app: &AppId, scope: &ScopeId, cutoff: Timestamp) -> Statement {
    let mut sql = Statement::new("SELECT COUNT(DISTINCT logical_key) FROM admissions WHERE app = ");
    let a = sql.text_arg(app.as_str());
    let s = sql.text_arg(scope.as_str());
    let c = sql.int_arg(cutoff.0);
    sql.push(&format!(
        "{a} AND scope = {s} AND admitted_at > {c} AND logical_key IS NOT NULL"
    ));
    sql
}

/// Queued and running counts (`tasks_app_unsucceeded`).
pub(crate) fn active_counts_sql(app: &AppId) -> Statement {
    let mut sql = Statement::new("SELECT status, COUNT(*) FROM tasks WHERE app = ");
    let a = sql.text_arg(app.as_str());
    sql.push(&format!(
        "{a} AND status IN ('queued', 'running'){UNSUCCEEDED} GROUP BY status"
    ));
    sql
}

/// Tasks finished since `since`, newest first (`tasks_app_completed`).
pub(crate) fn finished_sql(app: &AppId, since: Timestamp) -> Statement {
    let mut sql = Statement::new(
        "SELECT status, error_code, cached_from IS NOT NULL AS cached, \
         completed_at - claimed_at AS run_ms, completed_at FROM tasks WHERE app = ",
    );
    let a = sql.text_arg(app.as_str());
    let s = sql.int_arg(since.0);
    let l = sql.int_arg(i64::from(STATS_SAMPLE) + 1);
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
