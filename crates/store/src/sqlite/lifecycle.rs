//! docs/conformance.md#heartbeat on SQLite, the worker's side ([`WorkerStore`](crate::WorkerStore)):
//! complete, fail, acknowledge cancellation and the rest are written once in
//! `shared::lifecycle`; here are the statements that differ (the claims and the
//! heartbeat, each in a write transaction, ids as a JSON list) and the batched completion,
//! one transaction for a batch. The write lock serializes a reservation with every
//! admission, so it takes no lock of its own.

use super::{SqliteStore, id_list};
use crate::shared::attempts::{attempt_charges, claim_attempt};
use crate::shared::completion::{self, Batch, BatchCompletion, Prepared};
use crate::shared::lifecycle::{
    WorkerStatements, cancel_wanted, completes_under, run_not_canceled, worker_store_for,
};
use crate::shared::rows::{CompletedRow, TaskRow, task_columns, tasks};
use crate::shared::webhooks::task_event_listened;
use crate::{ClaimOrder, StoreResult};
use async_trait::async_trait;
use std::collections::HashMap;
use tollgate_core::{AttemptOutcome, RunId, Task, TaskId, WorkerId};

/// [`open_claimed_attempts!`] from `tasks` (JSON read with `json_extract`); the caller
/// appends which tasks. For `concat!`.
macro_rules! open_claimed {
    () => {
        $crate::shared::attempts::open_claimed_attempts!(
            "tasks",
            "json_extract(model_ref, '$.provider')",
            "json_extract(model_ref, '$.model')",
            "json_extract(reservation, '$.nano_usd')",
            "json_extract(reservation, '$.tokens')"
        )
    };
}

/// The second statement of a claim's query (appended to its `UPDATE … RETURNING`, one
/// hop to the connection's thread for both): the attempts of the tasks this claim just
/// claimed are opened ([`open_claimed!`]) — running under the claiming worker (the
/// second `?`) since the claim's "now" (the first), and without the attempt their claim
/// numbered (a task claimed earlier in the same transaction, or created claimed, has
/// its attempt already). Its two arguments follow the claim's own. For `concat!`.
macro_rules! opened_now {
    () => {
        concat!(
            "; ",
            $crate::sqlite::lifecycle::open_claimed!(),
            " WHERE status = 'running' AND claimed_at = ? AND worker = ? \
             AND NOT EXISTS (SELECT 1 FROM task_attempts a \
               WHERE a.task_id = tasks.id AND a.n = tasks.attempt)"
        )
    };
}
pub(super) use {open_claimed, opened_now};

#[async_trait]
impl WorkerStatements for SqliteStore {
    const ATTEMPT_ROW_LOCK: &'static str = "";

    async fn claim_one(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<TaskRow>> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let row: Vec<TaskRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET status = 'running', worker = ?, attempt = ",
            claim_attempt!(),
            ", claimed_at = ?, heartbeat_at = ? \
             WHERE id = ? AND status = 'queued' AND cancel_requested = 0 AND ",
            run_not_canceled!(),
            " RETURNING ",
            task_columns!(),
            opened_now!()
        ))
        .bind(worker.as_str())
        .bind(now.0)
        .bind(now.0)
        .bind(id.to_string())
        .bind(now.0)
        .bind(worker.as_str())
        // Every row (at most one): fetching one would stop the query before its second
        // statement.
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row.into_iter().next())
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
                    task_columns!(),
                    opened_now!()
                ))
                .bind(worker.as_str())
                .bind(now.0)
                .bind(now.0)
                .bind(i64::from(limit))
                .bind(now.0)
                .bind(worker.as_str())
                .fetch_all(&mut *tx)
                .await?
            }
        };
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

/// A completion batch's items read from `$1` (a JSON list of objects, [`items_json`]),
/// as the table `i`.
macro_rules! completion_items {
    () => {
        "(SELECT value ->> 'id' AS i_id, value ->> 'worker' AS i_worker, \
         value ->> 'output' AS i_output, value ->> 'usage' AS i_usage, \
         value ->> 'attempt_usage' AS i_attempt_usage, value ->> 'charged_nano' AS i_nano, \
         value ->> 'charged_tokens' AS i_tokens, value ->> 'claim' AS i_claim, \
         value ->> 'guess_nano' AS i_guess_nano, value ->> 'guess_tokens' AS i_guess_tokens \
         FROM json_each($1)) AS i"
    };
}

/// SQL condition: item `i`'s task runs under the item's lease with no cancellation
/// requested ([`completes_under!`], `tasks` unaliased).
macro_rules! item_completes {
    () => {
        concat!(
            "tasks.id = i.i_id AND ",
            completes_under!("i.i_worker", "i.i_claim")
        )
    };
}

/// A completion batch in one query (one hop to the connection's thread), `$1` the items
/// ([`items_json`]), `$2` now, `$3` the attempts' outcome: first the attempts of the
/// tasks that complete end (the items' usage and charge; the same condition as the move,
/// under the same write lock), then the tasks move to `succeeded`, each reserved one
/// charged its guess ([`Batch::guess_nano`]), returning each row as it is now with
/// [`CompletedRow`]'s facts: its attempts as the settlement counts them and whether its
/// event has a listener.
const COMPLETE_BATCH: &str = concat!(
    "UPDATE task_attempts SET ended_at = $2, outcome = $3, usage = i.i_attempt_usage, \
     charged_nano = i.i_nano, charged_tokens = i.i_tokens, error_code = NULL, \
     error_message = NULL FROM ",
    completion_items!(),
    " WHERE task_attempts.task_id = i.i_id AND task_attempts.ended_at IS NULL \
     AND EXISTS (SELECT 1 FROM tasks WHERE ",
    item_completes!(),
    "); UPDATE tasks SET status = 'succeeded', output = i.i_output, usage = i.i_usage, \
     completed_at = $2, \
     charged_nano = CASE WHEN tasks.reservation IS NULL THEN NULL ELSE i.i_guess_nano END, \
     charged_tokens = CASE WHEN tasks.reservation IS NULL THEN NULL ELSE i.i_guess_tokens END \
     FROM ",
    completion_items!(),
    " WHERE ",
    item_completes!(),
    " RETURNING ",
    task_columns!(),
    ", admitted, $2 AS now, ",
    attempt_charges!(),
    ", ",
    task_event_listened!("tasks"),
    " AS listened"
);

/// A batch's items as the JSON list [`completion_items!`] reads.
fn items_json(batch: &Batch) -> String {
    let items: Vec<serde_json::Value> = (0..batch.ids.len())
        .map(|n| {
            serde_json::json!({
                "id": batch.ids[n],
                "worker": batch.workers[n],
                "output": batch.outputs[n],
                "usage": batch.usages[n],
                "attempt_usage": batch.attempt_usages[n],
                "charged_nano": batch.charged_nano[n],
                "charged_tokens": batch.charged_tokens[n],
                "claim": batch.claims[n],
                "guess_nano": batch.guess_nano[n],
                "guess_tokens": batch.guess_tokens[n],
            })
        })
        .collect();
    serde_json::Value::Array(items).to_string()
}

/// Several completions in ONE write transaction ([`completion::complete_batch`], which
/// checks each item as [`complete_task`](crate::WorkerStore::complete_task) checks it):
/// one query ends the attempts and moves every applicable task to `succeeded`
/// ([`COMPLETE_BATCH`]), and the terminal move follows in the same transaction: one
/// commit for the batch, where each completion took its own. Reads outside the write go
/// to the read pool.
#[async_trait]
impl BatchCompletion for SqliteStore {
    async fn tasks_by_id(&self, ids: &[String]) -> StoreResult<HashMap<TaskId, Task>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let rows: Vec<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id IN (SELECT value FROM json_each(?))"
        ))
        .bind(id_list(ids))
        .fetch_all(&self.reader)
        .await?;
        Ok(tasks(rows)?.into_iter().map(|t| (t.id, t)).collect())
    }

    async fn write(&self, prepared: &Prepared) -> StoreResult<(Vec<CompletedRow>, Vec<RunId>)> {
        let mut tx = self.begin().await?;
        let done: Vec<CompletedRow> = sqlx::query_as(COMPLETE_BATCH)
            .bind(items_json(&prepared.batch))
            .bind(self.now().0)
            .bind(AttemptOutcome::Succeeded.as_str())
            .fetch_all(&mut *tx)
            .await?;
        let woken_runs =
            completion::settle_moved(&mut tx, &done, &prepared.batch, prepared.any_run).await?;
        tx.commit().await?;
        Ok((done, woken_runs))
    }
}

/// [`open_claimed!`]: the insert of a task created claimed appends its condition
/// (`sql/create_task.sql`).
pub(super) const OPEN_CLAIMED: &str = open_claimed!();
