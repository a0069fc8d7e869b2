//! Planner statistics kept in step with a fast-growing table, and dead rows of the hot
//! tables kept bounded.
//!
//! PostgreSQL plans a prepared statement once per connection (a generic plan, after five
//! executions) and keeps that plan until the statistics of its tables change. A plan
//! made while `tasks` held a few rows stays when it holds thousands: lookups by effect
//! key walk an `(app, …)` listing index and lookups by id scan the whole table (seen in
//! `tollgate bench admission` and `fairness` on fresh databases: 2–9 ms per lookup
//! instead of 0.02 ms, growing with the table). Autovacuum analyzes only after its
//! naptime (a minute by default), which is long for a new deployment's first burst.
//!
//! So the store analyzes `tasks` and `admissions` itself when one has changed by more
//! rows than it held at its last analysis (and by at least [`MIN_CHANGED`]): at about
//! 1k, 2k, 4k, … rows while a table grows fast, and never in a steady state, where
//! autovacuum's 10 % rule comes first. The check is one read of the statistics views per
//! [`CHECK_EVERY`] creations of this store instance, in the background; an analysis
//! invalidates every connection's cached plans of that table, so they are made again
//! with the new figures.
//!
//! Dead rows (docs/engine.md, "Dead rows"): every task updates its `tasks` row two or
//! three times and a handful of one-row-per-key tables (its queue, its scope's counters,
//! the slot stripes, the spend buckets) once or twice, each update leaving a dead row
//! version behind. Without autovacuum (or with its defaults, 20 % of the table, on a
//! table of a few hot rows) they pile up: on a server with autovacuum off the burn-down
//! rate halved after ~50,000 tasks (`tasks` 53,661 dead rows, `dispatch_queues` 3,934,
//! issue 32), and a `VACUUM ANALYZE` restored it. So after every sweep the store reads
//! the dead-row counts of [`HOT_TABLES`] and vacuums (and analyzes) each whose dead rows
//! are at least [`MIN_DEAD`] and more than a tenth of its live rows, one table at a time,
//! in the background, `SKIP_LOCKED` (a table another replica or autovacuum is vacuuming
//! is skipped). Migration 0025 also tightens autovacuum's own thresholds on these
//! tables for servers where it is on.

use super::PostgresStore;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Creations of one store instance between two checks.
const CHECK_EVERY: u64 = 500;
/// Fewest changed rows that make a table worth analyzing.
const MIN_CHANGED: i64 = 1_000;

/// Fewest dead rows that make a hot table worth vacuuming.
const MIN_DEAD: i64 = 1_000;

/// The tables every task's life updates or deletes rows of (see the module docs), each
/// with its vacuum statement.
const HOT_TABLES: [(&str, &str); 11] = [
    ("tasks", "VACUUM (SKIP_LOCKED, ANALYZE) tasks"),
    (
        "task_attempts",
        "VACUUM (SKIP_LOCKED, ANALYZE) task_attempts",
    ),
    (
        "dispatch_queues",
        "VACUUM (SKIP_LOCKED, ANALYZE) dispatch_queues",
    ),
    ("scope_state", "VACUUM (SKIP_LOCKED, ANALYZE) scope_state"),
    (
        "scope_sources",
        "VACUUM (SKIP_LOCKED, ANALYZE) scope_sources",
    ),
    ("admissions", "VACUUM (SKIP_LOCKED, ANALYZE) admissions"),
    ("global_slots", "VACUUM (SKIP_LOCKED, ANALYZE) global_slots"),
    (
        "global_finished",
        "VACUUM (SKIP_LOCKED, ANALYZE) global_finished",
    ),
    ("app_slots", "VACUUM (SKIP_LOCKED, ANALYZE) app_slots"),
    ("scope_spend", "VACUUM (SKIP_LOCKED, ANALYZE) scope_spend"),
    ("app_spend", "VACUUM (SKIP_LOCKED, ANALYZE) app_spend"),
];

/// Counts this instance's creations towards the next check (see the module docs).
#[derive(Debug, Default)]
pub(super) struct StatsWatch {
    created: AtomicU64,
    checking: AtomicBool,
    vacuuming: AtomicBool,
}

impl PostgresStore {
    /// `n` task rows were created: checks (in the background) whether the planner's
    /// statistics of the growing tables are out of date, every [`CHECK_EVERY`] rows.
    pub(super) fn rows_created(&self, n: u64) {
        let before = self.stats.created.fetch_add(n, Ordering::Relaxed);
        if before / CHECK_EVERY == (before + n) / CHECK_EVERY {
            return;
        }
        if self.stats.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            if let Err(e) = analyze_grown_tables(&store).await {
                tracing::debug!(error = %e, "refreshing planner statistics failed");
            }
            store.stats.checking.store(false, Ordering::Release);
        });
    }
}

impl PostgresStore {
    /// Vacuums, in the background, the hot tables whose dead rows passed the bound (see
    /// the module docs); at most one such pass of this instance at a time.
    pub(super) fn vacuum_dead_rows(&self) {
        if self.stats.vacuuming.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.clone();
        tokio::spawn(async move {
            if let Err(e) = vacuum_bloated_tables(&store).await {
                tracing::debug!(error = %e, "vacuuming the hot tables failed");
            }
            store.stats.vacuuming.store(false, Ordering::Release);
        });
    }
}

/// `VACUUM (SKIP_LOCKED, ANALYZE)` of each hot table with at least [`MIN_DEAD`] dead rows,
/// more than a tenth of its live ones.
async fn vacuum_bloated_tables(store: &PostgresStore) -> crate::StoreResult<()> {
    let bloated: Vec<String> = sqlx::query_scalar(
        "SELECT relname::TEXT FROM pg_stat_user_tables \
         WHERE schemaname = current_schema() AND relname = ANY($1) \
         AND n_dead_tup >= $2 AND n_dead_tup * 10 > n_live_tup ORDER BY n_dead_tup DESC",
    )
    .bind(HOT_TABLES.map(|(name, _)| name).as_slice())
    .bind(MIN_DEAD)
    .fetch_all(&store.pool)
    .await?;
    for table in bloated {
        let Some((_, vacuum)) = HOT_TABLES.iter().find(|(name, _)| *name == table) else {
            continue;
        };
        // VACUUM runs outside a transaction block: the simple protocol, one statement.
        sqlx::raw_sql(*vacuum).execute(&store.pool).await?;
        tracing::debug!(table, "vacuumed a hot table's dead rows");
    }
    Ok(())
}

/// Analyzes `tasks` and `admissions` where they changed by more than they held.
async fn analyze_grown_tables(store: &PostgresStore) -> crate::StoreResult<()> {
    let grown: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::TEXT FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid \
         WHERE c.oid IN (to_regclass('tasks'), to_regclass('admissions')) \
         AND s.n_mod_since_analyze >= $1 AND s.n_mod_since_analyze > GREATEST(c.reltuples, 0)",
    )
    .bind(MIN_CHANGED)
    .fetch_all(&store.pool)
    .await?;
    for table in grown {
        let sql = match table.as_str() {
            "tasks" => "ANALYZE tasks",
            "admissions" => "ANALYZE admissions",
            _ => continue,
        };
        sqlx::query(sql).execute(&store.pool).await?;
        tracing::debug!(table, "analyzed a fast-growing table");
    }
    Ok(())
}
