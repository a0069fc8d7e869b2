//! docs/conformance.md#admission's and docs/conformance.md#money-and-tokens's facts in one statement under the scope's advisory lock; the
//! decision is core's, through [`AdmissionFacts::decide`]. The app-wide spend limit
//! (docs/conformance.md#money-and-tokens) is checked last, under the app's advisory lock, taken only when the app
//! has such a limit.

use super::super::Tx;
use super::slots::app_counts;
use crate::StoreResult;
use crate::shared::admission::{
    AdmissionFacts, Refusal, ScopeUpdate, SpendReads, UnsourcedFacts, spend_checked,
};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::canonical::sha256_hex;
use tollgate_core::cost::window_first_bucket;
use tollgate_core::{AppId, BucketState, Budget, Reservation, ScopeId, SourceId, Timestamp};

/// docs/conformance.md#admission, docs/conformance.md#money-and-tokens under the scope lock: prunes the scope's expired sightings, reads the
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
    let facts: AdmissionFacts = sqlx::query_as(concat!(
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
         (SELECT COALESCE(SUM(active), 0)::BIGINT FROM app_slots WHERE app = $1) \
           AS app_active, \
         (SELECT COALESCE(SUM(GREATEST(active - share, 0)), 0)::BIGINT FROM ",
        app_counts!(),
        ") AS borrowed \
         FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = $1 AND s.scope = $2"
    ))
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.as_str())
    .bind(cutoff)
    .bind(logical_key)
    .bind(first)
    .fetch_one(&mut **tx)
    .await?;
    let decided = facts.decide(budget, reservation, now);
    spend_checked(tx, app, scope, budget, reservation, now, decided).await
}

/// docs/budgets.md, "Tasks without a source": docs/conformance.md#money-and-tokens's checks of a task without a
/// source, under the scope's advisory lock (exclusive) — output bound, the scope's
/// spend, the scope's token bucket, then the app's spend under the app's lock — and
/// none of docs/conformance.md#admission's. On admission returns the token bucket to store with its capacity
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
    let decided = facts.decide(budget, reservation, now);
    spend_checked(tx, app, scope, budget, reservation, now, decided).await
}

/// The advisory lock key of an app's spend (docs/conformance.md#money-and-tokens), distinct from every scope key.
fn app_lock_key(app: &AppId) -> i64 {
    let hex = sha256_hex(format!("tollgate-app-spend\u{1f}{app}").as_bytes());
    u64::from_str_radix(&hex[..16], 16).unwrap_or(0) as i64
}

/// PostgreSQL's serialization of an app's spend checks ([`spend_checked`]).
#[async_trait::async_trait]
impl SpendReads for Tx {
    async fn lock_app(&mut self, app: &AppId) -> StoreResult<()> {
        // Lock order: scope, then app.
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(app_lock_key(app))
            .execute(&mut **self)
            .await?;
        Ok(())
    }
}
