//! docs/conformance.md#heartbeat on SQLite, the worker's side ([`WorkerStore`]): claim, heartbeat, complete,
//! fail, acknowledge cancellation; and the statements of a terminal move.

use super::{SqliteStore, id_list};
use crate::shared::cost::{AttemptRow, reserve_checked};
use crate::shared::rows::{
    CancelStateRow, FinishedRow, TaskRow, cancellation_requested, encode_completion, encode_usage,
    heartbeat_report, task_columns, tasks,
};
use crate::shared::sql::Backend;
use crate::shared::tasks::{CANCELED_MESSAGE, fetch_task};
use crate::shared::terminal::TerminalMove;
use crate::shared::terminal::finish;
use crate::{ClaimOrder, HeartbeatReport, MAX_PAGE, StoreResult, Transition, WorkerStore};
use async_trait::async_trait;
use tollgate_core::cost::window_first_bucket;
use tollgate_core::{ErrorCode, Reservation, Task, TaskId, Usage, WorkerId, truncate_message};

/// SQL condition: the task's run (if any) is not canceled.
macro_rules! run_not_canceled {
    () => {
        "(run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = tasks.run_id \
         AND (r.cancel_requested = 1 OR r.state = 'canceled')))"
    };
}
pub(super) use run_not_canceled;

/// SQL condition: cancellation was requested for the task or its run.
macro_rules! cancel_wanted {
    () => {
        "(cancel_requested = 1 OR (run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs r \
         WHERE r.id = tasks.run_id AND (r.cancel_requested = 1 OR r.state = 'canceled'))))"
    };
}
pub(super) use cancel_wanted;

#[async_trait]
impl WorkerStore for SqliteStore {
    async fn claim_task(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<Task>> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let row: Option<TaskRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET status = 'running', worker = ?, attempt = attempt + 1, \
             claimed_at = ?, heartbeat_at = ? \
             WHERE id = ? AND status = 'queued' AND cancel_requested = 0 AND ",
            run_not_canceled!(),
            " RETURNING ",
            task_columns!()
        ))
        .bind(worker.as_str())
        .bind(now.0)
        .bind(now.0)
        .bind(id.to_string())
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        row.map(TaskRow::into_task).transpose()
    }

    async fn claim_next(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<Task>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let limit = limit.min(MAX_PAGE);
        let mut tx = self.begin().await?;
        let now = self.now();
        let rows = match self.claim_order {
            ClaimOrder::Fair => {
                super::dispatch::claim_fair(&self.queue_view, &mut tx, worker, limit, now).await?
            }
            ClaimOrder::Oldest => {
                sqlx::query_as(concat!(
                    "UPDATE tasks SET status = 'running', worker = ?, attempt = attempt + 1, \
                     claimed_at = ?, heartbeat_at = ? \
                     WHERE id IN (SELECT id FROM tasks WHERE status = 'queued' \
                     AND cancel_requested = 0 AND ",
                    run_not_canceled!(),
                    " ORDER BY created_at, id LIMIT ?) RETURNING ",
                    task_columns!()
                ))
                .bind(worker.as_str())
                .bind(now.0)
                .bind(now.0)
                .bind(i64::from(limit))
                .fetch_all(&mut *tx)
                .await?
            }
        };
        tx.commit().await?;
        // A batch starts at once; present it oldest first as before.
        let mut claimed = tasks(rows)?;
        claimed.sort_by_key(|t| (t.created_at, t.id));
        Ok(claimed)
    }

    async fn heartbeat(&self, worker: &WorkerId, ids: &[TaskId]) -> StoreResult<HeartbeatReport> {
        if ids.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        let mut tx = self.begin().await?;
        let now = self.now();
        // One write for all of the worker's tasks.
        let alive: Vec<String> = sqlx::query_scalar(concat!(
            "UPDATE tasks SET heartbeat_at = ? \
             WHERE id IN (SELECT value FROM json_each(?)) AND status = 'running' AND worker = ? \
             AND NOT ",
            cancel_wanted!(),
            " RETURNING id"
        ))
        .bind(now.0)
        .bind(id_list(ids))
        .bind(worker.as_str())
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        heartbeat_report(ids, &alive)
    }

    async fn complete_task(
        &self,
        id: TaskId,
        worker: &WorkerId,
        output: serde_json::Value,
        usage: Usage,
    ) -> StoreResult<Transition> {
        // The request never changes, so its contract can be checked before taking the write
        // lock. An invalid output is never stored as success.
        let Some(current) = fetch_task(&mut self.reader(), &id.to_string()).await? else {
            return Ok(Transition::default());
        };
        let (output, usage) = encode_completion(&current, &output, &usage)?;
        let mut tx = self.begin().await?;
        let now = self.now();
        let done: Option<FinishedRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET status = 'succeeded', output = ?, usage = ?, completed_at = ? \
             WHERE id = ? AND status = 'running' AND worker = ? AND NOT ",
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
        let now = self.now();
        let done: Option<FinishedRow> = sqlx::query_as(
            "UPDATE tasks SET status = 'failed', error_code = ?, error_message = ?, completed_at = ?, \
             usage = COALESCE(?, usage) \
             WHERE id = ? AND status IN ('queued', 'running') RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved",
        )
        .bind(code.as_str())
        .bind(truncate_message(message))
        .bind(now.0)
        .bind(usage)
        .bind(id.to_string())
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
        // The write lock serializes this with every admission (the same exactness).
        let mut tx = self.begin().await?;
        let now = self.now();
        let row: Option<AttemptRow> = sqlx::query_as(concat!(
            "SELECT tasks.id, tasks.app, tasks.scope, tasks.created_at, tasks.reservation, \
             s.token_units, s.token_at, \
             (SELECT COALESCE(SUM(reserved_nano + settled_nano), 0) FROM scope_spend b \
              WHERE b.app = tasks.app AND b.scope = tasks.scope AND b.bucket >= ?) \
              AS scope_window_nano \
             FROM tasks LEFT JOIN scope_state s ON s.app = tasks.app AND s.scope = tasks.scope \
             WHERE tasks.id = ? AND tasks.status = 'running' AND tasks.worker = ? \
             AND tasks.reservation IS NOT NULL AND NOT ",
            cancel_wanted!()
        ))
        .bind(window_first_bucket(now))
        .bind(id.to_string())
        .bind(worker.as_str())
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
        let now = self.now();
        let done: Option<FinishedRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET cancel_requested = 1, status = 'canceled', error_code = ?, \
             error_message = ?, completed_at = ? \
             WHERE id = ? AND status IN ('queued', 'running') AND ",
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
             FROM tasks t LEFT JOIN runs r ON r.id = t.run_id WHERE t.id = ?",
        )
        .bind(id.to_string())
        .fetch_optional(&self.reader)
        .await?;
        Ok(cancellation_requested(row))
    }
}
