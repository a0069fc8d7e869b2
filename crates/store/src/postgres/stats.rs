//! Planner statistics kept in step with a fast-growing table.
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

use super::PostgresStore;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Creations of one store instance between two checks.
const CHECK_EVERY: u64 = 500;
/// Fewest changed rows that make a table worth analyzing.
const MIN_CHANGED: i64 = 1_000;

/// Counts this instance's creations towards the next check (see the module docs).
#[derive(Debug, Default)]
pub(super) struct StatsWatch {
    created: AtomicU64,
    checking: AtomicBool,
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
