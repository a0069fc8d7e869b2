//! docs/conformance.md#sweeps on PostgreSQL ([`MaintenanceStore`](crate::MaintenanceStore), written once in
//! `shared::maintenance`): every replica sweeps; each item is one bounded batch in its own
//! short transaction that skips rows other replicas hold (`FOR UPDATE SKIP LOCKED`), so
//! replicas never wait on each other and never process a row twice.

use super::{PostgresStore, Tx};
use crate::shared::attempts::tries_left;
use crate::shared::lifecycle::cancel_wanted;
use crate::shared::maintenance::{MaintenanceStatements, expiry_message, maintenance_store_for};
use crate::shared::rows::{EndedRow, FinishedRow, task_id};
use crate::shared::terminal::{TerminalMove, after_terminal};
use crate::{StoreResult, SweepConfig, SweepReport};
use async_trait::async_trait;
use sqlx::PgPool;
use tollgate_core::ErrorCode;

/// Items 1–3 for one state: queued past the queue timeout, or running past the liveness
/// timeout; canceled instead when cancellation was requested.
async fn expire(
    store: &PostgresStore,
    config: &SweepConfig,
    batch: i64,
    queued: bool,
    report: &mut SweepReport,
) -> StoreResult<()> {
    let mut tx: Tx = store.begin().await?;
    let now = store.now(&mut tx).await?;
    let (timeout, code) = if queued {
        (config.queue_timeout, ErrorCode::QueueTimeout)
    } else {
        (config.liveness_timeout, ErrorCode::Interrupted)
    };
    let message = expiry_message(config, queued);
    let pick = if queued {
        "SELECT id FROM tasks WHERE status = 'queued' AND created_at <= $1 \
         ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED"
    } else {
        // A heartbeat is never before its claim: the bound on claimed_at is the index's
        // (tasks_running_claimed), the one on heartbeat_at the rule's. A task the requeue
        // of this sweep would put back in the queue is never failed here, whatever the
        // requeue saw (it read its clock earlier, or skipped the row another held).
        concat!(
            "SELECT id FROM tasks WHERE status = 'running' AND claimed_at <= $1 \
             AND heartbeat_at <= $1 AND (",
            cancel_wanted!(),
            " OR NOT ",
            tries_left!(),
            ") ORDER BY heartbeat_at LIMIT $2 FOR UPDATE SKIP LOCKED"
        )
    };
    let ids: Vec<String> = sqlx::query_scalar(pick)
        .bind(now.minus(timeout).0)
        .bind(batch)
        .fetch_all(&mut *tx)
        .await?;
    if ids.is_empty() {
        tx.rollback().await?;
        return Ok(());
    }
    report.more |= ids.len() as i64 == batch;
    let rows: Vec<EndedRow> = sqlx::query_as(concat!(
        "UPDATE tasks SET \
         status = CASE WHEN ",
        cancel_wanted!(),
        " THEN 'canceled' ELSE 'failed' END, \
         error_code = CASE WHEN ",
        cancel_wanted!(),
        " THEN $1 ELSE $2 END, \
         error_message = CASE WHEN ",
        cancel_wanted!(),
        " THEN 'canceled by request' ELSE $3 END, \
         completed_at = $4 \
         WHERE id = ANY($5) AND status IN ('queued', 'running') \
         RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved, status"
    ))
    .bind(ErrorCode::Canceled.as_str())
    .bind(code.as_str())
    .bind(message)
    .bind(now.0)
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    let finished: Vec<FinishedRow> = rows.iter().map(|r| r.finished.clone()).collect();
    // Tasks were locked before runs here, so waking skips runs locked elsewhere.
    let woken = after_terminal(&mut tx, &finished, TerminalMove::SWEPT, now).await?;
    tx.commit().await?;
    for r in &rows {
        if r.status == "canceled" {
            report.canceled += 1;
        } else if queued {
            report.queue_timed_out += 1;
        } else {
            report.interrupted += 1;
        }
        report.finished.push(task_id(&r.finished.id)?);
    }
    report.woken_runs.extend(woken);
    Ok(())
}

#[async_trait]
impl MaintenanceStatements for PostgresStore {
    const NAME: &'static str = "postgres";
    const STUCK_WAITS: &'static str = "SELECT r.waiting_on FROM runs r \
         LEFT JOIN tasks t ON t.id = r.waiting_on \
         WHERE r.state = 'waiting' AND r.waiting_on IS NOT NULL \
         AND (t.id IS NULL OR t.status IN ('succeeded', 'failed', 'canceled')) \
         LIMIT $1 FOR NO KEY UPDATE OF r SKIP LOCKED";
    const REQUEUE_PICK: &'static str = concat!(
        "SELECT id, app, scope FROM tasks WHERE status = 'running' AND claimed_at <= $1 \
         AND heartbeat_at <= $1 AND ",
        tries_left!(),
        " AND NOT ",
        cancel_wanted!(),
        " ORDER BY heartbeat_at LIMIT $2 FOR UPDATE SKIP LOCKED"
    );
    const PRUNE_ADMISSIONS: &'static str = "WITH picked AS MATERIALIZED (SELECT id \
         FROM admissions WHERE admitted_at <= $1 ORDER BY admitted_at LIMIT $2 \
         FOR UPDATE SKIP LOCKED) DELETE FROM admissions a USING picked WHERE a.id = picked.id";
    const EXPIRE_SOURCES: &'static str = "WITH picked AS MATERIALIZED (SELECT app, scope, \
         source_id FROM scope_sources WHERE last_admitted_at <= $1 ORDER BY last_admitted_at \
         LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM scope_sources s USING picked WHERE s.app = picked.app \
         AND s.scope = picked.scope AND s.source_id = picked.source_id \
         RETURNING s.app, s.scope";
    const FORGET_SOURCES: &'static str = "UPDATE scope_state \
         SET sources_in_window = GREATEST(sources_in_window - $1, 0) \
         WHERE app = $2 AND scope = $3";
    const PRUNE_SPEND: [&'static str; 2] = [
        "DELETE FROM scope_spend WHERE (app, scope, bucket) IN (SELECT app, scope, bucket \
         FROM scope_spend WHERE bucket < $1 ORDER BY bucket LIMIT $2 \
         FOR UPDATE SKIP LOCKED)",
        "DELETE FROM app_spend WHERE (app, bucket, stripe) IN (SELECT app, bucket, stripe \
         FROM app_spend WHERE bucket < $1 ORDER BY bucket LIMIT $2 \
         FOR UPDATE SKIP LOCKED)",
    ];
    const RETAIN_TASKS: &'static str = "WITH picked AS MATERIALIZED (SELECT id FROM tasks \
         WHERE run_id IS NULL AND released_at IS NOT NULL AND released_at <= $1 \
         AND completed_at IS NOT NULL AND completed_at <= $1 \
         AND status IN ('succeeded', 'failed', 'canceled') \
         ORDER BY released_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
         DELETE FROM tasks t USING picked WHERE t.id = picked.id";

    async fn expire(
        &self,
        config: &SweepConfig,
        batch: i64,
        queued: bool,
        report: &mut SweepReport,
    ) -> StoreResult<()> {
        expire(self, config, batch, queued, report).await
    }

    fn keep_lean(&self) {
        self.vacuum_dead_rows();
    }

    fn settings(&self) -> PgPool {
        self.pool.clone()
    }
}

maintenance_store_for!(PostgresStore);
