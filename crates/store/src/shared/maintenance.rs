//! docs/conformance.md#sweeps written once ([`Maintenance`]): the sweep's items, each one bounded batch in
//! its own short transaction, the recovery listing, ping and kept settings. A backend
//! supplies its statements ([`MaintenanceStatements`]: PostgreSQL's skip rows other
//! replicas hold, so replicas never wait on each other and never process a row twice)
//! and its expiry of queued and running tasks (items 1–3).

use crate::shared::attempts::{RequeueRow, requeue};
use crate::shared::rows::{ScopeRow, task_id};
use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::shared::terminal::{TerminalStatements, count_per_scope};
use crate::{StoreResult, SweepConfig, SweepReport};
use async_trait::async_trait;
use tollgate_core::TaskId;
use tollgate_core::admission::ADMISSION_WINDOW;

/// What differs between the backends in maintenance.
#[async_trait]
pub(crate) trait MaintenanceStatements: Backend {
    /// The backend's name.
    const NAME: &'static str;
    /// Item 4: up to `$1` runs still waiting on a task that is terminal or gone; the
    /// tasks' ids.
    const STUCK_WAITS: &'static str;
    /// Item 2 for tasks with tries left (docs/routes.md, "Attempts"): up to `$2` running
    /// tasks silent since `$1` (claimed and last heartbeat at or before it), whose
    /// cancellation was not requested and that were claimed fewer times and made fewer
    /// attempts than their `max_attempts` (each claim uses up a try, so a task of one
    /// try is never run twice): their id, app and scope.
    const REQUEUE_PICK: &'static str;
    /// Item 5: deletes up to `$2` admission records admitted at or before `$1`.
    const PRUNE_ADMISSIONS: &'static str;
    /// Item 5: deletes up to `$2` source sightings last admitted at or before `$1`,
    /// returning their (app, scope).
    const EXPIRE_SOURCES: &'static str;
    /// Item 5: `sources_in_window -= $1`, never below zero, for (`$2` app, `$3` scope).
    const FORGET_SOURCES: &'static str;
    /// docs/conformance.md#cost-limits: delete up to `$2` scope, then app, spend buckets older than `$1`.
    const PRUNE_SPEND: [&'static str; 2];
    /// Item 6: deletes up to `$2` released terminal application tasks, released and
    /// completed at or before `$1`.
    const RETAIN_TASKS: &'static str;

    /// docs/engine.md, "Dead rows": after each sweep, the backend keeps its hot
    /// tables lean (PostgreSQL: vacuums a hot table whose dead rows passed a bound, in the
    /// background; SQLite reuses freed pages itself: nothing to do).
    fn keep_lean(&self) {}

    /// Items 1–3 for one state: queued past the queue timeout, or running past the
    /// liveness timeout; canceled instead when cancellation was requested.
    async fn expire(
        &self,
        config: &SweepConfig,
        batch: i64,
        queued: bool,
        report: &mut SweepReport,
    ) -> StoreResult<()>;

    /// Where kept settings are written and read back.
    fn settings(&self) -> Self::Reader;
}

/// The message of an expired task.
pub(crate) fn expiry_message(config: &SweepConfig, queued: bool) -> String {
    if queued {
        format!(
            "queued longer than the queue timeout ({} s)",
            config.queue_timeout.as_secs()
        )
    } else {
        format!(
            "no heartbeat for the liveness timeout ({} s)",
            config.liveness_timeout.as_secs()
        )
    }
}

/// [`MaintenanceStore`](crate::MaintenanceStore)'s methods.
pub(crate) struct Maintenance;

impl Maintenance {
    pub(crate) async fn ping<B: MaintenanceStatements>(store: &B) -> StoreResult<()> {
        store.reader().run(Statement::new("SELECT 1")).await?;
        Ok(())
    }

    pub(crate) async fn sweep<B: MaintenanceStatements>(
        store: &B,
        config: &SweepConfig,
    ) -> StoreResult<SweepReport> {
        let batch = i64::from(config.batch_size.max(1));
        let mut report = SweepReport::default();

        // Items 1–3.
        store.expire(config, batch, true, &mut report).await?;
        // Silent running tasks with tries left go back to the queue before the rest
        // expire (docs/routes.md, "Attempts").
        {
            let mut tx = store.begin_tx().await?;
            let now = store.now_in(&mut tx).await?;
            let cutoff = now.minus(config.liveness_timeout).0;
            let picked: Vec<RequeueRow> = tx
                .all(Statement::new(B::REQUEUE_PICK).bind(cutoff).bind(batch))
                .await?;
            if picked.is_empty() {
                tx.rollback_tx().await?;
            } else {
                report.more |= picked.len() as i64 == batch;
                let message = expiry_message(config, false);
                let requeued = requeue(&mut tx, &picked, &message, now).await?;
                tx.commit_tx().await?;
                report.requeued.extend(requeued);
            }
        }
        store.expire(config, batch, false, &mut report).await?;

        // Item 4: repair lost wakes — a run still waiting on a task that is already
        // terminal (or gone) is woken again.
        {
            let mut tx = store.begin_tx().await?;
            let now = store.now_in(&mut tx).await?;
            let stuck: Vec<(String,)> = tx.all(Statement::new(B::STUCK_WAITS).bind(batch)).await?;
            if stuck.is_empty() {
                tx.rollback_tx().await?;
            } else {
                report.more |= stuck.len() as i64 == batch;
                let stuck: Vec<String> = stuck.into_iter().map(|(id,)| id).collect();
                let woken = tx.wake_runs(&stuck, now, false).await?;
                tx.commit_tx().await?;
                report.runs_repaired += woken.len() as u64;
                report.woken_runs.extend(woken);
            }
        }

        // Item 5: prune admission records older than 24 h, and expired source sightings
        // with their scopes' counts (each deleted row is subtracted once, by its deleter).
        {
            let mut tx = store.begin_tx().await?;
            let now = store.now_in(&mut tx).await?;
            let cutoff = now.minus(ADMISSION_WINDOW).0;
            let pruned = tx
                .run(Statement::new(B::PRUNE_ADMISSIONS).bind(cutoff).bind(batch))
                .await?;
            report.admissions_pruned += pruned;
            report.more |= pruned as i64 == batch;
            let expired: Vec<ScopeRow> = tx
                .all(Statement::new(B::EXPIRE_SOURCES).bind(cutoff).bind(batch))
                .await?;
            report.more |= expired.len() as i64 == batch;
            let per_scope = count_per_scope(expired.into_iter().map(|r| (r.app, r.scope)));
            // Sorted: the lock order for scope rows.
            for ((app, scope), n) in per_scope {
                tx.run(
                    Statement::new(B::FORGET_SOURCES)
                        .bind(n)
                        .bind(app)
                        .bind(scope),
                )
                .await?;
            }
            // docs/conformance.md#cost-limits: spend buckets older than any window reads (the window's first
            // bucket, minus one spare hour).
            let stale = tollgate_core::cost::window_first_bucket(now) - 1;
            for sql in B::PRUNE_SPEND {
                let n = tx.run(Statement::new(sql).bind(stale).bind(batch)).await?;
                report.more |= n as i64 == batch;
            }
            tx.commit_tx().await?;
        }

        // Item 6: retention of released, terminal application tasks.
        {
            let mut tx = store.begin_tx().await?;
            let now = store.now_in(&mut tx).await?;
            let cutoff = now.minus(config.retention).0;
            let deleted = tx
                .run(Statement::new(B::RETAIN_TASKS).bind(cutoff).bind(batch))
                .await?;
            tx.commit_tx().await?;
            report.tasks_deleted += deleted;
            report.more |= deleted as i64 == batch;
        }

        // Item 7: retention of webhook events whose deliveries all ended (docs/webhooks.md,
        // "Retention and deletion").
        {
            let mut tx = store.begin_tx().await?;
            let now = store.now_in(&mut tx).await?;
            let cutoff = now.minus(config.retention).0;
            let deleted = crate::shared::webhooks::retain_events(&mut tx, cutoff, batch).await?;
            tx.commit_tx().await?;
            report.webhook_events_deleted += deleted;
            report.more |= deleted as i64 == batch;
        }
        // Item 6c: the stream log of tasks that ended a while ago (docs/api.md,
        // "Streaming a task").
        {
            let mut tx = store.begin_tx().await?;
            let now = store.now_in(&mut tx).await?;
            let cutoff = now.minus(crate::STREAM_LOG_GRACE).0;
            let deleted = crate::shared::stream_log::sweep_ended(&mut tx, cutoff, batch).await?;
            tx.commit_tx().await?;
            report.stream_chunks_deleted += deleted;
        }
        store.keep_lean();
        Ok(report)
    }

    pub(crate) async fn first_queued<B: MaintenanceStatements>(
        store: &B,
    ) -> StoreResult<Option<TaskId>> {
        let id: Option<(String,)> = store
            .reader()
            .optional(Statement::new(
                "SELECT id FROM tasks WHERE status = 'queued' ORDER BY created_at, id LIMIT 1",
            ))
            .await?;
        id.map(|(id,)| task_id(&id)).transpose()
    }

    /// Two statements: the second sees a value another replica committed meanwhile.
    pub(crate) async fn keep_setting<B: MaintenanceStatements>(
        store: &B,
        name: &str,
        value: &str,
    ) -> StoreResult<String> {
        let mut pool = store.settings();
        pool.run(
            Statement::new(
                "INSERT INTO service_settings (name, value) VALUES ($1, $2) \
                 ON CONFLICT (name) DO NOTHING",
            )
            .bind(name)
            .bind(value),
        )
        .await?;
        let (kept,): (String,) = pool
            .one(Statement::new("SELECT value FROM service_settings WHERE name = $1").bind(name))
            .await?;
        Ok(kept)
    }
}

/// [`MaintenanceStore`](crate::MaintenanceStore) for a backend that implements
/// [`MaintenanceStatements`] (written once; the store's wrappers forward the trait by a
/// blanket impl, so each backend states its own).
macro_rules! maintenance_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::MaintenanceStore for $store {
            fn backend(&self) -> &'static str {
                <$store as $crate::shared::maintenance::MaintenanceStatements>::NAME
            }

            async fn ping(&self) -> $crate::StoreResult<()> {
                $crate::shared::maintenance::Maintenance::ping(self).await
            }

            async fn sweep(
                &self,
                config: &$crate::SweepConfig,
            ) -> $crate::StoreResult<$crate::SweepReport> {
                $crate::shared::maintenance::Maintenance::sweep(self, config).await
            }

            async fn first_queued(&self) -> $crate::StoreResult<Option<tollgate_core::TaskId>> {
                $crate::shared::maintenance::Maintenance::first_queued(self).await
            }

            async fn keep_setting(&self, name: &str, value: &str) -> $crate::StoreResult<String> {
                $crate::shared::maintenance::Maintenance::keep_setting(self, name, value).await
            }
        }
    };
}
pub(crate) use maintenance_store_for;
