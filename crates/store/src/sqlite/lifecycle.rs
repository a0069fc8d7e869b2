//! docs/conformance.md#heartbeat on SQLite, the worker's side ([`WorkerStore`](crate::WorkerStore)):
//! complete, fail, acknowledge cancellation and the rest are written once in
//! `shared::lifecycle`; here are the statements that differ (the claims and the
//! heartbeat, each in a write transaction, ids as a JSON list). The write lock serializes
//! a reservation with every admission, so it takes no lock of its own.

use super::{SqliteStore, id_list};
use crate::shared::attempts::{claim_attempt, open_claimed_attempts};
use crate::shared::lifecycle::{
    WorkerStatements, cancel_wanted, run_not_canceled, worker_store_for,
};
use crate::shared::rows::{TaskRow, task_columns};
use crate::{ClaimOrder, StoreResult};
use async_trait::async_trait;
use sqlx::SqliteConnection;
use tollgate_core::{TaskId, WorkerId};

#[async_trait]
impl WorkerStatements for SqliteStore {
    const ATTEMPT_ROW_LOCK: &'static str = "";

    async fn claim_one(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<TaskRow>> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let row = sqlx::query_as(concat!(
            "UPDATE tasks SET status = 'running', worker = ?, attempt = ",
            claim_attempt!(),
            ", claimed_at = ?, heartbeat_at = ? \
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
        if let Some(row) = &row {
            open_claimed(&mut tx, std::slice::from_ref(row)).await?;
        }
        tx.commit().await?;
        Ok(row)
    }

    async fn claim_rows(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<TaskRow>> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let rows = match self.claim_order {
            ClaimOrder::Fair => {
                super::dispatch::claim_fair(&self.queue_view, &mut tx, worker, limit, now).await?
            }
            ClaimOrder::Oldest => {
                sqlx::query_as(concat!(
                    "UPDATE tasks SET status = 'running', worker = ?, attempt = ",
                    claim_attempt!(),
                    ", claimed_at = ?, heartbeat_at = ? \
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
        open_claimed(&mut tx, &rows).await?;
        tx.commit().await?;
        Ok(rows)
    }

    async fn keep_alive(
        &self,
        worker: &WorkerId,
        held: &[(TaskId, u32)],
    ) -> StoreResult<Vec<(String, i64)>> {
        let mut tx = self.begin().await?;
        let now = self.now();
        // One write for all of the worker's tasks: found by id (the primary key), each
        // kept only under a claim asked about with it (`?3`, a JSON list of `[id, claim]`
        // pairs, read once into a list: not a subquery per row, which grows with the
        // square of the ids).
        let ids: Vec<TaskId> = held.iter().map(|(id, _)| *id).collect();
        let pairs = serde_json::Value::Array(
            held.iter()
                .map(|(id, claim)| serde_json::json!([id.to_string(), claim]))
                .collect(),
        )
        .to_string();
        let alive = sqlx::query_as(concat!(
            "UPDATE tasks SET heartbeat_at = ?1 \
             WHERE id IN (SELECT value FROM json_each(?2)) AND status = 'running' AND worker = ?4 \
             AND (id, attempt) IN (SELECT json_extract(value, '$[0]'), \
             json_extract(value, '$[1]') FROM json_each(?3)) AND NOT ",
            cancel_wanted!(),
            " RETURNING id, attempt"
        ))
        .bind(now.0)
        .bind(id_list(&ids))
        .bind(pairs)
        .bind(worker.as_str())
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(alive)
    }

    async fn lock_attempt(&self, _tx: &mut Self::Tx, _id: TaskId) -> StoreResult<bool> {
        // The write lock (`BEGIN IMMEDIATE`) serializes this with every admission (the
        // same exactness); the task's read says whether there is anything to reserve.
        Ok(true)
    }
}

worker_store_for!(SqliteStore);

/// Opens the first attempt of a task created claimed (`NewTask::claim_by`), in its
/// creating transaction, as a claim's are opened.
pub(super) async fn open_claimed_task(conn: &mut SqliteConnection, id: TaskId) -> StoreResult<()> {
    open_claimed_ids(conn, &[id.to_string().as_str()]).await
}

/// Opens the attempts of the tasks just claimed, in the claim's transaction.
async fn open_claimed(tx: &mut SqliteConnection, rows: &[TaskRow]) -> StoreResult<()> {
    let ids: Vec<&str> = rows.iter().map(TaskRow::id).collect();
    open_claimed_ids(tx, &ids).await
}

/// [`open_claimed_attempts!`] for tasks by id (JSON read with `json_extract`).
async fn open_claimed_ids(tx: &mut SqliteConnection, ids: &[&str]) -> StoreResult<()> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(open_claimed_attempts!(
        "tasks WHERE id IN (SELECT value FROM json_each(?))",
        "json_extract(model_ref, '$.provider')",
        "json_extract(model_ref, '$.model')",
        "json_extract(reservation, '$.nano_usd')",
        "json_extract(reservation, '$.tokens')"
    ))
    .bind(id_list(ids))
    .execute(&mut *tx)
    .await?;
    Ok(())
}
