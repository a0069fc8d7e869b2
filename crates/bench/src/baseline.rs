//! Baselines for `tollgate bench`: the designs Tollgate is measured against, run in the
//! same database as Tollgate itself so a ratio holds on a noisy machine. Tollgate's own
//! SQL lives only in `tollgate-store`; this SQL is the one exception, kept beside the
//! benchmark so no build of the store carries it. The scenarios only time these calls.
//!
//! - [`Baseline::reference_admit`]: the reference design's admission, faithfully — its
//!   statements one round trip each (prune the scope's old admission records, count
//!   steps and sources over the scope's window, count active tasks, ensure the bucket
//!   row, read it `FOR UPDATE`, update it, insert the task, insert the admission record),
//!   with its indexes, all behind ONE database-wide lock (a PostgreSQL advisory lock; on
//!   SQLite `BEGIN IMMEDIATE` is already one lock for everything).
//! - [`Baseline::raw_insert`], [`Baseline::raw_claim`], [`Baseline::raw_complete`]: the
//!   raw SQL lifecycle, one transaction each, on a table of the same shape as `tasks`.
//! - [`Baseline::raw_cache_hit`]: an indexed lookup plus the insert of the copy.
//!
//! Tables are prefixed `baseline_` and created by [`Baseline::prepare`].
//!
//! Benchmark set-up that must touch Tollgate's own tables lives here too:
//! [`Baseline::seed_admission_window`] bulk-loads a scope's 24 h window of admission
//! records (and the per-scope facts Tollgate keeps beside them) in a few statements, and
//! [`create_postgres_database`] / [`drop_postgres_database`] give a benchmark its own
//! fresh database, and [`Baseline::autovacuum_off`] / [`Baseline::table_health`] turn
//! autovacuum off on its tables and read how lean they are (`steady-state`).

use sqlx::{PgPool, SqlitePool};
use tollgate_core::{TaskId, Timestamp};
use tollgate_store::postgres::PostgresStore;
use tollgate_store::sqlite::SqliteStore;
use tollgate_store::{StoreError, StoreResult};

mod health;
mod reference;
mod seed;

pub use health::TableHealth;
pub use seed::WindowSeed;

/// A database name a benchmark may create and drop: ASCII letters, digits and `_`.
fn checked_name(name: &str) -> StoreResult<&str> {
    if name.is_empty()
        || name.len() > 63
        || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(StoreError::Database(format!(
            "database name {name:?} must be 1 to 63 ASCII letters, digits and _"
        )));
    }
    Ok(name)
}

/// Creates a fresh, empty database `name` on the server `url` points at (a benchmark's
/// own database, dropped with [`drop_postgres_database`] at its end).
pub async fn create_postgres_database(url: &str, name: &str) -> StoreResult<()> {
    let name = checked_name(name)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    let created = sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&pool)
        .await;
    pool.close().await;
    created?;
    Ok(())
}

/// Drops database `name` on the server `url` points at, closing any session still in it.
pub async fn drop_postgres_database(url: &str, name: &str) -> StoreResult<()> {
    let name = checked_name(name)?;
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await?;
    let dropped = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
    )))
    .execute(&pool)
    .await;
    pool.close().await;
    dropped?;
    Ok(())
}

/// A baseline on one database.
#[derive(Debug, Clone)]
pub enum Baseline {
    /// On a PostgreSQL store's database (same schema).
    Postgres(PgPool),
    /// On a SQLite store's file.
    Sqlite(SqlitePool),
}

/// One reference-design admission's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReferenceOutcome {
    /// Admitted and inserted.
    Admitted,
    /// Refused by a limit.
    Refused,
}

impl Baseline {
    /// The baseline on a PostgreSQL store's database.
    pub fn postgres(store: &PostgresStore) -> Baseline {
        Baseline::Postgres(store.pool().clone())
    }

    /// The baseline on a SQLite store's file (through its writer connection).
    pub fn sqlite(store: &SqliteStore) -> Baseline {
        Baseline::Sqlite(store.writer_pool().clone())
    }

    /// Creates the baseline tables and the reference design's indexes.
    pub async fn prepare(&self) -> StoreResult<()> {
        let statements = [
            "CREATE TABLE IF NOT EXISTS baseline_tasks (id TEXT PRIMARY KEY, app TEXT NOT NULL, \
             scope TEXT NOT NULL, effect_key TEXT NOT NULL, step TEXT NOT NULL, \
             source_id TEXT, request TEXT NOT NULL, cache_key TEXT, status TEXT NOT NULL, \
             output TEXT, worker TEXT, created_at BIGINT NOT NULL, heartbeat_at BIGINT, \
             completed_at BIGINT, UNIQUE (app, effect_key))",
            "CREATE INDEX IF NOT EXISTS baseline_tasks_queued ON baseline_tasks (created_at) \
             WHERE status = 'queued'",
            "CREATE INDEX IF NOT EXISTS baseline_tasks_active ON baseline_tasks (app, scope, status)",
            "CREATE INDEX IF NOT EXISTS baseline_tasks_cache ON baseline_tasks \
             (app, scope, cache_key, completed_at)",
            "CREATE TABLE IF NOT EXISTS baseline_admissions (app TEXT NOT NULL, \
             scope TEXT NOT NULL, source_id TEXT NOT NULL, task_id TEXT NOT NULL, \
             logical_key TEXT, admitted_at BIGINT NOT NULL)",
            "CREATE INDEX IF NOT EXISTS baseline_admissions_scope ON baseline_admissions \
             (app, scope, admitted_at)",
            "CREATE TABLE IF NOT EXISTS baseline_buckets (app TEXT NOT NULL, scope TEXT NOT NULL, \
             tokens DOUBLE PRECISION NOT NULL, updated_at BIGINT NOT NULL, \
             PRIMARY KEY (app, scope))",
        ];
        for sql in statements {
            match self {
                Baseline::Postgres(p) => {
                    sqlx::query(sql).execute(p).await?;
                }
                Baseline::Sqlite(p) => {
                    sqlx::query(sql).execute(p).await?;
                }
            }
        }
        Ok(())
    }

    /// Raw lifecycle step 1: insert a queued task (one transaction).
    pub async fn raw_insert(
        &self,
        app: &str,
        effect_key: &str,
        request: &str,
        now: Timestamp,
    ) -> StoreResult<String> {
        let id = TaskId::generate().to_string();
        let sql_pg = "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, request, \
                      status, created_at) VALUES ($1, $2, 's', $3, 'step', $4, 'queued', $5)";
        let sql_lite = "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, request, \
                        status, created_at) VALUES (?, ?, 's', ?, 'step', ?, 'queued', ?)";
        match self {
            Baseline::Postgres(p) => {
                sqlx::query(sql_pg)
                    .bind(&id)
                    .bind(app)
                    .bind(effect_key)
                    .bind(request)
                    .bind(now.0)
                    .execute(p)
                    .await?;
            }
            Baseline::Sqlite(p) => {
                sqlx::query(sql_lite)
                    .bind(&id)
                    .bind(app)
                    .bind(effect_key)
                    .bind(request)
                    .bind(now.0)
                    .execute(p)
                    .await?;
            }
        }
        Ok(id)
    }

    /// Raw lifecycle step 2: claim the oldest queued task (`SKIP LOCKED` on PostgreSQL).
    pub async fn raw_claim(&self, worker: &str, now: Timestamp) -> StoreResult<Option<String>> {
        Ok(match self {
            Baseline::Postgres(p) => {
                sqlx::query_scalar(
                    "WITH picked AS MATERIALIZED (SELECT id FROM baseline_tasks \
                     WHERE status = 'queued' ORDER BY created_at LIMIT 1 FOR UPDATE SKIP LOCKED) \
                     UPDATE baseline_tasks t SET status = 'running', worker = $1, heartbeat_at = $2 \
                     FROM picked WHERE t.id = picked.id RETURNING t.id",
                )
                .bind(worker)
                .bind(now.0)
                .fetch_optional(p)
                .await?
            }
            Baseline::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                let id: Option<String> = sqlx::query_scalar(
                    "UPDATE baseline_tasks SET status = 'running', worker = ?, heartbeat_at = ? \
                     WHERE id = (SELECT id FROM baseline_tasks WHERE status = 'queued' \
                     ORDER BY created_at LIMIT 1) RETURNING id",
                )
                .bind(worker)
                .bind(now.0)
                .fetch_optional(&mut *tx)
                .await?;
                tx.commit().await?;
                id
            }
        })
    }

    /// Raw lifecycle step 3: complete a running task (one transaction).
    pub async fn raw_complete(&self, id: &str, output: &str, now: Timestamp) -> StoreResult<()> {
        let done = match self {
            Baseline::Postgres(p) => sqlx::query(
                "UPDATE baseline_tasks SET status = 'succeeded', output = $2, completed_at = $3 \
                 WHERE id = $1 AND status = 'running'",
            )
            .bind(id)
            .bind(output)
            .bind(now.0)
            .execute(p)
            .await?
            .rows_affected(),
            Baseline::Sqlite(p) => sqlx::query(
                "UPDATE baseline_tasks SET status = 'succeeded', output = ?2, completed_at = ?3 \
                 WHERE id = ?1 AND status = 'running'",
            )
            .bind(id)
            .bind(output)
            .bind(now.0)
            .execute(p)
            .await?
            .rows_affected(),
        };
        if done == 1 {
            Ok(())
        } else {
            Err(StoreError::InvalidState(format!(
                "baseline task {id} was not running"
            )))
        }
    }

    /// Seeds one succeeded task under a cache key, for [`Baseline::raw_cache_hit`].
    pub async fn seed_cached(
        &self,
        app: &str,
        scope: &str,
        cache_key: &str,
        now: Timestamp,
    ) -> StoreResult<()> {
        let id = TaskId::generate().to_string();
        match self {
            Baseline::Postgres(p) => {
                sqlx::query(
                    "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, request, \
                     cache_key, status, output, created_at, completed_at) \
                     VALUES ($1, $2, $3, $1, 'step', '{}', $4, 'succeeded', '{\"label\":\"spam\"}', $5, $5)",
                )
                .bind(&id)
                .bind(app)
                .bind(scope)
                .bind(cache_key)
                .bind(now.0)
                .execute(p)
                .await?;
            }
            Baseline::Sqlite(p) => {
                sqlx::query(
                    "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, request, \
                     cache_key, status, output, created_at, completed_at) \
                     VALUES (?1, ?2, ?3, ?1, 'step', '{}', ?4, 'succeeded', '{\"label\":\"spam\"}', ?5, ?5)",
                )
                .bind(&id)
                .bind(app)
                .bind(scope)
                .bind(cache_key)
                .bind(now.0)
                .execute(p)
                .await?;
            }
        }
        Ok(())
    }

    /// A cache hit done by hand: indexed lookup of the newest success, then the insert of
    /// the copy, in one transaction. Returns whether the lookup hit.
    pub async fn raw_cache_hit(
        &self,
        app: &str,
        scope: &str,
        cache_key: &str,
        effect_key: &str,
        now: Timestamp,
    ) -> StoreResult<bool> {
        let id = TaskId::generate().to_string();
        match self {
            Baseline::Postgres(p) => {
                let mut tx = p.begin().await?;
                let hit: Option<String> = sqlx::query_scalar(
                    "SELECT output FROM baseline_tasks WHERE app = $1 AND scope = $2 \
                     AND cache_key = $3 AND status = 'succeeded' \
                     ORDER BY completed_at DESC LIMIT 1",
                )
                .bind(app)
                .bind(scope)
                .bind(cache_key)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(output) = hit else {
                    return Ok(false);
                };
                sqlx::query(
                    "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, request, \
                     cache_key, status, output, created_at, completed_at) \
                     VALUES ($1, $2, $3, $4, 'step', '{}', $5, 'succeeded', $6, $7, $7)",
                )
                .bind(&id)
                .bind(app)
                .bind(scope)
                .bind(effect_key)
                .bind(cache_key)
                .bind(output)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
            Baseline::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                let hit: Option<String> = sqlx::query_scalar(
                    "SELECT output FROM baseline_tasks WHERE app = ? AND scope = ? \
                     AND cache_key = ? AND status = 'succeeded' \
                     ORDER BY completed_at DESC LIMIT 1",
                )
                .bind(app)
                .bind(scope)
                .bind(cache_key)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(output) = hit else {
                    return Ok(false);
                };
                sqlx::query(
                    "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, request, \
                     cache_key, status, output, created_at, completed_at) \
                     VALUES (?1, ?2, ?3, ?4, 'step', '{}', ?5, 'succeeded', ?6, ?7, ?7)",
                )
                .bind(&id)
                .bind(app)
                .bind(scope)
                .bind(effect_key)
                .bind(cache_key)
                .bind(output)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
            }
        }
        Ok(true)
    }
}
