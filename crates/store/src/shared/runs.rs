//! docs/conformance.md#workflow-runs written once: the dialect-free rules of a run's step (when a run may wait on a
//! task, when it may finish, the columns of its ending) and the [`RunStore`](crate::RunStore)
//! transactions themselves ([`Runs`]); a backend supplies only the statements that differ
//! ([`RunStatements`]: PostgreSQL's row locks, the cancel cascade).
//! Lock order on PostgreSQL: the run's row first, then its tasks.

use crate::shared::rows::{
    FinishedRow, RunRow, TaskRow, run_columns, task_columns, task_id, tasks,
};
use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::shared::tasks::fetch_task;
use crate::shared::terminal::{TerminalMove, after_terminal};
use crate::shared::webhooks::record_run_event;
use crate::{RunCancel, RunResult, StoreError, StoreResult, WaitOutcome};
use tollgate_core::canonical::canonical_json;
use tollgate_core::{
    AppId, ErrorCode, NewRun, Run, RunId, RunState, Task, TaskId, Timestamp, truncate_message,
};

/// A run may wait only while it exists in the app and is not finished.
pub(crate) fn may_wait(run: RunId, current: Option<&Run>) -> StoreResult<()> {
    let Some(current) = current else {
        return Err(StoreError::RunNotFound(run.to_string()));
    };
    if current.state.is_terminal() {
        return Err(StoreError::InvalidState(format!(
            "run {run} is {} and cannot wait",
            current.state.as_str()
        )));
    }
    Ok(())
}

/// A run waits only on a task of its own (another app's or run's task is missing).
/// Returns the task when it is already terminal: the run stays runnable and reads it now.
pub(crate) fn ready_task(
    app: &AppId,
    run: RunId,
    task_id: TaskId,
    task: Option<Task>,
) -> StoreResult<Option<Task>> {
    match task {
        Some(t) if t.app == *app && t.run_id() == Some(run) => {
            Ok(t.status.is_terminal().then_some(t))
        }
        _ => Err(StoreError::TaskNotFound(task_id.to_string())),
    }
}

/// A finished run is final.
pub(crate) fn may_finish(run: RunId, current: &Run) -> StoreResult<()> {
    if current.state.is_terminal() {
        return Err(StoreError::InvalidState(format!(
            "run {run} is already {}",
            current.state.as_str()
        )));
    }
    Ok(())
}

/// The columns a run's ending writes.
pub(crate) struct RunEnding {
    pub(crate) state: RunState,
    pub(crate) output: Option<String>,
    pub(crate) error_code: Option<&'static str>,
    pub(crate) error_message: Option<String>,
}

impl RunEnding {
    pub(crate) fn of(result: &RunResult) -> StoreResult<RunEnding> {
        Ok(match result {
            RunResult::Succeeded(out) => RunEnding {
                state: RunState::Succeeded,
                output: Some(canonical_json(out).map_err(|e| e.within("output"))?),
                error_code: None,
                error_message: None,
            },
            RunResult::Failed(err) => RunEnding {
                state: RunState::Failed,
                output: None,
                error_code: Some(err.code.as_str()),
                error_message: Some(truncate_message(&err.message)),
            },
        })
    }
}

/// What differs between the backends in a run's transactions: the row locks PostgreSQL
/// takes (SQLite's write lock already covers every row) and the cancel cascade's
/// statement.
pub(crate) trait RunStatements: Backend {
    /// Locks the run's row (`$1` run, `$2` app) before any of its tasks, or nothing.
    const LOCK_RUN: Option<&'static str>;
    /// Holds the waited-on task (`$1`) so it cannot become terminal between the check and
    /// the wait (the wake cannot be lost), or nothing.
    const HOLD_TASK: Option<&'static str>;
    /// Cancels the run's queued and running tasks (`$1` error code, `$2` now, `$3` run),
    /// returning them as [`FinishedRow`]s.
    const CANCEL_RUN_TASKS: &'static str;
}

/// The run, if it is the app's.
pub(crate) async fn fetch_run<E: Exec + ?Sized>(
    exec: &mut E,
    app: &AppId,
    id: RunId,
) -> StoreResult<Option<Run>> {
    let row: Option<RunRow> = exec
        .optional(
            Statement::new(concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE id = $1 AND app = $2"
            ))
            .bind(id.to_string())
            .bind(app.as_str()),
        )
        .await?;
    row.map(RunRow::into_run).transpose()
}

/// Inserts a new run in state `running`.
pub(crate) async fn insert_run<E: Exec + ?Sized>(
    tx: &mut E,
    new: &NewRun,
    now: Timestamp,
) -> StoreResult<RunId> {
    let input = canonical_json(&new.input).map_err(|e| e.within("input"))?;
    let id = RunId::generate();
    tx.run(
        Statement::new(
            "INSERT INTO runs (id, app, scope, subject_type, subject_id, state, input, \
             created_at, updated_at, trace_parent) \
             VALUES ($1, $2, $3, $4, $5, 'running', $6, $7, $7, $8)",
        )
        .bind(id.to_string())
        .bind(new.app.as_str())
        .bind(new.scope.as_str())
        .bind(new.subject.as_ref().map(|s| s.kind.as_str()))
        .bind(new.subject.as_ref().map(|s| s.id.as_str()))
        .bind(input)
        .bind(now.0)
        .bind(new.trace_parent.map(|t| t.to_string())),
    )
    .await?;
    Ok(id)
}

/// A canceled or finished pipeline run is never driven again.
async fn pipeline_done<E: Exec + ?Sized>(tx: &mut E, run: RunId) -> StoreResult<()> {
    tx.run(
        Statement::new("UPDATE pipeline_runs SET done = TRUE WHERE run_id = $1")
            .bind(run.to_string()),
    )
    .await?;
    Ok(())
}

async fn lock_run<B: RunStatements>(tx: &mut B::Tx, app: &AppId, run: RunId) -> StoreResult<()> {
    if let Some(lock) = B::LOCK_RUN {
        tx.run(
            Statement::new(lock)
                .bind(run.to_string())
                .bind(app.as_str()),
        )
        .await?;
    }
    Ok(())
}

/// [`RunStore`], written once; a backend supplies [`RunStatements`].
pub(crate) struct Runs;

impl Runs {
    pub(crate) async fn get_run<B: RunStatements>(
        store: &B,
        app: &AppId,
        id: RunId,
    ) -> StoreResult<Option<Run>> {
        fetch_run(&mut store.reader(), app, id).await
    }

    pub(crate) async fn create_run<B: RunStatements>(store: &B, new: NewRun) -> StoreResult<Run> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let id = insert_run(&mut tx, &new, now).await?;
        let run = fetch_run(&mut tx, &new.app, id).await?;
        tx.commit_tx().await?;
        run.ok_or_else(|| StoreError::Database("inserted run vanished".into()))
    }

    /// Cancels the run and, in cascade, its queued and running tasks (which free their
    /// steps).
    pub(crate) async fn request_run_cancel<B: RunStatements>(
        store: &B,
        app: &AppId,
        id: RunId,
    ) -> StoreResult<Option<RunCancel>> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        lock_run::<B>(&mut tx, app, id).await?;
        let was_open = fetch_run(&mut tx, app, id)
            .await?
            .is_some_and(|r| !r.state.is_terminal());
        let updated = tx
            .run(
                Statement::new(
                    "UPDATE runs SET cancel_requested = TRUE, \
                     state = CASE WHEN state IN ('running', 'waiting') THEN 'canceled' ELSE state END, \
                     error_code = CASE WHEN state IN ('running', 'waiting') THEN $1 ELSE error_code END, \
                     error_message = CASE WHEN state IN ('running', 'waiting') THEN 'run canceled by request' \
                     ELSE error_message END, \
                     waiting_on = CASE WHEN state IN ('running', 'waiting') THEN NULL ELSE waiting_on END, \
                     updated_at = $2 WHERE id = $3 AND app = $4",
                )
                .bind(ErrorCode::Canceled.as_str())
                .bind(now.0)
                .bind(id.to_string())
                .bind(app.as_str()),
            )
            .await?;
        if updated == 0 {
            tx.rollback_tx().await?;
            return Ok(None);
        }
        let canceled: Vec<FinishedRow> = tx
            .all(
                Statement::new(B::CANCEL_RUN_TASKS)
                    .bind(ErrorCode::Canceled.as_str())
                    .bind(now.0)
                    .bind(id.to_string()),
            )
            .await?;
        after_terminal(&mut tx, &canceled, TerminalMove::ENDED, now).await?;
        pipeline_done(&mut tx, id).await?;
        if was_open {
            record_run_event(&mut tx, &id.to_string(), now).await?;
        }
        let run = fetch_run(&mut tx, app, id).await?;
        tx.commit_tx().await?;
        let run = run.ok_or_else(|| StoreError::Database("canceled run vanished".into()))?;
        Ok(Some(RunCancel {
            run,
            canceled_tasks: canceled
                .iter()
                .map(|f| task_id(&f.id))
                .collect::<StoreResult<_>>()?,
        }))
    }

    pub(crate) async fn wait_on_task<B: RunStatements>(
        store: &B,
        app: &AppId,
        run: RunId,
        task: TaskId,
    ) -> StoreResult<WaitOutcome> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        lock_run::<B>(&mut tx, app, run).await?;
        let current = fetch_run(&mut tx, app, run).await?;
        may_wait(run, current.as_ref())?;
        if let Some(hold) = B::HOLD_TASK {
            tx.run(Statement::new(hold).bind(task.to_string())).await?;
        }
        let t = fetch_task(&mut tx, &task.to_string()).await?;
        if let Some(t) = ready_task(app, run, task, t)? {
            tx.rollback_tx().await?;
            return Ok(WaitOutcome::Ready(Box::new(t)));
        }
        tx.run(
            Statement::new(
                "UPDATE runs SET state = 'waiting', waiting_on = $1, updated_at = $2 WHERE id = $3",
            )
            .bind(task.to_string())
            .bind(now.0)
            .bind(run.to_string()),
        )
        .await?;
        let waiting = fetch_run(&mut tx, app, run).await?;
        tx.commit_tx().await?;
        waiting
            .map(|r| WaitOutcome::Waiting(Box::new(r)))
            .ok_or_else(|| StoreError::Database("waiting run vanished".into()))
    }

    pub(crate) async fn finish_run<B: RunStatements>(
        store: &B,
        app: &AppId,
        run: RunId,
        result: RunResult,
    ) -> StoreResult<Option<Run>> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        lock_run::<B>(&mut tx, app, run).await?;
        let Some(current) = fetch_run(&mut tx, app, run).await? else {
            return Ok(None);
        };
        may_finish(run, &current)?;
        let ending = RunEnding::of(&result)?;
        tx.run(
            Statement::new(
                "UPDATE runs SET state = $1, output = $2, error_code = $3, error_message = $4, \
                 waiting_on = NULL, updated_at = $5 WHERE id = $6",
            )
            .bind(ending.state.as_str())
            .bind(ending.output)
            .bind(ending.error_code)
            .bind(ending.error_message)
            .bind(now.0)
            .bind(run.to_string()),
        )
        .await?;
        pipeline_done(&mut tx, run).await?;
        record_run_event(&mut tx, &run.to_string(), now).await?;
        let finished = fetch_run(&mut tx, app, run).await?;
        tx.commit_tx().await?;
        Ok(finished)
    }

    pub(crate) async fn run_tasks<B: RunStatements>(
        store: &B,
        app: &AppId,
        run: RunId,
    ) -> StoreResult<Vec<Task>> {
        let rows: Vec<TaskRow> = store
            .reader()
            .all(
                Statement::new(concat!(
                    "SELECT ",
                    task_columns!(),
                    " FROM tasks WHERE run_id = $1 AND app = $2 ORDER BY created_at, id"
                ))
                .bind(run.to_string())
                .bind(app.as_str()),
            )
            .await?;
        tasks(rows)
    }
}

/// [`RunStore`] for a backend that implements [`RunStatements`] (written once; the
/// store's wrappers forward the trait by a blanket impl, so each backend states its own).
macro_rules! run_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::RunStore for $store {
            async fn get_run(
                &self,
                app: &tollgate_core::AppId,
                id: tollgate_core::RunId,
            ) -> $crate::StoreResult<Option<tollgate_core::Run>> {
                $crate::shared::runs::Runs::get_run(self, app, id).await
            }

            async fn create_run(
                &self,
                new: tollgate_core::NewRun,
            ) -> $crate::StoreResult<tollgate_core::Run> {
                $crate::shared::runs::Runs::create_run(self, new).await
            }

            async fn request_run_cancel(
                &self,
                app: &tollgate_core::AppId,
                id: tollgate_core::RunId,
            ) -> $crate::StoreResult<Option<$crate::RunCancel>> {
                $crate::shared::runs::Runs::request_run_cancel(self, app, id).await
            }

            async fn wait_on_task(
                &self,
                app: &tollgate_core::AppId,
                run: tollgate_core::RunId,
                task: tollgate_core::TaskId,
            ) -> $crate::StoreResult<$crate::WaitOutcome> {
                $crate::shared::runs::Runs::wait_on_task(self, app, run, task).await
            }

            async fn finish_run(
                &self,
                app: &tollgate_core::AppId,
                run: tollgate_core::RunId,
                result: $crate::RunResult,
            ) -> $crate::StoreResult<Option<tollgate_core::Run>> {
                $crate::shared::runs::Runs::finish_run(self, app, run, result).await
            }

            async fn run_tasks(
                &self,
                app: &tollgate_core::AppId,
                run: tollgate_core::RunId,
            ) -> $crate::StoreResult<Vec<tollgate_core::Task>> {
                $crate::shared::runs::Runs::run_tasks(self, app, run).await
            }
        }
    };
}
pub(crate) use run_store_for;
