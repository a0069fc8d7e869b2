//! SPEC §7 on SQLite ([`RunStore`]): workflow runs, waiting on tasks, cancel cascade.

use super::{SqliteStore, fetch_task};
use crate::shared::rows::{
    FinishedRow, RunRow, TaskRow, run_columns, task_columns, task_id, tasks,
};
use crate::shared::runs::{RunEnding, may_finish, may_wait, ready_task};
use crate::shared::terminal::{TerminalMove, after_terminal};
use crate::{RunCancel, RunResult, RunStore, StoreError, StoreResult, WaitOutcome};
use async_trait::async_trait;
use tollgate_core::canonical::canonical_json as canonical_json_text;
use tollgate_core::{AppId, ErrorCode, NewRun, Run, RunId, Task, TaskId};

pub(super) async fn fetch_run(
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

#[async_trait]
impl RunStore for SqliteStore {
    async fn get_run(&self, app: &AppId, id: RunId) -> StoreResult<Option<Run>> {
        fetch_run(&self.reader, app, id).await
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<Run> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let id = insert_run(&mut tx, &new, now).await?;
        let run = fetch_run(&mut *tx, &new.app, id).await?;
        tx.commit().await?;
        run.ok_or_else(|| StoreError::Database("inserted run vanished".into()))
    }

    async fn request_run_cancel(&self, app: &AppId, id: RunId) -> StoreResult<Option<RunCancel>> {
        let mut tx = self.begin().await?;
        let now = self.now();
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
             WHERE run_id = ? AND status IN ('queued', 'running') RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved",
        )
        .bind(ErrorCode::Canceled.as_str())
        .bind(now.0)
        .bind(id.to_string())
        .fetch_all(&mut *tx)
        .await?;
        after_terminal(&mut tx, &canceled, TerminalMove::ENDED, now).await?;
        // A canceled pipeline run is never driven again.
        sqlx::query("UPDATE pipeline_runs SET done = 1 WHERE run_id = ?")
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
        let run = fetch_run(&mut *tx, app, id).await?;
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

    async fn wait_on_task(
        &self,
        app: &AppId,
        run: RunId,
        task: TaskId,
    ) -> StoreResult<WaitOutcome> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let current = fetch_run(&mut *tx, app, run).await?;
        may_wait(run, current.as_ref())?;
        let t = fetch_task(&mut *tx, &task.to_string()).await?;
        if let Some(t) = ready_task(app, run, task, t)? {
            tx.rollback().await?;
            return Ok(WaitOutcome::Ready(Box::new(t)));
        }
        sqlx::query(
            "UPDATE runs SET state = 'waiting', waiting_on = ?, updated_at = ? WHERE id = ?",
        )
        .bind(task.to_string())
        .bind(now.0)
        .bind(run.to_string())
        .execute(&mut *tx)
        .await?;
        let waiting = fetch_run(&mut *tx, app, run).await?;
        tx.commit().await?;
        waiting
            .map(|r| WaitOutcome::Waiting(Box::new(r)))
            .ok_or_else(|| StoreError::Database("waiting run vanished".into()))
    }

    async fn finish_run(
        &self,
        app: &AppId,
        run: RunId,
        result: RunResult,
    ) -> StoreResult<Option<Run>> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let Some(current) = fetch_run(&mut *tx, app, run).await? else {
            return Ok(None);
        };
        may_finish(run, &current)?;
        let ending = RunEnding::of(&result)?;
        sqlx::query(
            "UPDATE runs SET state = ?, output = ?, error_code = ?, error_message = ?, \
             waiting_on = NULL, updated_at = ? WHERE id = ?",
        )
        .bind(ending.state.as_str())
        .bind(ending.output)
        .bind(ending.error_code)
        .bind(ending.error_message)
        .bind(now.0)
        .bind(run.to_string())
        .execute(&mut *tx)
        .await?;
        sqlx::query("UPDATE pipeline_runs SET done = 1 WHERE run_id = ?")
            .bind(run.to_string())
            .execute(&mut *tx)
            .await?;
        let finished = fetch_run(&mut *tx, app, run).await?;
        tx.commit().await?;
        Ok(finished)
    }

    async fn run_tasks(&self, app: &AppId, run: RunId) -> StoreResult<Vec<Task>> {
        let rows: Vec<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE run_id = ? AND app = ? ORDER BY created_at, id"
        ))
        .bind(run.to_string())
        .bind(app.as_str())
        .fetch_all(&self.reader)
        .await?;
        tasks(rows)
    }
}
