//! SPEC §7 on SQLite: workflow runs, waiting on tasks, cancel cascade.

use super::lifecycle::after_terminal;
use super::{SqliteStore, fetch_task};
use crate::rows::{FinishedRow, RunRow, run_columns, task_id};
use crate::{RunCancel, RunResult, StoreError, StoreResult, WaitOutcome};
use tollgate_core::canonical::canonical_json as canonical_json_text;
use tollgate_core::{AppId, ErrorCode, NewRun, Run, RunId, RunState, TaskId, truncate_message};

pub(super) async fn get_run(
    exec: impl sqlx::SqliteExecutor<'_>,
    app: &AppId,
    id: RunId,
) -> StoreResult<Option<Run>> {
    let row: Option<RunRow> = sqlx::query_as(concat!(
        "SELECT ",
        run_columns!(),
        " FROM runs WHERE id = ? AND app = ?"
    ))
    .bind(id.to_string())
    .bind(app.as_str())
    .fetch_optional(exec)
    .await?;
    row.map(RunRow::into_run).transpose()
}

pub(super) async fn create_run(store: &SqliteStore, new: NewRun) -> StoreResult<Run> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let id = insert_run(&mut tx, &new, now).await?;
    let run = get_run(&mut *tx, &new.app, id).await?;
    tx.commit().await?;
    run.ok_or_else(|| StoreError::Database("inserted run vanished".into()))
}

/// Inserts a new run in state `running`.
pub(super) async fn insert_run(
    tx: &mut super::Tx,
    new: &NewRun,
    now: tollgate_core::Timestamp,
) -> StoreResult<RunId> {
    let input = canonical_json_text(&new.input).map_err(|e| e.within("input"))?;
    let id = RunId::generate();
    sqlx::query(
        "INSERT INTO runs (id, app, scope, subject_type, subject_id, state, input, created_at, \
         updated_at) VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?)",
    )
    .bind(id.to_string())
    .bind(new.app.as_str())
    .bind(new.scope.as_str())
    .bind(new.subject.as_ref().map(|s| s.kind.as_str()))
    .bind(new.subject.as_ref().map(|s| s.id.as_str()))
    .bind(input)
    .bind(now.0)
    .bind(now.0)
    .execute(&mut **tx)
    .await?;
    Ok(id)
}

pub(super) async fn request_run_cancel(
    store: &SqliteStore,
    app: &AppId,
    id: RunId,
) -> StoreResult<Option<RunCancel>> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let updated = sqlx::query(
        "UPDATE runs SET cancel_requested = 1, \
         state = CASE WHEN state IN ('running', 'waiting') THEN 'canceled' ELSE state END, \
         error_code = CASE WHEN state IN ('running', 'waiting') THEN ? ELSE error_code END, \
         error_message = CASE WHEN state IN ('running', 'waiting') THEN 'run canceled by request' \
         ELSE error_message END, \
         waiting_on = CASE WHEN state IN ('running', 'waiting') THEN NULL ELSE waiting_on END, \
         updated_at = ? WHERE id = ? AND app = ?",
    )
    .bind(ErrorCode::Canceled.as_str())
    .bind(now.0)
    .bind(id.to_string())
    .bind(app.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected();
    if updated == 0 {
        tx.rollback().await?;
        return Ok(None);
    }
    // Cascade: the run's queued and running tasks are canceled and free their steps.
    let canceled: Vec<FinishedRow> = sqlx::query_as(
        "UPDATE tasks SET cancel_requested = 1, status = 'canceled', error_code = ?, \
         error_message = 'run canceled by request', completed_at = ? \
         WHERE run_id = ? AND status IN ('queued', 'running') RETURNING id, app, scope, admitted",
    )
    .bind(ErrorCode::Canceled.as_str())
    .bind(now.0)
    .bind(id.to_string())
    .fetch_all(&mut *tx)
    .await?;
    after_terminal(&mut tx, &canceled, true, now).await?;
    // A canceled pipeline run is never driven again.
    sqlx::query("UPDATE pipeline_runs SET done = 1 WHERE run_id = ?")
        .bind(id.to_string())
        .execute(&mut *tx)
        .await?;
    let run = get_run(&mut *tx, app, id).await?;
    tx.commit().await?;
    let run = run.ok_or_else(|| StoreError::Database("canceled run vanished".into()))?;
    Ok(Some(RunCancel {
        run,
        canceled_tasks: canceled
            .iter()
            .map(|f| task_id(&f.id))
            .collect::<StoreResult<_>>()?,
    }))
}

pub(super) async fn wait_on_task(
    store: &SqliteStore,
    app: &AppId,
    run: RunId,
    task: TaskId,
) -> StoreResult<WaitOutcome> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let Some(current) = get_run(&mut *tx, app, run).await? else {
        return Err(StoreError::RunNotFound(run.to_string()));
    };
    if current.state.is_terminal() {
        return Err(StoreError::InvalidState(format!(
            "run {run} is {} and cannot wait",
            current.state.as_str()
        )));
    }
    let Some(t) = fetch_task(&mut *tx, &task.to_string()).await? else {
        return Err(StoreError::TaskNotFound(task.to_string()));
    };
    if t.app != *app || t.run_id() != Some(run) {
        return Err(StoreError::TaskNotFound(task.to_string()));
    }
    if t.status.is_terminal() {
        tx.rollback().await?;
        return Ok(WaitOutcome::Ready(Box::new(t)));
    }
    sqlx::query("UPDATE runs SET state = 'waiting', waiting_on = ?, updated_at = ? WHERE id = ?")
        .bind(task.to_string())
        .bind(now.0)
        .bind(run.to_string())
        .execute(&mut *tx)
        .await?;
    let waiting = get_run(&mut *tx, app, run).await?;
    tx.commit().await?;
    waiting
        .map(|r| WaitOutcome::Waiting(Box::new(r)))
        .ok_or_else(|| StoreError::Database("waiting run vanished".into()))
}

pub(super) async fn finish_run(
    store: &SqliteStore,
    app: &AppId,
    run: RunId,
    result: RunResult,
) -> StoreResult<Option<Run>> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let Some(current) = get_run(&mut *tx, app, run).await? else {
        return Ok(None);
    };
    if current.state.is_terminal() {
        return Err(StoreError::InvalidState(format!(
            "run {run} is already {}",
            current.state.as_str()
        )));
    }
    let (state, output, code, message) = match &result {
        RunResult::Succeeded(out) => (
            RunState::Succeeded,
            Some(canonical_json_text(out).map_err(|e| e.within("output"))?),
            None,
            None,
        ),
        RunResult::Failed(err) => (
            RunState::Failed,
            None,
            Some(err.code.as_str()),
            Some(truncate_message(&err.message)),
        ),
    };
    sqlx::query(
        "UPDATE runs SET state = ?, output = ?, error_code = ?, error_message = ?, \
         waiting_on = NULL, updated_at = ? WHERE id = ?",
    )
    .bind(state.as_str())
    .bind(output)
    .bind(code)
    .bind(message)
    .bind(now.0)
    .bind(run.to_string())
    .execute(&mut *tx)
    .await?;
    sqlx::query("UPDATE pipeline_runs SET done = 1 WHERE run_id = ?")
        .bind(run.to_string())
        .execute(&mut *tx)
        .await?;
    let finished = get_run(&mut *tx, app, run).await?;
    tx.commit().await?;
    Ok(finished)
}
