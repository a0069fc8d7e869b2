//! docs/conformance.md#heartbeat on PostgreSQL, the worker's side ([`WorkerStore`]): claim, heartbeat,
//! complete, fail, acknowledge cancellation; and the statements of a terminal move.

use super::admission::{app_lock_key, lock_scope};
use super::terminal::lock_run_of;
use super::{PostgresStore, id_array, now_sql};
use crate::shared::cost::{AttemptRow, decode_reservation, reserve_checked};
use crate::shared::rows::{
    CancelStateRow, CompletedRow, FinishedRow, TaskRow, cancellation_requested, encode_completion,
    encode_usage, heartbeat_report, task_columns, task_columns_qualified, tasks,
};
use crate::shared::sql::Backend;
use crate::shared::tasks::{CANCELED_MESSAGE, fetch_task};
use crate::shared::terminal::finish;
use crate::shared::terminal::{TerminalMove, Wake, after_terminal};
use crate::{
    ClaimOrder, Completion, HeartbeatReport, MAX_PAGE, StoreError, StoreResult, Transition,
    WorkerStore,
};
use async_trait::async_trait;
use std::collections::{HashMap, HashSet};
use tollgate_core::cost::window_first_bucket;
use tollgate_core::{
    AppId, ErrorCode, Reservation, ScopeId, Task, TaskId, Timestamp, Usage, WorkerId,
    truncate_message,
};

/// SQL condition: the task's run (if any) is not canceled.
macro_rules! run_not_canceled {
    () => {
        "(run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = tasks.run_id \
         AND (r.cancel_requested OR r.state = 'canceled')))"
    };
}
pub(super) use run_not_canceled;

/// SQL conditions on the status of a task named by id, written with `IS NOT DISTINCT
/// FROM` (the same as `=` on the NOT NULL column) so they imply no partial index's
/// predicate: the statement then reads its task through the primary key whatever the
/// statistics say. With `status = 'queued'` or `status IN ('queued', 'running')`, and
/// statistics taken while no task was queued, the planner walked `tasks_queued_dispatch`
/// or `tasks_app_unsucceeded` whole, believing them nearly empty.
macro_rules! status_is_queued {
    () => {
        "status IS NOT DISTINCT FROM 'queued'"
    };
}
macro_rules! status_in_flight {
    () => {
        "(status IS NOT DISTINCT FROM 'queued' OR status IS NOT DISTINCT FROM 'running')"
    };
}
pub(super) use status_in_flight;

/// SQL condition: cancellation was requested for the task or its run.
macro_rules! cancel_wanted {
    () => {
        "(tasks.cancel_requested OR (tasks.run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs r \
         WHERE r.id = tasks.run_id AND (r.cancel_requested OR r.state = 'canceled'))))"
    };
}
pub(super) use cancel_wanted;

#[async_trait]
impl WorkerStore for PostgresStore {
    async fn claim_task(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<Task>> {
        // One statement, its own transaction: one round trip. A concurrent claim waits for
        // the row, then re-checks `status = 'queued'` and finds it running: each task is
        // claimed once.
        let row: Option<TaskRow> = sqlx::query_as(concat!(
            "WITH clock AS (SELECT ",
            now_sql!(2),
            " AS now) UPDATE tasks SET status = 'running', worker = $1, attempt = attempt + 1, \
             claimed_at = clock.now, heartbeat_at = clock.now FROM clock \
             WHERE id = $3 AND ",
            status_is_queued!(),
            " AND NOT cancel_requested AND ",
            run_not_canceled!(),
            " RETURNING ",
            task_columns_qualified!()
        ))
        .bind(worker.as_str())
        .bind(self.fixed_now())
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        row.map(TaskRow::into_task).transpose()
    }

    async fn claim_next(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<Task>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = limit.min(MAX_PAGE);
        let rows = match self.claim_order {
            ClaimOrder::Fair => super::dispatch::claim_fair(self, worker, limit).await?,
            // One statement, its own transaction: one round trip for the whole claim.
            // MATERIALIZED: the pick runs once, so LIMIT and SKIP LOCKED hold exactly.
            ClaimOrder::Oldest => {
                sqlx::query_as(concat!(
                    "WITH clock AS (SELECT ",
                    now_sql!(2),
                    " AS now), picked AS MATERIALIZED (SELECT id FROM tasks \
                     WHERE status = 'queued' AND NOT cancel_requested AND ",
                    run_not_canceled!(),
                    " ORDER BY created_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
                     UPDATE tasks SET status = 'running', worker = $1, attempt = attempt + 1, \
                     claimed_at = clock.now, heartbeat_at = clock.now FROM clock \
                     WHERE tasks.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING ",
                    task_columns_qualified!()
                ))
                .bind(worker.as_str())
                .bind(self.fixed_now())
                .bind(i64::from(limit))
                .fetch_all(&self.pool)
                .await?
            }
        };
        // A batch starts at once; present it oldest first as before.
        let mut claimed = tasks(rows)?;
        claimed.sort_by_key(|t| (t.created_at, t.id));
        Ok(claimed)
    }

    async fn heartbeat(&self, worker: &WorkerId, ids: &[TaskId]) -> StoreResult<HeartbeatReport> {
        if ids.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        // One statement for all of the worker's tasks, its own transaction: one round trip.
        // Rows are locked in id order (the lock order for several task rows).
        let alive: Vec<String> = sqlx::query_scalar(concat!(
            "WITH picked AS MATERIALIZED (SELECT id FROM tasks WHERE id = ANY($2) \
             AND status = 'running' AND worker = $3 ORDER BY id FOR NO KEY UPDATE) \
             UPDATE tasks SET heartbeat_at = ",
            now_sql!(1),
            " FROM picked \
             WHERE tasks.id = picked.id AND tasks.status = 'running' AND NOT ",
            cancel_wanted!(),
            " RETURNING tasks.id"
        ))
        .bind(self.fixed_now())
        .bind(id_array(ids))
        .bind(worker.as_str())
        .fetch_all(&self.pool)
        .await?;
        heartbeat_report(ids, &alive)
    }

    async fn complete_task(
        &self,
        id: TaskId,
        worker: &WorkerId,
        output: serde_json::Value,
        usage: Usage,
    ) -> StoreResult<Transition> {
        // The request never changes, so its contract is checked before the write.
        let Some(current) = fetch_task(&mut self.reader(), &id.to_string()).await? else {
            return Ok(Transition::default());
        };
        let (output, usage) = encode_completion(&current, &output, &usage)?;
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        if current.run_id().is_some() {
            lock_run_of(&mut tx, id).await?;
        }
        let done: Option<FinishedRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET status = 'succeeded', output = $1, usage = $2, completed_at = $3 \
             WHERE id = $4 AND status = 'running' AND worker = $5 AND NOT ",
            cancel_wanted!(),
            " RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved"
        ))
        .bind(output)
        .bind(usage)
        .bind(now.0)
        .bind(id.to_string())
        .bind(worker.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        finish(tx, id, done, TerminalMove::SUCCEEDED, now).await
    }

    async fn fail_task(
        &self,
        id: TaskId,
        code: ErrorCode,
        message: &str,
        usage: Option<&Usage>,
    ) -> StoreResult<Transition> {
        let usage = usage.map(encode_usage).transpose()?;
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        lock_run_of(&mut tx, id).await?;
        let done: Option<FinishedRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET status = 'failed', error_code = $1, error_message = $2, \
             completed_at = $3, usage = COALESCE($5, usage) WHERE id = $4 AND ",
            status_in_flight!(),
            " RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved"
        ))
        .bind(code.as_str())
        .bind(truncate_message(message))
        .bind(now.0)
        .bind(id.to_string())
        .bind(usage)
        .fetch_optional(&mut *tx)
        .await?;
        finish(tx, id, done, TerminalMove::ENDED, now).await
    }

    async fn reserve_attempt(
        &self,
        id: TaskId,
        worker: &WorkerId,
        attempt: &Reservation,
    ) -> StoreResult<Option<Reservation>> {
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        let first = window_first_bucket(now);
        // Which scope: then its exclusive advisory lock, as an admission takes it, so this
        // reservation and the scope's admissions are serialized (the same exactness).
        let owner: Option<(String, String, String)> = sqlx::query_as(
            "SELECT app, scope, reservation FROM tasks WHERE id = $1 AND reservation IS NOT NULL",
        )
        .bind(id.to_string())
        .fetch_optional(&mut *tx)
        .await?;
        let Some((app, scope, admitted)) = owner else {
            return Ok(None);
        };
        // The limits never change after admission: whether the app's lock is needed.
        let app_limited = decode_reservation(&id.to_string(), &admitted)?
            .limits
            .is_some_and(|l| l.app_nano_per_24_hours.is_some());
        let corrupt =
            |e: tollgate_core::InvalidInput| StoreError::Corrupt(format!("task {id}: {e}"));
        let app_id = AppId::new(app).map_err(corrupt)?;
        let scope_id = ScopeId::new(scope).map_err(corrupt)?;
        lock_scope(&mut tx, &app_id, &scope_id, true).await?;
        if app_limited {
            // The app's spend lock, as an admission takes it (scope, then app), in its
            // own statement so the app's window read below is current.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(app_lock_key(&app_id))
                .execute(&mut *tx)
                .await?;
        }
        // Lock order (docs/locking.md): advisory (app, scope), the app's spend lock,
        // then the task row, then scope_state and the spend buckets.
        let row: Option<AttemptRow> = sqlx::query_as(
            "SELECT t.id, t.app, t.scope, t.created_at, t.reservation, \
             s.token_units, s.token_at, \
             (SELECT COALESCE(SUM(reserved_nano + settled_nano), 0)::BIGINT FROM scope_spend b \
              WHERE b.app = t.app AND b.scope = t.scope AND b.bucket >= $3) AS scope_window_nano \
             FROM tasks t LEFT JOIN scope_state s ON s.app = t.app AND s.scope = t.scope \
             WHERE t.id = $1 AND t.status IS NOT DISTINCT FROM 'running' AND t.worker = $2 \
             AND t.reservation IS NOT NULL AND NOT (t.cancel_requested OR (t.run_id IS NOT NULL \
             AND EXISTS (SELECT 1 FROM runs r WHERE r.id = t.run_id \
             AND (r.cancel_requested OR r.state = 'canceled')))) FOR UPDATE OF t",
        )
        .bind(id.to_string())
        .bind(worker.as_str())
        .bind(first)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let stored = reserve_checked(&mut tx, &row, attempt, now).await?;
        tx.commit().await?;
        Ok(Some(stored))
    }

    async fn mark_canceled(&self, id: TaskId) -> StoreResult<Transition> {
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        lock_run_of(&mut tx, id).await?;
        let done: Option<FinishedRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET cancel_requested = TRUE, status = 'canceled', error_code = $1, \
             error_message = $2, completed_at = $3 \
             WHERE id = $4 AND ",
            status_in_flight!(),
            " AND ",
            cancel_wanted!(),
            " RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved"
        ))
        .bind(ErrorCode::Canceled.as_str())
        .bind(CANCELED_MESSAGE)
        .bind(now.0)
        .bind(id.to_string())
        .fetch_optional(&mut *tx)
        .await?;
        finish(tx, id, done, TerminalMove::ENDED, now).await
    }

    async fn is_cancellation_requested(&self, id: TaskId) -> StoreResult<bool> {
        let row: Option<CancelStateRow> = sqlx::query_as(
            "SELECT t.status, t.cancel_requested, r.cancel_requested AS run_cancel_requested, \
             r.state AS run_state \
             FROM tasks t LEFT JOIN runs r ON r.id = t.run_id WHERE t.id = $1",
        )
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?;
        Ok(cancellation_requested(row))
    }

    /// Several completions in ONE transaction (see `WorkerStore::complete_tasks`): each item is
    /// checked as [`complete_task`] checks it, then one statement moves every applicable task
    /// to `succeeded` (for unscoped application tasks that statement is the whole
    /// transaction). Lock order as on the single paths: the runs of the tasks first, then
    /// the task rows in id order. Runs woken by the batch are reported on its first applied
    /// transition (wakes are notification hints; the database holds the truth).
    async fn complete_tasks(
        &self,
        items: Vec<Completion>,
    ) -> StoreResult<Vec<StoreResult<Transition>>> {
        if items.is_empty() {
            return Ok(Vec::new());
        }
        // The request never changes, so its contract is checked before the write: against
        // the worker's claimed copy when it has one, else against the row read first.
        let unknown: Vec<String> = items
            .iter()
            .filter(|item| claimed_copy(item).is_none())
            .map(|item| item.id.to_string())
            .collect();
        let read = tasks_by_id(&self.pool, &unknown).await?;
        let mut answers: Vec<Option<StoreResult<Transition>>> =
            items.iter().map(|_| None).collect();
        let (mut ids, mut workers, mut outputs, mut usages) = (vec![], vec![], vec![], vec![]);
        let mut seen = HashSet::new();
        let mut any_run = false;
        for (i, item) in items.iter().enumerate() {
            let Some(task) = claimed_copy(item).or_else(|| read.get(&item.id)) else {
                answers[i] = Some(Ok(Transition::default()));
                continue;
            };
            if !seen.insert(item.id) {
                // The same task twice: only its first completion can apply.
                answers[i] = Some(Ok(Transition::default()));
                continue;
            }
            match encode_completion(task, &item.output, &item.usage) {
                Ok((output, usage)) => {
                    any_run |= task.run_id().is_some();
                    ids.push(item.id.to_string());
                    workers.push(item.worker.as_str().to_string());
                    outputs.push(output);
                    usages.push(usage);
                }
                Err(e) if e.is_per_item() => answers[i] = Some(Err(e)),
                Err(e) => return Err(e),
            }
        }
        // Every completion may write webhook events with it (docs/webhooks.md, "The
        // outbox"), so the UPDATE always runs in a transaction with the terminal-move plan.
        let mut tx = Some(self.begin().await?);
        let mut done: Vec<CompletedRow> = Vec::new();
        let mut woken_runs = Vec::new();
        if !ids.is_empty() {
            if let Some(tx) = tx.as_mut().filter(|_| any_run) {
                sqlx::query(
                    "SELECT 1 FROM runs WHERE id IN (SELECT run_id FROM tasks WHERE id = ANY($1)) \
                     ORDER BY id FOR NO KEY UPDATE",
                )
                .bind(&ids)
                .execute(&mut **tx)
                .await?;
            }
            // "now" is read inside the statement (no round trip of its own) and returned
            // with every row it moved, as the row is now (no read afterwards). The rows are
            // found by id as arrays (`= ANY`), locked in id order, and only then joined to
            // the items: joined to the unnested items from the start, the planner (which
            // cannot know how many items there are) took every running task for every
            // item, 9 ms for a batch of 57 behind 150 running tasks instead of 1.
            let update = sqlx::query_as(concat!(
                "WITH clock AS (SELECT ",
                now_sql!(5),
                " AS now), \
                 item AS (SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[]) \
                 AS i(id, worker, output, usage)), \
                 picked AS MATERIALIZED (SELECT id FROM tasks WHERE id = ANY($1) \
                 AND status = 'running' ORDER BY id FOR NO KEY UPDATE) \
                 UPDATE tasks SET status = 'succeeded', output = item.output, usage = item.usage, \
                 completed_at = clock.now FROM item, clock \
                 WHERE tasks.id = ANY(ARRAY(SELECT id FROM picked)) AND item.id = tasks.id \
                 AND tasks.status = 'running' AND tasks.worker = item.worker AND NOT ",
                cancel_wanted!(),
                " RETURNING ",
                task_columns_qualified!(),
                ", tasks.admitted, clock.now AS now"
            ))
            .bind(&ids)
            .bind(&workers)
            .bind(&outputs)
            .bind(&usages)
            .bind(self.fixed_now());
            done = match tx.as_mut() {
                Some(tx) => update.fetch_all(&mut **tx).await?,
                None => update.fetch_all(&self.pool).await?,
            };
            // Only run-owned tasks can have waiting runs: skip the wake statement otherwise.
            if let Some(tx) = tx.as_mut() {
                let now = done.first().map_or(Timestamp(0), |d| Timestamp(d.now));
                let finished: Vec<FinishedRow> = done.iter().map(CompletedRow::finished).collect();
                let plan = if any_run {
                    TerminalMove::SUCCEEDED
                } else {
                    TerminalMove {
                        wake: Wake::No,
                        ..TerminalMove::SUCCEEDED
                    }
                };
                woken_runs = after_terminal(tx, &finished, plan, now).await?;
            }
        }
        if let Some(tx) = tx {
            tx.commit().await?;
        }
        let mut after: HashMap<TaskId, Task> = tasks(done.into_iter().map(|d| d.task).collect())?
            .into_iter()
            .map(|t| (t.id, t))
            .collect();
        let applied: HashSet<TaskId> = after.keys().copied().collect();
        // A refused item is answered with its task as it is now: read only those.
        let refused: Vec<String> = items
            .iter()
            .zip(&answers)
            .filter(|(item, answer)| !applied.contains(&item.id) && !matches!(answer, Some(Err(_))))
            .map(|(item, _)| item.id.to_string())
            .collect();
        after.extend(tasks_by_id(&self.pool, &refused).await?);
        let mut answered = HashSet::new();
        Ok(items
            .iter()
            .zip(answers)
            .map(|(item, answer)| match answer {
                Some(Err(e)) => Err(e),
                _ if applied.contains(&item.id) && answered.insert(item.id) => Ok(Transition {
                    applied: true,
                    task: after.get(&item.id).cloned(),
                    woken_runs: std::mem::take(&mut woken_runs),
                }),
                _ => Ok(Transition {
                    applied: false,
                    task: after.get(&item.id).cloned(),
                    woken_runs: Vec::new(),
                }),
            })
            .collect())
    }
}

/// The worker's claimed copy of an item's task, when it has one of that task.
fn claimed_copy(item: &Completion) -> Option<&Task> {
    item.claimed.as_deref().filter(|t| t.id == item.id)
}

/// The tasks of these ids that exist, by id (no statement for none).
async fn tasks_by_id(pool: &sqlx::PgPool, ids: &[String]) -> StoreResult<HashMap<TaskId, Task>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(tasks(rows)?.into_iter().map(|t| (t.id, t)).collect())
}
