//! Loading a scope's 24 h window of admission records into Tollgate's own tables.

use super::Baseline;
use tollgate_core::{Budget, Timestamp};
use tollgate_store::{StoreError, StoreResult};

/// How far back seeded admission records reach: inside the 24 h window with an hour to
/// spare, so none expires (and is pruned) while a benchmark runs.
const SEED_WINDOW_SPAN_MS: i64 = 23 * 60 * 60 * 1000;

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
    /// and their owner's data deleted since (admission records outlive their tasks,
    /// docs/conformance.md#admission). The records go in with ONE statement; then the facts Tollgate keeps beside
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
                // docs/conformance.md#cost-reservation: every seeded record is also a reservation (1 µ$, 100 tokens)
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
