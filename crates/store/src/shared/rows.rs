//! Row shapes shared by both backends and their conversion into domain types: named
//! `sqlx::FromRow` structs, never positional tuples. Both schemas use the same column
//! names and portable types (TEXT ids, BIGINT milliseconds).

use crate::{
    HeartbeatReport, PipelineRef, ScopedSource, StoreError, StoredPipeline, UnreleasedPage,
    keyset_page,
};
use serde::de::DeserializeOwned;
use tollgate_core::{
    AppId, ConfigHash, Dependency, EffectKey, ErrorCode, ModelId, ModelRef, PipelineName, Priority,
    Run, RunId, RunState, ScopeId, SourceId, SourceRef, SourceRevision, StepKey, Subject,
    SubjectKind, Task, TaskError, TaskId, TaskKind, TaskOwner, TaskStatus, Timestamp, TraceParent,
    Usage, WorkerId, validate_output,
};

/// The columns every task query selects, as a literal for `concat!`: `task_columns!()`.
/// The list is written once, below; `task_columns!(qualified)` is the same list with each
/// column qualified by the `tasks.` table name, for statements that join.
macro_rules! task_columns {
    () => {
        $crate::shared::rows::task_columns!(@list plain)
    };
    (qualified) => {
        $crate::shared::rows::task_columns!(@list qualified)
    };
    (@list $form:ident) => {
        $crate::shared::rows::task_columns!(@$form
            id, app, effect_key, kind, step, run_id, scope, subject_type, subject_id, source_id,
            source_revision, recompute, model_id, model_ref, model_config_hash, request,
            input_hash, cache_key, status, cancel_requested, cached_from, output, usage,
            error_code, error_message, attempt, worker, created_at, claimed_at, heartbeat_at,
            completed_at, released_at, reservation, priority, trace_parent, max_attempts
        )
    };
    (@plain $first:ident $(, $column:ident)*) => {
        concat!(stringify!($first) $(, ", ", stringify!($column))*)
    };
    (@qualified $first:ident $(, $column:ident)*) => {
        concat!("tasks.", stringify!($first) $(, ", tasks.", stringify!($column))*)
    };
}
pub(crate) use task_columns;

/// [`task_columns`] qualified with the `tasks.` table name, for statements that join.
#[cfg(feature = "postgres")]
macro_rules! task_columns_qualified {
    () => {
        $crate::shared::rows::task_columns!(qualified)
    };
}
#[cfg(feature = "postgres")]
pub(crate) use task_columns_qualified;

/// The columns every run query selects, as a literal for `concat!`.
macro_rules! run_columns {
    () => {
        "id, app, scope, subject_type, subject_id, state, cancel_requested, input, output, \
         error_code, error_message, waiting_on, created_at, updated_at, woken_at, trace_parent"
    };
}
pub(crate) use run_columns;

#[derive(sqlx::FromRow)]
pub(crate) struct TaskRow {
    id: String,
    app: String,
    effect_key: String,
    kind: String,
    step: String,
    run_id: Option<String>,
    scope: String,
    subject_type: Option<String>,
    subject_id: Option<String>,
    source_id: Option<String>,
    source_revision: Option<String>,
    recompute: bool,
    model_id: String,
    model_ref: String,
    model_config_hash: String,
    request: String,
    input_hash: String,
    cache_key: Option<String>,
    status: String,
    cancel_requested: bool,
    cached_from: Option<String>,
    output: Option<String>,
    usage: Option<String>,
    error_code: Option<String>,
    error_message: Option<String>,
    attempt: i64,
    worker: Option<String>,
    created_at: i64,
    claimed_at: Option<i64>,
    heartbeat_at: Option<i64>,
    completed_at: Option<i64>,
    released_at: Option<i64>,
    reservation: Option<String>,
    priority: i64,
    trace_parent: Option<String>,
    max_attempts: i64,
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

fn json<T: DeserializeOwned>(what: &str, text: &str) -> Result<T, StoreError> {
    serde_json::from_str(text).map_err(|e| corrupt(what, e))
}

fn subject(kind: Option<String>, id: Option<String>) -> Result<Option<Subject>, StoreError> {
    match (kind, id) {
        (Some(k), Some(id)) => Ok(Some(Subject {
            kind: SubjectKind::parse(&k).ok_or_else(|| corrupt("subject_type", &k))?,
            id,
        })),
        _ => Ok(None),
    }
}

fn error(code: Option<String>, message: Option<String>) -> Result<Option<TaskError>, StoreError> {
    match code {
        Some(c) => Ok(Some(TaskError {
            code: ErrorCode::parse(&c).ok_or_else(|| corrupt("error_code", &c))?,
            message: message.unwrap_or_default(),
        })),
        None => Ok(None),
    }
}

pub(crate) fn task_id(s: &str) -> Result<TaskId, StoreError> {
    TaskId::parse(s).map_err(|e| corrupt("task id", e))
}

pub(crate) fn run_id(s: &str) -> Result<RunId, StoreError> {
    RunId::parse(s).map_err(|e| corrupt("run id", e))
}

fn text<T>(what: &str, r: Result<T, tollgate_core::InvalidInput>) -> Result<T, StoreError> {
    r.map_err(|e| corrupt(what, e))
}

impl TaskRow {
    /// A queued row of (app, scope) for tests of the code that reads only its owner.
    #[cfg(test)]
    pub(crate) fn for_test(app: &str, scope: &str) -> TaskRow {
        TaskRow {
            id: uuid::Uuid::new_v4().to_string(),
            app: app.to_owned(),
            effect_key: String::new(),
            kind: String::new(),
            step: String::new(),
            run_id: None,
            scope: scope.to_owned(),
            subject_type: None,
            subject_id: None,
            source_id: None,
            source_revision: None,
            recompute: false,
            model_id: String::new(),
            model_ref: String::new(),
            model_config_hash: String::new(),
            request: String::new(),
            input_hash: String::new(),
            cache_key: None,
            status: "queued".to_owned(),
            cancel_requested: false,
            cached_from: None,
            output: None,
            usage: None,
            error_code: None,
            error_message: None,
            attempt: 0,
            worker: None,
            created_at: 0,
            claimed_at: None,
            heartbeat_at: None,
            completed_at: None,
            released_at: None,
            reservation: None,
            priority: 5,
            trace_parent: None,
            max_attempts: 1,
        }
    }

    /// The task's app, as stored.
    pub(crate) fn app(&self) -> &str {
        &self.app
    }

    /// The task's scope, as stored.
    pub(crate) fn scope(&self) -> &str {
        &self.scope
    }

    pub(crate) fn into_task(self) -> Result<Task, StoreError> {
        let source = match (self.source_id, self.source_revision) {
            (Some(id), Some(rev)) => Some(SourceRef {
                id: text("source_id", SourceId::new(id))?,
                revision: text("source_revision", SourceRevision::new(rev))?,
                recompute: self.recompute,
            }),
            _ => None,
        };
        let owner = match self.run_id {
            Some(r) => TaskOwner::Run {
                run_id: run_id(&r)?,
            },
            None => TaskOwner::Application,
        };
        Ok(Task {
            id: task_id(&self.id)?,
            app: text("app", AppId::new(self.app))?,
            effect_key: text("effect_key", EffectKey::new(self.effect_key))?,
            kind: TaskKind::parse(&self.kind).ok_or_else(|| corrupt("kind", &self.kind))?,
            step: text("step", StepKey::new(self.step))?,
            owner,
            scope: text("scope", ScopeId::new(self.scope))?,
            subject: subject(self.subject_type, self.subject_id)?,
            source,
            model: text("model_id", ModelId::new(self.model_id))?,
            model_ref: json::<ModelRef>("model_ref", &self.model_ref)?,
            model_config_hash: ConfigHash(self.model_config_hash),
            request: json("request", &self.request)?,
            input_hash: self.input_hash,
            cache_key: self.cache_key,
            status: TaskStatus::parse(&self.status)
                .ok_or_else(|| corrupt("status", &self.status))?,
            cancel_requested: self.cancel_requested,
            cached_from: self.cached_from.as_deref().map(task_id).transpose()?,
            output: self
                .output
                .as_deref()
                .map(|o| json("output", o))
                .transpose()?,
            usage: self
                .usage
                .as_deref()
                .map(|u| json("usage", u))
                .transpose()?,
            error: error(self.error_code, self.error_message)?,
            attempt: u32::try_from(self.attempt).unwrap_or(u32::MAX),
            worker: self
                .worker
                .map(|w| text("worker", WorkerId::new(w)))
                .transpose()?,
            created_at: Timestamp(self.created_at),
            claimed_at: self.claimed_at.map(Timestamp),
            heartbeat_at: self.heartbeat_at.map(Timestamp),
            completed_at: self.completed_at.map(Timestamp),
            released_at: self.released_at.map(Timestamp),
            reservation: self
                .reservation
                .as_deref()
                .map(|r| json("reservation", r))
                .transpose()?,
            priority: text("priority", Priority::new(self.priority))?,
            trace_parent: self
                .trace_parent
                .as_deref()
                .map(|t| TraceParent::parse(t).map_err(|e| corrupt("trace_parent", e)))
                .transpose()?,
            max_attempts: u32::try_from(self.max_attempts)
                .ok()
                .and_then(|n| tollgate_core::MaxAttempts::new(n).ok())
                .ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "max_attempts {} of {}",
                        self.max_attempts, self.id
                    ))
                })?,
        })
    }
}

#[derive(sqlx::FromRow)]
pub(crate) struct RunRow {
    id: String,
    app: String,
    scope: String,
    subject_type: Option<String>,
    subject_id: Option<String>,
    state: String,
    cancel_requested: bool,
    input: String,
    output: Option<String>,
    error_code: Option<String>,
    error_message: Option<String>,
    waiting_on: Option<String>,
    created_at: i64,
    updated_at: i64,
    woken_at: Option<i64>,
    trace_parent: Option<String>,
}

impl RunRow {
    pub(crate) fn into_run(self) -> Result<Run, StoreError> {
        Ok(Run {
            id: run_id(&self.id)?,
            app: text("app", AppId::new(self.app))?,
            scope: text("scope", ScopeId::new(self.scope))?,
            subject: subject(self.subject_type, self.subject_id)?,
            state: RunState::parse(&self.state).ok_or_else(|| corrupt("state", &self.state))?,
            cancel_requested: self.cancel_requested,
            input: json("input", &self.input)?,
            output: self
                .output
                .as_deref()
                .map(|o| json("output", o))
                .transpose()?,
            error: error(self.error_code, self.error_message)?,
            waiting_on: self
                .waiting_on
                .as_deref()
                .map(task_id)
                .transpose()?
                .map(Dependency::on_task),
            created_at: Timestamp(self.created_at),
            updated_at: Timestamp(self.updated_at),
            woken_at: self.woken_at.map(Timestamp),
            trace_parent: self
                .trace_parent
                .as_deref()
                .map(|t| TraceParent::parse(t).map_err(|e| corrupt("trace_parent", e)))
                .transpose()?,
        })
    }
}

/// Converts rows, failing on the first corrupt one.
pub(crate) fn tasks(rows: Vec<TaskRow>) -> Result<Vec<Task>, StoreError> {
    rows.into_iter().map(TaskRow::into_task).collect()
}

/// A task that just left `queued`/`running` (or was deleted while there), as the
/// statement that moved it returns it: what capacity accounting and wakes need.
#[derive(sqlx::FromRow, Debug, Clone)]
pub(crate) struct FinishedRow {
    pub(crate) id: String,
    pub(crate) app: String,
    pub(crate) scope: String,
    pub(crate) admitted: bool,
    /// It holds a cost reservation to settle (`reservation IS NOT NULL AS reserved`): a
    /// sourced task admitted, or one without a source that can cost money.
    pub(crate) reserved: bool,
}

/// A task a completion moved, as `RETURNING task_columns_qualified, tasks.admitted,
/// clock.now AS now, … AS listened` gives it, with its attempts as `attempt_charges!`
/// counts them once the completion's attempt has ended (none read for a task without a
/// reservation): the row as it is now, what [`FinishedRow`] holds, what its settlement
/// reads ([`CompletedRow::settle_row`]) and whether its event has a listener.
#[derive(sqlx::FromRow)]
pub(crate) struct CompletedRow {
    #[sqlx(flatten)]
    pub(crate) task: TaskRow,
    pub(crate) admitted: bool,
    pub(crate) now: i64,
    pub(crate) attempts: i64,
    pub(crate) attempts_nano: i64,
    pub(crate) attempts_tokens: i64,
    /// Whether an endpoint of its app listens for its event
    /// ([`task_event_listened!`](crate::shared::webhooks::task_event_listened)).
    pub(crate) listened: bool,
}

impl CompletedRow {
    /// What capacity accounting and wakes need of it.
    pub(crate) fn finished(&self) -> FinishedRow {
        FinishedRow {
            id: self.task.id.clone(),
            app: self.task.app.clone(),
            scope: self.task.scope.clone(),
            admitted: self.admitted,
            reserved: self.task.reservation.is_some(),
        }
    }

    /// What the settlement reads of it ([`TerminalStatements::unsettled`]), when it holds
    /// a reservation.
    ///
    /// [`TerminalStatements::unsettled`]: crate::shared::terminal::TerminalStatements::unsettled
    pub(crate) fn settle_row(&self) -> Option<crate::shared::cost::SettleRow> {
        let task = &self.task;
        Some(crate::shared::cost::SettleRow {
            id: task.id.clone(),
            app: task.app.clone(),
            scope: task.scope.clone(),
            created_at: task.created_at,
            claimed_at: task.claimed_at,
            reservation: task.reservation.clone()?,
            usage: task.usage.clone(),
            attempts: self.attempts,
            attempts_nano: self.attempts_nano,
            attempts_tokens: self.attempts_tokens,
        })
    }
}

/// [`FinishedRow`] with the task's status before the statement moved or deleted it
/// (`RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved, status`).
#[derive(sqlx::FromRow, Debug, Clone)]
pub(crate) struct EndedRow {
    #[sqlx(flatten)]
    pub(crate) finished: FinishedRow,
    pub(crate) status: String,
}

impl EndedRow {
    /// The rows that were queued or running: what gives capacity back when deleted.
    pub(crate) fn in_flight(rows: &[EndedRow]) -> Vec<FinishedRow> {
        rows.iter()
            .filter(|r| r.status == "queued" || r.status == "running")
            .map(|r| r.finished.clone())
            .collect()
    }
}

/// What decides whether a worker should stop a task: the task's status and flag and its
/// run's (`LEFT JOIN runs`).
#[derive(sqlx::FromRow)]
pub(crate) struct CancelStateRow {
    status: String,
    cancel_requested: bool,
    run_cancel_requested: Option<bool>,
    run_state: Option<String>,
}

/// docs/conformance.md#lifecycle: true if the task or its run is canceled or cancellation was requested, and
/// true if the task no longer exists (it was removed with its owner: never finish it).
pub(crate) fn cancellation_requested(row: Option<CancelStateRow>) -> bool {
    match row {
        None => true,
        Some(r) => {
            r.status == "canceled"
                || r.cancel_requested
                || r.run_cancel_requested == Some(true)
                || r.run_state.as_deref() == Some("canceled")
        }
    }
}

/// A (scope, source) pair of `list_unreleased_sources`.
#[derive(sqlx::FromRow, Clone)]
pub(crate) struct ScopedSourceRow {
    scope: String,
    source_id: String,
}

impl ScopedSourceRow {
    pub(crate) fn into_scoped_source(self) -> Result<ScopedSource, StoreError> {
        Ok(ScopedSource {
            scope: text("scope", ScopeId::new(self.scope))?,
            source: text("source_id", SourceId::new(self.source_id))?,
        })
    }
}

/// A keyset page of pairs from the `keyset_fetch(limit)` rows a listing read.
pub(crate) fn unreleased_page(
    rows: Vec<ScopedSourceRow>,
    limit: u32,
) -> Result<UnreleasedPage, StoreError> {
    let sources = rows
        .into_iter()
        .map(ScopedSourceRow::into_scoped_source)
        .collect::<Result<Vec<_>, _>>()?;
    let (sources, next) = keyset_page(sources, limit);
    Ok(UnreleasedPage { sources, next })
}

/// One version of a pipeline definition.
#[derive(sqlx::FromRow)]
pub(crate) struct PipelineRow {
    version: String,
    definition: String,
    created_at: i64,
}

impl PipelineRow {
    pub(crate) fn into_stored(
        self,
        app: &AppId,
        name: &PipelineName,
    ) -> Result<StoredPipeline, StoreError> {
        Ok(StoredPipeline {
            app: app.clone(),
            name: name.clone(),
            version: self.version,
            definition: json("pipeline definition", &self.definition)?,
            created_at: Timestamp(self.created_at),
        })
    }
}

/// The pipeline version of a pipeline run.
#[derive(sqlx::FromRow)]
pub(crate) struct PipelineRefRow {
    pipeline: String,
    version: String,
}

impl PipelineRefRow {
    pub(crate) fn into_ref(self) -> Result<PipelineRef, StoreError> {
        Ok(PipelineRef {
            name: text("pipeline", PipelineName::new(self.pipeline))?,
            version: self.version,
        })
    }
}

/// (app, scope) of a deleted row.
#[derive(sqlx::FromRow)]
pub(crate) struct ScopeRow {
    pub(crate) app: String,
    pub(crate) scope: String,
}

/// The newest cached success of a cache key.
#[cfg(feature = "sqlite")]
#[derive(sqlx::FromRow)]
pub(crate) struct CacheHitRow {
    pub(crate) id: String,
    pub(crate) output: String,
    /// docs/conformance.md#money-and-tokens: what the hit's task was charged (what the hit saves).
    pub(crate) charged_nano: Option<i64>,
}

/// The parsed form of a stored run id (`pipeline_runs.run_id`).
pub(crate) fn pipeline_run_id(s: &str) -> Result<RunId, StoreError> {
    RunId::parse(s).map_err(|e| corrupt(&format!("pipeline run id {s:?}"), e))
}

/// Parses a stored subject (both columns or neither).
#[cfg(feature = "postgres")]
pub(crate) fn stored_subject(
    kind: Option<String>,
    id: Option<String>,
) -> Result<Option<Subject>, StoreError> {
    subject(kind, id)
}

/// A completion's output (checked against the task's contract, docs/conformance.md#lifecycle) and usage, as
/// stored. The request never changes, so the check needs no lock.
pub(crate) fn encode_completion(
    task: &Task,
    output: &serde_json::Value,
    usage: &Usage,
) -> Result<(String, String), StoreError> {
    let request = task.typed_request()?;
    let output = validate_output(&request, output)?;
    let output = serde_json::to_string(&output)
        .map_err(|e| StoreError::Database(format!("cannot encode output: {e}")))?;
    let usage = serde_json::to_string(usage)
        .map_err(|e| StoreError::Database(format!("cannot encode usage: {e}")))?;
    Ok((output, usage))
}

/// A usage as stored.
pub(crate) fn encode_usage(usage: &Usage) -> Result<String, StoreError> {
    serde_json::to_string(usage)
        .map_err(|e| StoreError::Database(format!("cannot encode usage: {e}")))
}

/// docs/conformance.md#heartbeat heartbeat's answer: of the `(id, claim)` pairs asked
/// about, those the statement kept alive (`RETURNING id, attempt`) and the rest, which
/// the worker must stop.
pub(crate) fn heartbeat_report(
    held: &[(TaskId, u32)],
    alive: &[(String, i64)],
) -> Result<HeartbeatReport, StoreError> {
    let alive: std::collections::HashSet<(TaskId, i64)> = alive
        .iter()
        .map(|(id, claim)| Ok((task_id(id)?, *claim)))
        .collect::<Result<_, StoreError>>()?;
    let mut report = HeartbeatReport::default();
    for &(id, claim) in held {
        if alive.contains(&(id, i64::from(claim))) {
            report.alive.push((id, claim));
        } else {
            report.stop.push((id, claim));
        }
    }
    Ok(report)
}

#[cfg(test)]
mod column_list_tests {
    #[test]
    fn the_task_columns_are_the_row_fields_and_the_qualified_form_is_the_same_list() {
        let plain: Vec<&str> = task_columns!().split(", ").collect();
        assert_eq!(plain.len(), 36, "{plain:?}");
        assert_eq!(plain.first(), Some(&"id"));
        assert_eq!(plain.last(), Some(&"max_attempts"));
        let qualified: Vec<&str> = task_columns!(qualified).split(", ").collect();
        let expected: Vec<String> = plain.iter().map(|c| format!("tasks.{c}")).collect();
        assert_eq!(qualified, expected);
    }
}
