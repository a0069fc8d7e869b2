//! SPEC §6 on SQLite ([`MaintenanceStore`]): the background sweep, each item one bounded
//! batch in its own short transaction; recovery after a restart; ping.

use super::lifecycle::{cancel_wanted, wake_runs_waiting_on};
use super::{SqliteStore, id_list};
use crate::shared::rows::{FinishedRow, ScopeRow, task_id};
use crate::shared::terminal::{TerminalMove, after_terminal, count_per_scope};
use crate::{MaintenanceStore, StoreResult, SweepConfig, SweepReport};
use async_trait::async_trait;
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{ErrorCode, TaskId, Timestamp};

#[async_trait]
impl MaintenanceStore for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }

    async fn sweep(&self, config: &SweepConfig) -> StoreResult<SweepReport> {
        let batch = i64::from(config.batch_size.max(1));
        let mut report = SweepReport::default();

        // Items 1–3: queued too long, or running without a heartbeat; canceled instead when
        // cancellation was requested.
        for (status, timeout, code) in [
            ("queued", config.queue_timeout, ErrorCode::QueueTimeout),
            ("running", config.liveness_timeout, ErrorCode::Interrupted),
        ] {
            let mut tx = self.begin().await?;
            let now = self.now();
            let cutoff = now.minus(timeout).0;
            let select = if status == "queued" {
                "SELECT id FROM tasks WHERE status = 'queued' AND created_at <= ? \
                 ORDER BY created_at LIMIT ?"
            } else {
                // A heartbeat is never before its claim: the bound on claimed_at is the
                // index's (tasks_running_claimed), the one on heartbeat_at the rule's.
                "SELECT id FROM tasks WHERE status = 'running' AND claimed_at <= ?1 \
                 AND heartbeat_at <= ?1 ORDER BY heartbeat_at LIMIT ?2"
            };
            let ids: Vec<String> = sqlx::query_scalar(select)
                .bind(cutoff)
                .bind(batch)
                .fetch_all(&mut *tx)
                .await?;
            if ids.is_empty() {
                tx.rollback().await?;
                continue;
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
            let message = if code == ErrorCode::QueueTimeout {
                format!(
                    "queued longer than the queue timeout ({} s)",
                    timeout.as_secs()
                )
            } else {
                format!(
                    "no heartbeat for the liveness timeout ({} s)",
                    timeout.as_secs()
                )
            };
            let expired: Vec<FinishedRow> = sqlx::query_as(
                "UPDATE tasks SET status = 'failed', error_code = ?, error_message = ?, \
                 completed_at = ? \
                 WHERE id IN (SELECT value FROM json_each(?)) AND status = ? \
                 RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved",
            )
            .bind(code.as_str())
            .bind(message)
            .bind(now.0)
            .bind(&list)
            .bind(status)
            .fetch_all(&mut *tx)
            .await?;
            let finished: Vec<FinishedRow> =
                canceled.iter().chain(expired.iter()).cloned().collect();
            let woken = after_terminal(&mut tx, &finished, TerminalMove::SWEPT, now).await?;
            tx.commit().await?;
            report.canceled += canceled.len() as u64;
            if code == ErrorCode::QueueTimeout {
                report.queue_timed_out += expired.len() as u64;
            } else {
                report.interrupted += expired.len() as u64;
            }
            for f in &finished {
                report.finished.push(task_id(&f.id)?);
            }
            report.woken_runs.extend(woken);
        }

        // Item 4: repair lost wakes — a run still waiting on a task that is already terminal
        // (or gone) is woken again.
        {
            let mut tx = self.begin().await?;
            let now = self.now();
            let stuck: Vec<String> = sqlx::query_scalar(
                "SELECT r.waiting_on FROM runs r LEFT JOIN tasks t ON t.id = r.waiting_on \
                 WHERE r.state = 'waiting' AND r.waiting_on IS NOT NULL \
                 AND (t.id IS NULL OR t.status IN ('succeeded', 'failed', 'canceled')) LIMIT ?",
            )
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            if stuck.is_empty() {
                tx.rollback().await?;
            } else {
                report.more |= stuck.len() as i64 == batch;
                let woken = wake_runs_waiting_on(&mut tx, &id_list(&stuck), now).await?;
                tx.commit().await?;
                report.runs_repaired += woken.len() as u64;
                report.woken_runs.extend(woken);
            }
        }

        // Item 5: prune admission records older than 24 h, and the scopes' expired source
        // sightings with their counts.
        {
            let mut tx = self.begin().await?;
            let now = self.now();
            let cutoff = now.minus(ADMISSION_WINDOW).0;
            let pruned = sqlx::query(
                "DELETE FROM admissions WHERE id IN \
                 (SELECT id FROM admissions WHERE admitted_at <= ? ORDER BY admitted_at LIMIT ?)",
            )
            .bind(cutoff)
            .bind(batch)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            report.admissions_pruned += pruned;
            report.more |= pruned as i64 == batch;
            let expired: Vec<ScopeRow> = sqlx::query_as(
                "DELETE FROM scope_sources WHERE rowid IN \
                 (SELECT rowid FROM scope_sources WHERE last_admitted_at <= ? \
                 ORDER BY last_admitted_at LIMIT ?) RETURNING app, scope",
            )
            .bind(cutoff)
            .bind(batch)
            .fetch_all(&mut *tx)
            .await?;
            report.more |= expired.len() as i64 == batch;
            let per_scope = count_per_scope(expired.into_iter().map(|r| (r.app, r.scope)));
            for ((app, scope), n) in per_scope {
                sqlx::query(
                    "UPDATE scope_state SET sources_in_window = MAX(sources_in_window - ?, 0) \
                     WHERE app = ? AND scope = ?",
                )
                .bind(n)
                .bind(app)
                .bind(scope)
                .execute(&mut *tx)
                .await?;
            }
            // SPEC §13: spend buckets older than any window reads.
            let stale = tollgate_core::cost::window_first_bucket(now) - 1;
            for sql in [
                "DELETE FROM scope_spend WHERE rowid IN (SELECT rowid FROM scope_spend \
                 WHERE bucket < ? ORDER BY bucket LIMIT ?)",
                "DELETE FROM app_spend WHERE rowid IN (SELECT rowid FROM app_spend \
                 WHERE bucket < ? ORDER BY bucket LIMIT ?)",
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
            let now: Timestamp = self.now();
            let cutoff = now.minus(config.retention).0;
            let deleted = sqlx::query(
                "DELETE FROM tasks WHERE id IN (SELECT id FROM tasks \
                 WHERE run_id IS NULL AND released_at IS NOT NULL AND released_at <= ?1 \
                 AND completed_at IS NOT NULL AND completed_at <= ?1 \
                 AND status IN ('succeeded', 'failed', 'canceled') \
                 ORDER BY released_at LIMIT ?2)",
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
        .fetch_optional(&self.reader)
        .await?;
        id.as_deref().map(task_id).transpose()
    }

    async fn keep_setting(&self, name: &str, value: &str) -> StoreResult<String> {
        // Two statements: the second sees a value another replica committed meanwhile.
        sqlx::query(
            "INSERT INTO service_settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(value)
        .execute(&self.writer)
        .await?;
        Ok(
            sqlx::query_scalar("SELECT value FROM service_settings WHERE name = ?")
                .bind(name)
                .fetch_one(&self.writer)
                .await?,
        )
    }
}
