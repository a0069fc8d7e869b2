//! SPEC §4's and §13's facts in one statement under the scope's advisory lock; the
//! decision is core's, through [`AdmissionFacts::decide`]. The app-wide spend limit
//! (SPEC §13) is checked last, under the app's advisory lock, taken only when the app
//! has such a limit.

use super::super::Tx;
use crate::StoreResult;
use crate::shared::admission::{AdmissionFacts, Refusal, ScopeUpdate};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::canonical::sha256_hex;
use tollgate_core::cost::{decide_app_spend, spend_retry_after, window_first_bucket};
use tollgate_core::{AppId, Budget, CostRejection, Reservation, ScopeId, SourceId, Timestamp};

/// SPEC §4 and §13 under the scope lock: prunes the scope's expired sightings, reads the
/// snapshot, asks core (through [`AdmissionFacts::decide`]), and for an app with a spend
/// limit takes the app's lock and checks the app's window. The global cap is enforced
/// again by the final conditional increment.
#[allow(clippy::too_many_arguments)]
pub(super) async fn admit(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    source: &SourceId,
    logical_key: &str,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<ScopeUpdate, Refusal>> {
    let cutoff = now.minus(ADMISSION_WINDOW).0;
    let first = window_first_bucket(now);
    // The prune and the snapshot are one statement: the snapshot sees the sightings as
    // they were before the prune, and counts only those newer than the cutoff anyway.
    let facts: AdmissionFacts = sqlx::query_as(
        "WITH pruned AS (DELETE FROM scope_sources \
           WHERE app = $1 AND scope = $2 AND last_admitted_at <= $4 RETURNING 1) \
         SELECT (SELECT COUNT(*) FROM pruned)::BIGINT AS pruned, \
         s.bucket_units, s.bucket_at, s.sources_in_window, s.active, \
         s.token_units, s.token_at, \
         EXISTS (SELECT 1 FROM scope_sources WHERE app = $1 AND scope = $2 AND source_id = $3 \
                 AND last_admitted_at > $4) AS seen, \
         (SELECT COUNT(DISTINCT logical_key) FROM admissions WHERE app = $1 AND scope = $2 \
                 AND source_id = $3 AND admitted_at > $4 AND logical_key IS NOT NULL) AS steps, \
         EXISTS (SELECT 1 FROM admissions WHERE app = $1 AND scope = $2 AND source_id = $3 \
                 AND admitted_at > $4 AND logical_key = $5) AS counted, \
         (SELECT COALESCE(SUM(admitted), 0)::BIGINT FROM global_slots) \
           - (SELECT COALESCE(SUM(finished), 0)::BIGINT FROM global_finished) AS global_active, \
         (SELECT COALESCE(SUM(reserved_nano + settled_nano), 0)::BIGINT FROM scope_spend \
                 WHERE app = $1 AND scope = $2 AND bucket >= $6) AS scope_window_nano, \
         COALESCE((SELECT active FROM app_slots WHERE app = $1), 0)::BIGINT AS app_active, \
         (SELECT COALESCE(SUM(GREATEST(active - share, 0)), 0)::BIGINT FROM app_slots) \
           AS borrowed \
         FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = $1 AND s.scope = $2",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.as_str())
    .bind(cutoff)
    .bind(logical_key)
    .bind(first)
    .fetch_one(&mut **tx)
    .await?;
    let update = match facts.decide(budget, reservation, now) {
        Ok(update) => update,
        Err(Refusal::Cost(c @ CostRejection::ScopeSpend { .. })) => {
            let limit = budget.cost.scope_nano_per_24_hours;
            let buckets = spend_buckets(tx, app, Some(scope), first).await?;
            let wait =
                limit.and_then(|l| spend_retry_after(&buckets, reservation.nano_usd, l, now));
            return Ok(Err(Refusal::Cost(c.with_retry_after(wait))));
        }
        Err(refusal) => return Ok(Err(refusal)),
    };
    if let Some(limit) = budget.cost.app_nano_per_24_hours {
        // The app's lock in its own statement, so the read below sees every admission of
        // the app that held it before (lock order: scope, then app).
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(app_lock_key(app))
            .execute(&mut **tx)
            .await?;
        let window: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(reserved_nano + settled_nano), 0)::BIGINT FROM app_spend \
             WHERE app = $1 AND bucket >= $2",
        )
        .bind(app.as_str())
        .bind(first)
        .fetch_one(&mut **tx)
        .await?;
        if let Err(c) = decide_app_spend(&budget.cost, reservation, window) {
            let buckets = spend_buckets(tx, app, None, first).await?;
            let wait = spend_retry_after(&buckets, reservation.nano_usd, limit, now);
            return Ok(Err(Refusal::Cost(c.with_retry_after(wait))));
        }
    }
    Ok(Ok(update))
}

/// The advisory lock key of an app's spend (SPEC §13), distinct from every scope key.
pub(in crate::postgres) fn app_lock_key(app: &AppId) -> i64 {
    let hex = sha256_hex(format!("tollgate-app-spend\u{1f}{app}").as_bytes());
    u64::from_str_radix(&hex[..16], 16).unwrap_or(0) as i64
}

/// A window's buckets `(bucket, settled + reserved)` of a scope or (`None`) the app.
async fn spend_buckets(
    tx: &mut Tx,
    app: &AppId,
    scope: Option<&ScopeId>,
    first: i64,
) -> StoreResult<Vec<(i64, i64)>> {
    let rows: Vec<(i64, i64)> = match scope {
        Some(scope) => {
            sqlx::query_as(
                "SELECT bucket, (reserved_nano + settled_nano)::BIGINT FROM scope_spend \
                 WHERE app = $1 AND scope = $2 AND bucket >= $3",
            )
            .bind(app.as_str())
            .bind(scope.as_str())
            .bind(first)
            .fetch_all(&mut **tx)
            .await?
        }
        None => {
            sqlx::query_as(
                "SELECT bucket, SUM(reserved_nano + settled_nano)::BIGINT FROM app_spend \
                 WHERE app = $1 AND bucket >= $2 GROUP BY bucket",
            )
            .bind(app.as_str())
            .bind(first)
            .fetch_all(&mut **tx)
            .await?
        }
    };
    Ok(rows)
}
