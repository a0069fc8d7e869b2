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
//! fresh database.

use sqlx::{PgPool, SqlitePool};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{Budget, TaskId, Timestamp};
use tollgate_store::postgres::PostgresStore;
use tollgate_store::sqlite::SqliteStore;
use tollgate_store::{StoreError, StoreResult};

/// The one database-wide advisory lock of the reference design.
const REFERENCE_GLOBAL_LOCK: i64 = 7_233_001;

/// How far back seeded admission records reach: inside the 24 h window with an hour to
/// spare, so none expires (and is pruned) while a benchmark runs.
const SEED_WINDOW_SPAN_MS: i64 = 23 * 60 * 60 * 1000;

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

    /// The reference design's admission of one scoped task, then its insert.
    #[allow(clippy::too_many_arguments)]
    pub async fn reference_admit(
        &self,
        app: &str,
        scope: &str,
        source: &str,
        logical_key: &str,
        effect_key: &str,
        budget: &Budget,
        now: Timestamp,
    ) -> StoreResult<ReferenceOutcome> {
        match self {
            Baseline::Postgres(pool) => {
                let mut tx = pool.begin().await?;
                sqlx::query("SELECT pg_advisory_xact_lock($1)")
                    .bind(REFERENCE_GLOBAL_LOCK)
                    .execute(&mut *tx)
                    .await?;
                let cutoff = now.minus(ADMISSION_WINDOW).0;
                sqlx::query(
                    "DELETE FROM baseline_admissions WHERE app = $1 AND scope = $2 \
                     AND admitted_at <= $3",
                )
                .bind(app)
                .bind(scope)
                .bind(cutoff)
                .execute(&mut *tx)
                .await?;
                let (steps, sources, seen): (i64, i64, bool) = sqlx::query_as(
                    "SELECT COUNT(DISTINCT logical_key) FILTER (WHERE source_id = $3), \
                     COUNT(DISTINCT source_id), COALESCE(BOOL_OR(source_id = $3), FALSE) \
                     FROM baseline_admissions WHERE app = $1 AND scope = $2 AND admitted_at > $4",
                )
                .bind(app)
                .bind(scope)
                .bind(source)
                .bind(cutoff)
                .fetch_one(&mut *tx)
                .await?;
                let (scope_active, global_active): (i64, i64) = sqlx::query_as(
                    "SELECT COUNT(*) FILTER (WHERE app = $1 AND scope = $2), COUNT(*) \
                     FROM baseline_tasks WHERE status IN ('queued', 'running')",
                )
                .bind(app)
                .bind(scope)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO baseline_buckets (app, scope, tokens, updated_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                )
                .bind(app)
                .bind(scope)
                .bind(f64::from(budget.burst.get()))
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                let (tokens, updated): (f64, i64) = sqlx::query_as(
                    "SELECT tokens, updated_at FROM baseline_buckets \
                     WHERE app = $1 AND scope = $2 FOR UPDATE",
                )
                .bind(app)
                .bind(scope)
                .fetch_one(&mut *tx)
                .await?;
                let Some(tokens) = reference_decide(
                    budget,
                    steps,
                    sources,
                    seen,
                    scope_active,
                    global_active,
                    tokens,
                    updated,
                    now,
                ) else {
                    tx.rollback().await?;
                    return Ok(ReferenceOutcome::Refused);
                };
                sqlx::query(
                    "UPDATE baseline_buckets SET tokens = $3, updated_at = $4 \
                     WHERE app = $1 AND scope = $2",
                )
                .bind(app)
                .bind(scope)
                .bind(tokens)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                let id = TaskId::generate().to_string();
                sqlx::query(
                    "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, source_id, \
                     request, cache_key, status, created_at) \
                     VALUES ($1, $2, $3, $4, 'step', $5, '{}', $6, 'queued', $7)",
                )
                .bind(&id)
                .bind(app)
                .bind(scope)
                .bind(effect_key)
                .bind(source)
                .bind(logical_key)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO baseline_admissions (app, scope, source_id, task_id, \
                     logical_key, admitted_at) VALUES ($1, $2, $3, $4, $5, $6)",
                )
                .bind(app)
                .bind(scope)
                .bind(source)
                .bind(&id)
                .bind(logical_key)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(ReferenceOutcome::Admitted)
            }
            Baseline::Sqlite(pool) => {
                let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
                let cutoff = now.minus(ADMISSION_WINDOW).0;
                sqlx::query(
                    "DELETE FROM baseline_admissions WHERE app = ? AND scope = ? \
                     AND admitted_at <= ?",
                )
                .bind(app)
                .bind(scope)
                .bind(cutoff)
                .execute(&mut *tx)
                .await?;
                let (steps, sources, seen): (i64, i64, i64) = sqlx::query_as(
                    "SELECT COUNT(DISTINCT CASE WHEN source_id = ?3 THEN logical_key END), \
                     COUNT(DISTINCT source_id), COALESCE(MAX(source_id = ?3), 0) \
                     FROM baseline_admissions WHERE app = ?1 AND scope = ?2 AND admitted_at > ?4",
                )
                .bind(app)
                .bind(scope)
                .bind(source)
                .bind(cutoff)
                .fetch_one(&mut *tx)
                .await?;
                let (scope_active, global_active): (i64, i64) = sqlx::query_as(
                    "SELECT COALESCE(SUM(app = ?1 AND scope = ?2), 0), COUNT(*) \
                     FROM baseline_tasks WHERE status IN ('queued', 'running')",
                )
                .bind(app)
                .bind(scope)
                .fetch_one(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO baseline_buckets (app, scope, tokens, updated_at) \
                     VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                )
                .bind(app)
                .bind(scope)
                .bind(f64::from(budget.burst.get()))
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                let (tokens, updated): (f64, i64) = sqlx::query_as(
                    "SELECT tokens, updated_at FROM baseline_buckets WHERE app = ? AND scope = ?",
                )
                .bind(app)
                .bind(scope)
                .fetch_one(&mut *tx)
                .await?;
                let Some(tokens) = reference_decide(
                    budget,
                    steps,
                    sources,
                    seen != 0,
                    scope_active,
                    global_active,
                    tokens,
                    updated,
                    now,
                ) else {
                    tx.rollback().await?;
                    return Ok(ReferenceOutcome::Refused);
                };
                sqlx::query(
                    "UPDATE baseline_buckets SET tokens = ?, updated_at = ? \
                     WHERE app = ? AND scope = ?",
                )
                .bind(tokens)
                .bind(now.0)
                .bind(app)
                .bind(scope)
                .execute(&mut *tx)
                .await?;
                let id = TaskId::generate().to_string();
                sqlx::query(
                    "INSERT INTO baseline_tasks (id, app, scope, effect_key, step, source_id, \
                     request, cache_key, status, created_at) \
                     VALUES (?, ?, ?, ?, 'step', ?, '{}', ?, 'queued', ?)",
                )
                .bind(&id)
                .bind(app)
                .bind(scope)
                .bind(effect_key)
                .bind(source)
                .bind(logical_key)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO baseline_admissions (app, scope, source_id, task_id, \
                     logical_key, admitted_at) VALUES (?, ?, ?, ?, ?, ?)",
                )
                .bind(app)
                .bind(scope)
                .bind(source)
                .bind(&id)
                .bind(logical_key)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                Ok(ReferenceOutcome::Admitted)
            }
        }
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

/// The records [`Baseline::seed_admission_window`] loads into one scope's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowSeed {
    /// Number of the first record; records `first..first + count` are loaded. Record `i`
    /// belongs to source `src-{i / steps_per_source}`, so seeding a scope again from
    /// where the last call stopped grows the same sources.
    pub first: u64,
    /// How many records to load.
    pub count: u64,
    /// Records (distinct logical steps) per source.
    pub steps_per_source: u64,
}

impl Baseline {
    /// Bulk-loads admission records into one scope's 24 h window of **Tollgate's**
    /// tables, as if `seed.count` scoped tasks had been admitted over the last 23 hours
    /// and their owner's data deleted since (admission records outlive their tasks, SPEC
    /// §4). The records go in with ONE statement; then the facts Tollgate keeps beside
    /// them are brought up to date exactly as admissions would have left them: the
    /// scope's source sightings (`scope_sources`, latest admission per source) and its
    /// `scope_state` row (distinct sources in the window; a full token bucket when the
    /// scope is new). Afterwards PostgreSQL's tables are analyzed, as autovacuum would soon
    /// do, and SQLite's WAL is checkpointed. For benchmarks: run it while nothing else admits into the scope.
    pub async fn seed_admission_window(
        &self,
        app: &str,
        scope: &str,
        seed: WindowSeed,
        budget: &Budget,
        now: Timestamp,
    ) -> StoreResult<()> {
        if seed.count == 0 {
            return Ok(());
        }
        let first = i64::try_from(seed.first)
            .map_err(|_| StoreError::Database("seed.first is too large".into()))?;
        let count = i64::try_from(seed.count)
            .map_err(|_| StoreError::Database("seed.count is too large".into()))?;
        let steps = i64::try_from(seed.steps_per_source.max(1))
            .map_err(|_| StoreError::Database("seed.steps_per_source is too large".into()))?;
        let last = first + count - 1;
        // Record i (of this call) is admitted at start + (i - first) * span / count.
        let start = now.0 - SEED_WINDOW_SPAN_MS;
        let full_bucket = i64::from(budget.burst.get()) * tollgate_core::admission::TOKEN_UNITS;
        match self {
            Baseline::Postgres(p) => {
                let mut tx = p.begin().await?;
                sqlx::query(
                    "INSERT INTO admissions (app, scope, source_id, task_id, logical_key, \
                     admitted_at) \
                     SELECT $1, $2, 'src-' || (i / $5), 'seed-' || $2 || '-' || i, \
                     'seed-' || $2 || '-' || i, $6 + ((i - $3) * $7) / $8 \
                     FROM generate_series($3::BIGINT, $4::BIGINT) AS i",
                )
                .bind(app)
                .bind(scope)
                .bind(first)
                .bind(last)
                .bind(steps)
                .bind(start)
                .bind(SEED_WINDOW_SPAN_MS)
                .bind(count)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO scope_sources (app, scope, source_id, last_admitted_at) \
                     SELECT app, scope, source_id, MAX(admitted_at) FROM admissions \
                     WHERE app = $1 AND scope = $2 GROUP BY app, scope, source_id \
                     ON CONFLICT (app, scope, source_id) DO UPDATE SET last_admitted_at = \
                     GREATEST(scope_sources.last_admitted_at, EXCLUDED.last_admitted_at)",
                )
                .bind(app)
                .bind(scope)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO scope_state (app, scope, bucket_units, bucket_at, \
                     sources_in_window, active) \
                     VALUES ($1, $2, $3, $4, (SELECT COUNT(*) FROM scope_sources \
                     WHERE app = $1 AND scope = $2), 0) \
                     ON CONFLICT (app, scope) DO UPDATE \
                     SET sources_in_window = EXCLUDED.sources_in_window",
                )
                .bind(app)
                .bind(scope)
                .bind(full_bucket)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                // SPEC §13: every seeded record is also a reservation (1 µ$, 100 tokens)
                // in its hour's spend bucket, as admissions would have left them.
                for sql in [
                    "INSERT INTO scope_spend (app, scope, bucket, reserved_nano, reserved_tokens) \
                     SELECT $1, $2, admitted_at / 3600000, COUNT(*) * 1000, COUNT(*) * 100 \
                     FROM admissions WHERE app = $1 AND scope = $2 GROUP BY admitted_at / 3600000 \
                     ON CONFLICT (app, scope, bucket) DO UPDATE SET \
                     reserved_nano = EXCLUDED.reserved_nano, \
                     reserved_tokens = EXCLUDED.reserved_tokens",
                    "INSERT INTO app_spend (app, bucket, stripe, reserved_nano, reserved_tokens) \
                     SELECT $1, admitted_at / 3600000, $3, COUNT(*) * 1000, COUNT(*) * 100 \
                     FROM admissions WHERE app = $1 AND scope = $2 GROUP BY admitted_at / 3600000 \
                     ON CONFLICT (app, bucket, stripe) DO UPDATE SET \
                     reserved_nano = app_spend.reserved_nano + EXCLUDED.reserved_nano, \
                     reserved_tokens = app_spend.reserved_tokens + EXCLUDED.reserved_tokens",
                ] {
                    sqlx::query(sql)
                        .bind(app)
                        .bind(scope)
                        .bind(tollgate_core::cost::app_spend_stripe(scope) as i32)
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                sqlx::query("ANALYZE admissions").execute(p).await?;
                sqlx::query("ANALYZE scope_sources").execute(p).await?;
            }
            Baseline::Sqlite(p) => {
                let mut tx = p.begin_with("BEGIN IMMEDIATE").await?;
                sqlx::query(
                    "WITH RECURSIVE n(i) AS (SELECT ?3 UNION ALL SELECT i + 1 FROM n WHERE i < ?4) \
                     INSERT INTO admissions (app, scope, source_id, task_id, logical_key, \
                     admitted_at) \
                     SELECT ?1, ?2, 'src-' || (i / ?5), 'seed-' || ?2 || '-' || i, \
                     'seed-' || ?2 || '-' || i, ?6 + ((i - ?3) * ?7) / ?8 FROM n",
                )
                .bind(app)
                .bind(scope)
                .bind(first)
                .bind(last)
                .bind(steps)
                .bind(start)
                .bind(SEED_WINDOW_SPAN_MS)
                .bind(count)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO scope_sources (app, scope, source_id, last_admitted_at) \
                     SELECT app, scope, source_id, MAX(admitted_at) FROM admissions \
                     WHERE app = ?1 AND scope = ?2 GROUP BY app, scope, source_id \
                     ON CONFLICT (app, scope, source_id) DO UPDATE SET last_admitted_at = \
                     MAX(scope_sources.last_admitted_at, excluded.last_admitted_at)",
                )
                .bind(app)
                .bind(scope)
                .execute(&mut *tx)
                .await?;
                sqlx::query(
                    "INSERT INTO scope_state (app, scope, bucket_units, bucket_at, \
                     sources_in_window, active) \
                     VALUES (?1, ?2, ?3, ?4, (SELECT COUNT(*) FROM scope_sources \
                     WHERE app = ?1 AND scope = ?2), 0) \
                     ON CONFLICT (app, scope) DO UPDATE \
                     SET sources_in_window = excluded.sources_in_window",
                )
                .bind(app)
                .bind(scope)
                .bind(full_bucket)
                .bind(now.0)
                .execute(&mut *tx)
                .await?;
                for sql in [
                    "INSERT INTO scope_spend (app, scope, bucket, reserved_nano, reserved_tokens) \
                     SELECT ?1, ?2, admitted_at / 3600000, COUNT(*) * 1000, COUNT(*) * 100 \
                     FROM admissions WHERE app = ?1 AND scope = ?2 \
                     GROUP BY admitted_at / 3600000 \
                     ON CONFLICT (app, scope, bucket) DO UPDATE SET \
                     reserved_nano = excluded.reserved_nano, \
                     reserved_tokens = excluded.reserved_tokens",
                    "INSERT INTO app_spend (app, bucket, stripe, reserved_nano, reserved_tokens) \
                     SELECT ?1, admitted_at / 3600000, ?3, COUNT(*) * 1000, COUNT(*) * 100 \
                     FROM admissions WHERE app = ?1 AND scope = ?2 \
                     GROUP BY admitted_at / 3600000 \
                     ON CONFLICT (app, bucket, stripe) DO UPDATE SET \
                     reserved_nano = reserved_nano + excluded.reserved_nano, \
                     reserved_tokens = reserved_tokens + excluded.reserved_tokens",
                ] {
                    sqlx::query(sql)
                        .bind(app)
                        .bind(scope)
                        .bind(tollgate_core::cost::app_spend_stripe(scope))
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
                // Fold the bulk load into the database file, as SQLite's automatic
                // checkpoints soon would (the store never ANALYZEs, so neither does this).
                sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .execute(p)
                    .await?;
            }
        }
        Ok(())
    }

    /// Admission records in one scope of Tollgate's `admissions` table (to report what a
    /// benchmark measured against).
    pub async fn admission_records(&self, app: &str, scope: &str) -> StoreResult<u64> {
        let n: i64 = match self {
            Baseline::Postgres(p) => {
                sqlx::query_scalar("SELECT COUNT(*) FROM admissions WHERE app = $1 AND scope = $2")
                    .bind(app)
                    .bind(scope)
                    .fetch_one(p)
                    .await?
            }
            Baseline::Sqlite(p) => {
                sqlx::query_scalar("SELECT COUNT(*) FROM admissions WHERE app = ? AND scope = ?")
                    .bind(app)
                    .bind(scope)
                    .fetch_one(p)
                    .await?
            }
        };
        Ok(n.max(0) as u64)
    }

    /// Moves every queued or running baseline task to `succeeded` at once, as the
    /// reference design's workers would have done meanwhile. A benchmark calls it between
    /// timed rounds so the reference's count of active tasks stays as small as in a
    /// system whose workers keep up. Returns how many moved.
    pub async fn finish_active(&self) -> StoreResult<u64> {
        let sql = "UPDATE baseline_tasks SET status = 'succeeded', output = '{}' \
                   WHERE status IN ('queued', 'running')";
        Ok(match self {
            Baseline::Postgres(p) => sqlx::query(sql).execute(p).await?.rows_affected(),
            Baseline::Sqlite(p) => sqlx::query(sql).execute(p).await?.rows_affected(),
        })
    }
}

/// The reference design's decision, in SPEC §4's order, with its floating-point bucket.
/// Returns the tokens left after taking one, or `None` when a limit refuses.
#[allow(clippy::too_many_arguments)]
fn reference_decide(
    budget: &Budget,
    steps: i64,
    sources: i64,
    seen: bool,
    scope_active: i64,
    global_active: i64,
    tokens: f64,
    updated: i64,
    now: Timestamp,
) -> Option<f64> {
    if steps >= i64::from(budget.max_steps_per_source.get()) {
        return None;
    }
    if !seen && sources >= i64::from(budget.sources_per_24_hours.get()) {
        return None;
    }
    if scope_active >= i64::from(budget.scope_concurrent.get())
        || global_active >= i64::from(budget.global_concurrent.get())
    {
        return None;
    }
    let elapsed_s = (now.0 - updated).max(0) as f64 / 1000.0;
    let rate = f64::from(budget.tasks_per_minute.get()) / 60.0;
    let available = (tokens + elapsed_s * rate).min(f64::from(budget.burst.get()));
    (available >= 1.0).then_some(available - 1.0)
}
