//! docs/conformance.md#sweeps on SQLite ([`MaintenanceStore`](crate::MaintenanceStore), written once in
//! `shared::maintenance`): each sweep item one bounded batch in its own short
//! transaction; the writer lock covers every row, so nothing is skipped.

use super::{SqliteStore, id_list};
use crate::shared::attempts::tries_left;
use crate::shared::lifecycle::cancel_wanted;
use crate::shared::maintenance::{MaintenanceStatements, expiry_message, maintenance_store_for};
use crate::shared::rows::{FinishedRow, task_id};
use crate::shared::terminal::{TerminalMove, after_terminal};
use crate::{StoreResult, SweepConfig, SweepReport};
use async_trait::async_trait;
use sqlx::SqlitePool;
use tollgate_core::ErrorCode;

#[async_trait]
impl MaintenanceStatements for SqliteStore {
    const NAME: &'static str = "sqlite";
    const STUCK_WAITS: &'static str = "SELECT r.waiting_on FROM runs r \
         LEFT JOIN tasks t ON t.id = r.waiting_on \
         WHERE r.state = 'waiting' AND r.waiting_on IS NOT NULL \
         AND (t.id IS NULL OR t.status IN ('succeeded', 'failed', 'canceled')) LIMIT $1";
    const REQUEUE_PICK: &'static str = concat!(
        "SELECT id, app, scope FROM tasks WHERE status = 'running' AND claimed_at <= $1 \
         AND heartbeat_at <= $1 AND ",
        tries_left!(),
        " AND NOT ",
        cancel_wanted!(),
        " ORDER BY heartbeat_at LIMIT $2"
    );
    const PRUNE_ADMISSIONS: &'static str = "DELETE FROM admissions WHERE id IN \
         (SELECT id FROM admissions WHERE admitted_at <= $1 ORDER BY admitted_at LIMIT $2)";
    const EXPIRE_SOURCES: &'static str = "DELETE FROM scope_sources WHERE rowid IN \
         (SELECT rowid FROM scope_sources WHERE last_admitted_at <= $1 \
         ORDER BY last_admitted_at LIMIT $2) RETURNING app, scope";
    const FORGET_SOURCES: &'static str = "UPDATE scope_state \
         SET sources_in_window = MAX(sources_in_window - $1, 0) \
         WHERE app = $2 AND scope = $3";
    const PRUNE_SPEND: [&'static str; 2] = [
        "DELETE FROM scope_spend WHERE rowid IN (SELECT rowid FROM scope_spend \
         WHERE bucket < $1 ORDER BY bucket LIMIT $2)",
        "DELETE FROM app_spend WHERE rowid IN (SELECT rowid FROM app_spend \
         WHERE bucket < $1 ORDER BY bucket LIMIT $2)",
    ];
    const RETAIN_TASKS: &'static str = "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks \
         WHERE run_id IS NULL AND released_at IS NOT NULL AND released_at <= $1 \
         AND completed_at IS NOT NULL AND completed_at <= $1 \
         AND status IN ('succeeded', 'failed', 'canceled') \
         ORDER BY released_at LIMIT $2)";

    /// Two statements: the canceled ones first, then the expired.
    async fn expire(
        &self,
        config: &SweepConfig,
        batch: i64,
        queued: bool,
        report: &mut SweepReport,
    ) -> StoreResult<()> {
        let (status, timeout, code) = if queued {
            ("queued", config.queue_timeout, ErrorCode::QueueTimeout)
        } else {
            ("running", config.liveness_timeout, ErrorCode::Interrupted)
        };
        let mut tx = self.begin().await?;
        let now = self.now();
        let cutoff = now.minus(timeout).0;
        let select = if queued {
            "SELECT id FROM tasks WHERE status = 'queued' AND created_at <= ? \
             ORDER BY created_at LIMIT ?"
        } else {
            // A heartbeat is never before its claim: the bound on claimed_at is the
            // index's (tasks_running_claimed), the one on heartbeat_at the rule's. A task
            // the requeue of this sweep would put back in the queue is never failed here
            // (the requeue read its clock earlier).
            concat!(
                "SELECT id FROM tasks WHERE status = 'running' AND claimed_at <= $1 \
                 AND heartbeat_at <= $1 AND (",
                cancel_wanted!(),
                " OR NOT ",
                tries_left!(),
                ") ORDER BY heartbeat_at LIMIT $2"
            )
        };
        let ids: Vec<String> = sqlx::query_scalar(select)
            .bind(cutoff)
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
        if ids.is_empty() {
            tx.rollback().await?;
            return Ok(());
        }
        report.more |= ids.len() as i64 == batch;
        let list = id_list(&ids);
        let canceled: Vec<FinishedRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET status = 'canceled', error_code = ?, \
             error_message = 'canceled by request', completed_at = ? \
             WHERE id IN (SELECT value FROM json_each(?)) AND status IN ('queued', 'running') \
             AND ",
            cancel_wanted!(),
            " RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved"
        ))
        .bind(ErrorCode::Canceled.as_str())
        .bind(now.0)
        .bind(&list)
        .fetch_all(&mut *tx)
        .await?;
        let expired: Vec<FinishedRow> = sqlx::query_as(
            "UPDATE tasks SET status = 'failed', error_code = ?, error_message = ?, \
             completed_at = ? \
             WHERE id IN (SELECT value FROM json_each(?)) AND status = ? \
             RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved",
        )
        .bind(code.as_str())
        .bind(expiry_message(config, queued))
        .bind(now.0)
        .bind(&list)
        .bind(status)
        .fetch_all(&mut *tx)
        .await?;
        let finished: Vec<FinishedRow> = canceled.iter().chain(expired.iter()).cloned().collect();
        let woken = after_terminal(&mut tx, &finished, TerminalMove::SWEPT, now).await?;
        tx.commit().await?;
        report.canceled += canceled.len() as u64;
        if queued {
            report.queue_timed_out += expired.len() as u64;
        } else {
            report.interrupted += expired.len() as u64;
        }
        for f in &finished {
            report.finished.push(task_id(&f.id)?);
        }
        report.woken_runs.extend(woken);
        Ok(())
    }

    /// The writer: the read that follows the insert sees it.
    fn settings(&self) -> SqlitePool {
        self.writer.clone()
    }
}

maintenance_store_for!(SqliteStore);
