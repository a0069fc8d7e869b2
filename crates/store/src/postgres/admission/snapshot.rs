//! SPEC §4's and §13's facts in one statement under the scope's advisory lock; the
//! decision is core's, through [`AdmissionFacts::decide`]. The app-wide spend limit
//! (SPEC §13) is checked last, under the app's advisory lock, taken only when the app
//! has such a limit.

use super::super::Tx;
use crate::StoreResult;
use crate::shared::admission::{AdmissionFacts, Refusal, ScopeUpdate, UnsourcedFacts};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::canonical::sha256_hex;
use tollgate_core::cost::{decide_app_spend, spend_retry_after, window_first_bucket};
use tollgate_core::{
    AppId, BucketState, Budget, CostRejection, Reservation, ScopeId, SourceId, Timestamp,
};

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
        Err(refusal) => {
            return Ok(Err(with_spend_retry(
                tx,
                app,
                scope,
                budget,
                reservation,
                refusal,
                now,
            )
            .await?));
        }
    };
    Ok(check_app_spend(tx, app, budget, reservation, now)
        .await?
        .map(|()| update))
}

/// docs/budgets.md, "Tasks without a source": SPEC §13's checks of a task without a
/// source, under the scope's advisory lock (exclusive) — output bound, the scope's
/// spend, the scope's token bucket, then the app's spend under the app's lock — and
/// none of SPEC §4's. On admission returns the token bucket to store with its capacity
/// in units (`None`: the policy has no token rate).
pub(super) async fn check_unsourced(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<Option<(BucketState, i64)>, Refusal>> {
    let first = window_first_bucket(now);
    let facts: UnsourcedFacts = sqlx::query_as(
        "SELECT s.token_units, s.token_at, \
         (SELECT COALESCE(SUM(reserved_nano + settled_nano), 0)::BIGINT FROM scope_spend \
                 WHERE app = $1 AND scope = $2 AND bucket >= $3) AS scope_window_nano \
         FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = $1 AND s.scope = $2",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(first)
    .fetch_one(&mut **tx)
    .await?;
    let token = match facts.decide(budget, reservation, now) {
        Ok(token) => token,
        Err(refusal) => {
            return Ok(Err(with_spend_retry(
                tx,
                app,
                scope,
                budget,
                reservation,
                refusal,
                now,
            )
            .await?));
        }
    };
    Ok(check_app_spend(tx, app, budget, reservation, now)
        .await?
        .map(|()| token))
}

/// A refusal as reported: a scope-spend refusal with when to retry (from the scope's
/// buckets), any other as it is.
async fn with_spend_retry(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    budget: &Budget,
    reservation: &Reservation,
    refusal: Refusal,
    now: Timestamp,
) -> StoreResult<Refusal> {
    let Refusal::Cost(c @ CostRejection::ScopeSpend { .. }) = refusal else {
        return Ok(refusal);
    };
    let limit = budget.cost.scope_nano_per_24_hours;
    let buckets = spend_buckets(tx, app, Some(scope), window_first_bucket(now)).await?;
    let wait = limit.and_then(|l| spend_retry_after(&buckets, reservation.nano_usd, l, now));
    Ok(Refusal::Cost(c.with_retry_after(wait)))
}

/// SPEC §13's last check, for an app with a spend limit: takes the app's advisory lock
/// (lock order: scope, then app) and checks the app's window.
async fn check_app_spend(
    tx: &mut Tx,
    app: &AppId,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<(), Refusal>> {
    let first = window_first_bucket(now);
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
    Ok(Ok(()))
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
