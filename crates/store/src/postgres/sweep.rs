//! SPEC §6 on PostgreSQL: every replica sweeps; each item is one bounded batch in its own
//! short transaction that skips rows other replicas hold (`FOR UPDATE SKIP LOCKED`), so
//! replicas never wait on each other and never process a row twice.

use super::lifecycle::{cancel_wanted, release_capacity, wake_runs_waiting_on};
use super::{PostgresStore, Tx};
use crate::rows::{FinishedRow, task_id};
use crate::{StoreResult, SweepConfig, SweepReport};
use std::collections::BTreeMap;
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{ErrorCode, Timestamp};

#[derive(sqlx::FromRow)]
struct Expired {
    id: String,
    app: String,
    scope: String,
    admitted: bool,
    status: String,
}

pub(super) async fn sweep(store: &PostgresStore, config: &SweepConfig) -> StoreResult<SweepReport> {
    let batch = i64::from(config.batch_size.max(1));
    let mut report = SweepReport::default();

    // Items 1–3.
    expire(store, config, batch, true, &mut report).await?;
    expire(store, config, batch, false, &mut report).await?;

    // Item 4: repair lost wakes.
    {
        let mut tx = store.begin().await?;
        let now = store.now(&mut tx).await?;
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
        let mut tx = store.begin().await?;
        let now = store.now(&mut tx).await?;
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
        let expired: Vec<(String, String)> = sqlx::query_as(
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
        let mut per_scope: BTreeMap<(String, String), i64> = BTreeMap::new();
        for key in expired {
            *per_scope.entry(key).or_default() += 1;
        }
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
        tx.commit().await?;
    }

    // Item 6: retention of released, terminal application tasks.
    {
        let mut tx = store.begin().await?;
        let now: Timestamp = store.now(&mut tx).await?;
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
        "SELECT id FROM tasks WHERE status = 'running' AND heartbeat_at <= $1 \
         ORDER BY heartbeat_at LIMIT $2 FOR UPDATE SKIP LOCKED"
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
    let rows: Vec<Expired> = sqlx::query_as(concat!(
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
         RETURNING id, app, scope, admitted, status"
    ))
    .bind(ErrorCode::Canceled.as_str())
    .bind(code.as_str())
    .bind(message)
    .bind(now.0)
    .bind(&ids)
    .fetch_all(&mut *tx)
    .await?;
    let finished: Vec<FinishedRow> = rows
        .iter()
        .map(|r| FinishedRow {
            id: r.id.clone(),
            app: r.app.clone(),
            scope: r.scope.clone(),
            admitted: r.admitted,
        })
        .collect();
    let all_ids: Vec<String> = finished.iter().map(|f| f.id.clone()).collect();
    release_capacity(&mut tx, &finished).await?;
    sqlx::query(
        "UPDATE admissions SET logical_key = NULL \
         WHERE task_id = ANY($1) AND logical_key IS NOT NULL",
    )
    .bind(&all_ids)
    .execute(&mut *tx)
    .await?;
    // Tasks were locked before runs here, so waking skips runs locked elsewhere.
    let woken = wake_runs_waiting_on(&mut tx, &all_ids, now, true).await?;
    tx.commit().await?;
    for r in &rows {
        if r.status == "canceled" {
            report.canceled += 1;
        } else if queued {
            report.queue_timed_out += 1;
        } else {
            report.interrupted += 1;
        }
        report.finished.push(task_id(&r.id)?);
    }
    report.woken_runs.extend(woken);
    Ok(())
}
