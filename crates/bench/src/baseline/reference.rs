//! The reference design's admission (the module docs of [`super`] say what it is).

use super::{Baseline, ReferenceOutcome};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::{Budget, TaskId, Timestamp};
use tollgate_store::StoreResult;

/// The one database-wide advisory lock of the reference design.
const REFERENCE_GLOBAL_LOCK: i64 = 7_233_001;

impl Baseline {
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
}

/// The reference design's decision, in docs/conformance.md#admission-order's order, with its floating-point bucket.
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
