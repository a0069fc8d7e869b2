//! SPEC §6 on PostgreSQL: every replica sweeps; each item is one bounded batch in its own
//! short transaction that skips rows other replicas hold (`FOR UPDATE SKIP LOCKED`), so
//! replicas never wait on each other and never process a row twice.

//!
//! Also [`MaintenanceStore`]'s recovery listing and ping.

use super::lifecycle::{cancel_wanted, wake_runs_waiting_on};
use super::{PostgresStore, Tx};
use crate::shared::rows::{EndedRow, FinishedRow, ScopeRow, task_id};
use crate::shared::terminal::{TerminalMove, after_terminal, count_per_scope};
use crate::{MaintenanceStore, StoreResult, SweepConfig, SweepReport};
use async_trait::async_trait;
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{ErrorCode, TaskId, Timestamp};

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
    let (timeout, code, message) = if queued {
        (
            config.queue_timeout,
            ErrorCode::QueueTimeout,
            format!(
                "queued longer than the queue timeout ({} s)",
                config.queue_timeout.as_secs()
            ),
        )
    } else {
        (
            config.liveness_timeout,
            ErrorCode::Interrupted,
            format!(
                "no heartbeat for the liveness timeout ({} s)",
                config.liveness_timeout.as_secs()
            ),
        )
    };
    let pick = if queued {
        "SELECT id FROM tasks WHERE status = 'queued' AND created_at <= $1 \
         ORDER BY created_at LIMIT $2 FOR UPDATE SKIP LOCKED"
    } else {
        // A heartbeat is never before its claim: the bound on claimed_at is the index's
        // (tasks_running_claimed), the one on heartbeat_at the rule's.
        "SELECT id FROM tasks WHERE status = 'running' AND claimed_at <= $1 \
         AND heartbeat_at <= $1 ORDER BY heartbeat_at LIMIT $2 FOR UPDATE SKIP LOCKED"
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
impl MaintenanceStore for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn sweep(&self, config: &SweepConfig) -> StoreResult<SweepReport> {
        let batch = i64::from(config.batch_size.max(1));
        let mut report = SweepReport::default();

        // Items 1–3.
        expire(self, config, batch, true, &mut report).await?;
        expire(self, config, batch, false, &mut report).await?;

        // Item 4: repair lost wakes.
        {
            let mut tx = self.begin().await?;
            let now = self.now(&mut tx).await?;
            let stuck: Vec<String> = sqlx::query_scalar(
                "SELECT r.waiting_on FROM runs r LEFT JOIN tasks t ON t.id = r.waiting_on \
                 WHERE r.state = 'waiting' AND r.waiting_on IS NOT NULL \
                 AND (t.id IS NULL OR t.status IN ('succeeded', 'failed', 'canceled')) \
                 LIMIT $1 FOR NO KEY UPDATE OF r SKIP LOCKED",
            )
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            if stuck.is_empty() {
                tx.rollback().await?;
            } else {
                report.more |= stuck.len() as i64 == batch;
                let woken = wake_runs_waiting_on(&mut tx, &stuck, now, false).await?;
                tx.commit().await?;
                report.runs_repaired += woken.len() as u64;
                report.woken_runs.extend(woken);
            }
        }

        // Item 5: prune admission records older than 24 h, and expired source sightings with
        // their scopes' counts (each deleted row is subtracted once, by its deleter).
        {
            let mut tx = self.begin().await?;
            let now = self.now(&mut tx).await?;
            let cutoff = now.minus(ADMISSION_WINDOW).0;
            let pruned = sqlx::query(
                "WITH picked AS MATERIALIZED (SELECT id FROM admissions WHERE admitted_at <= $1 \
                 ORDER BY admitted_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM admissions a USING picked WHERE a.id = picked.id",
            )
            .bind(cutoff)
            .bind(batch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            report.admissions_pruned += pruned;
            report.more |= pruned as i64 == batch;
            let expired: Vec<ScopeRow> = sqlx::query_as(
                "WITH picked AS MATERIALIZED (SELECT app, scope, source_id FROM scope_sources \
                 WHERE last_admitted_at <= $1 ORDER BY last_admitted_at LIMIT $2 \
                 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM scope_sources s USING picked WHERE s.app = picked.app \
                 AND s.scope = picked.scope AND s.source_id = picked.source_id \
                 RETURNING s.app, s.scope",
            )
            .bind(cutoff)
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            report.more |= expired.len() as i64 == batch;
            let per_scope = count_per_scope(expired.into_iter().map(|r| (r.app, r.scope)));
            // Sorted: the lock order for scope rows.
            for ((app, scope), n) in per_scope {
                sqlx::query(
                    "UPDATE scope_state SET sources_in_window = GREATEST(sources_in_window - $1, 0) \
                     WHERE app = $2 AND scope = $3",
                )
                .bind(n)
                .bind(app)
                .bind(scope)
                .execute(&mut *tx)
                .await?;
            }
            // SPEC §13: spend buckets older than any window reads (the window's first
            // bucket, minus one spare hour).
            let stale = tollgate_core::cost::window_first_bucket(now) - 1;
            for sql in [
                "DELETE FROM scope_spend WHERE (app, scope, bucket) IN (SELECT app, scope, bucket \
                 FROM scope_spend WHERE bucket < $1 ORDER BY bucket LIMIT $2 \
                 FOR UPDATE SKIP LOCKED)",
                "DELETE FROM app_spend WHERE (app, bucket, stripe) IN (SELECT app, bucket, stripe \
                 FROM app_spend WHERE bucket < $1 ORDER BY bucket LIMIT $2 \
                 FOR UPDATE SKIP LOCKED)",
            ] {
                let n = sqlx::query(sql)
                    .bind(stale)
                    .bind(batch)
                    .execute(&mut *tx)
                    .await?
                    .rows_affected();
                report.more |= n as i64 == batch;
            }
            tx.commit().await?;
        }

        // Item 6: retention of released, terminal application tasks.
        {
            let mut tx = self.begin().await?;
            let now: Timestamp = self.now(&mut tx).await?;
            let cutoff = now.minus(config.retention).0;
            let deleted = sqlx::query(
                "WITH picked AS MATERIALIZED (SELECT id FROM tasks \
                 WHERE run_id IS NULL AND released_at IS NOT NULL AND released_at <= $1 \
                 AND completed_at IS NOT NULL AND completed_at <= $1 \
                 AND status IN ('succeeded', 'failed', 'canceled') \
                 ORDER BY released_at LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 DELETE FROM tasks t USING picked WHERE t.id = picked.id",
            )
            .bind(cutoff)
            .bind(batch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            tx.commit().await?;
            report.tasks_deleted += deleted;
            report.more |= deleted as i64 == batch;
        }
        Ok(report)
    }

    async fn first_queued(&self) -> StoreResult<Option<TaskId>> {
        let id: Option<String> = sqlx::query_scalar(
            "SELECT id FROM tasks WHERE status = 'queued' ORDER BY created_at, id LIMIT 1",
        )
        .fetch_optional(&self.pool)
        .await?;
        id.as_deref().map(task_id).transpose()
    }

    async fn keep_setting(&self, name: &str, value: &str) -> StoreResult<String> {
        // Two statements: the second sees a value another replica committed meanwhile.
        sqlx::query(
            "INSERT INTO service_settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(value)
        .execute(&self.pool)
        .await?;
        Ok(
            sqlx::query_scalar("SELECT value FROM service_settings WHERE name = $1")
                .bind(name)
                .fetch_one(&self.pool)
                .await?,
        )
    }
}
