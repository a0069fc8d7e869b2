//! The `steady-state` scenario's set-up and readings of Tollgate's own tables: autovacuum
//! turned off for the benchmark database's tables (PostgreSQL), and how lean the tables
//! are — dead row versions and vacuums per table (PostgreSQL), the file, its free pages and
//! the WAL (SQLite).

use super::Baseline;
use serde_json::{Value, json};
use tollgate_store::StoreResult;

/// The tables every task's life updates (the store's hot tables, docs/engine.md, "Dead
/// rows"), read for their dead rows.
const HOT_TABLES: [&str; 11] = [
    "tasks",
    "task_attempts",
    "dispatch_queues",
    "scope_state",
    "scope_sources",
    "admissions",
    "global_slots",
    "global_finished",
    "app_slots",
    "scope_spend",
    "app_spend",
];

/// How lean the database is at one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TableHealth {
    /// Dead row versions summed over the hot tables (PostgreSQL; 0 on SQLite).
    pub dead_rows: i64,
    /// Vacuums of the hot tables so far, by the store and by autovacuum (PostgreSQL).
    pub vacuums: i64,
    /// Of those, autovacuum's (0 while it is off for these tables).
    pub autovacuums: i64,
    /// The database's size in bytes (PostgreSQL: `pg_database_size`; SQLite: pages ×
    /// page size, the WAL apart).
    pub bytes: i64,
    /// SQLite: free pages in the file (reused before it grows).
    pub free_pages: i64,
    /// Per table (PostgreSQL: live, dead rows and vacuums), as JSON for the report.
    pub tables: Value,
}

impl Baseline {
    /// PostgreSQL: `autovacuum_enabled = false` on every table of the benchmark
    /// database's schema (the server-wide `autovacuum` cannot be changed per database:
    /// `ALTER DATABASE … SET autovacuum` is refused, it is a server setting). Returns how
    /// many tables it was turned off on. SQLite has no autovacuum of this kind: 0.
    pub async fn autovacuum_off(&self) -> StoreResult<u64> {
        let Baseline::Postgres(p) = self else {
            return Ok(0);
        };
        let tables: Vec<String> = sqlx::query_scalar(
            "SELECT c.relname::TEXT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = current_schema() AND c.relkind = 'r' ORDER BY 1",
        )
        .fetch_all(p)
        .await?;
        for table in &tables {
            let quoted = table.replace('"', "\"\"");
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "ALTER TABLE \"{quoted}\" SET (autovacuum_enabled = false)"
            )))
            .execute(p)
            .await?;
        }
        Ok(tables.len() as u64)
    }

    /// The database's leanness now (see [`TableHealth`]).
    pub async fn table_health(&self) -> StoreResult<TableHealth> {
        match self {
            Baseline::Postgres(p) => {
                // Statistics reach the views when a backend reports them (within a
                // second of its last transaction).
                let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
                    "SELECT relname::TEXT, n_live_tup, n_dead_tup, vacuum_count, \
                     autovacuum_count FROM pg_stat_user_tables \
                     WHERE schemaname = current_schema() AND relname = ANY($1) ORDER BY 1",
                )
                .bind(HOT_TABLES.as_slice())
                .fetch_all(p)
                .await?;
                let bytes: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
                    .fetch_one(p)
                    .await?;
                let mut health = TableHealth {
                    bytes,
                    ..TableHealth::default()
                };
                let mut tables = serde_json::Map::new();
                for (name, live, dead, vacuums, autovacuums) in rows {
                    health.dead_rows += dead;
                    health.vacuums += vacuums + autovacuums;
                    health.autovacuums += autovacuums;
                    tables.insert(
                        name,
                        json!({"live": live, "dead": dead, "vacuums": vacuums + autovacuums}),
                    );
                }
                health.tables = Value::Object(tables);
                Ok(health)
            }
            Baseline::Sqlite(p) => {
                let pages: i64 = sqlx::query_scalar("PRAGMA page_count").fetch_one(p).await?;
                let size: i64 = sqlx::query_scalar("PRAGMA page_size").fetch_one(p).await?;
                let free: i64 = sqlx::query_scalar("PRAGMA freelist_count")
                    .fetch_one(p)
                    .await?;
                Ok(TableHealth {
                    bytes: pages * size,
                    free_pages: free,
                    ..TableHealth::default()
                })
            }
        }
    }
}
