//! docs/conformance.md#admission's and docs/conformance.md#money-and-tokens's facts (read
//! under the scope's advisory lock by [`super::probe::reads`]); the decision is core's, through [`AdmissionFacts::decide`]. The app-wide spend limit
//! (docs/conformance.md#money-and-tokens) is checked last, under the app's advisory lock, taken only when the app
//! has such a limit.

use super::super::Tx;
use crate::StoreResult;
use crate::shared::admission::{
    AdmissionFacts, Refusal, ScopeUpdate, SpendReads, UnsourcedFacts, spend_checked,
};
use tollgate_core::canonical::sha256_hex;
use tollgate_core::{AppId, BucketState, Budget, Reservation, ScopeId, Timestamp};

/// docs/conformance.md#admission, docs/conformance.md#money-and-tokens under the scope
/// lock: asks core about the facts [`super::probe::reads`] read (through
/// [`AdmissionFacts::decide`]), and for an app with a spend limit takes the app's lock and
/// checks the app's window. The global cap is enforced again by the final conditional
/// increment.
pub(super) async fn admit(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    facts: &AdmissionFacts,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<ScopeUpdate, Refusal>> {
    let decided = facts.decide(budget, reservation, now);
    spend_checked(tx, app, scope, budget, reservation, now, decided).await
}

/// docs/budgets.md, "Tasks without a source": docs/conformance.md#money-and-tokens's checks of a task without a
/// source, under the scope's advisory lock (exclusive) — output bound, the scope's
/// spend, the scope's token bucket (the facts [`super::probe::reads`] read), then the
/// app's spend under the app's lock — and none of docs/conformance.md#admission's. On
/// admission returns the token bucket to store with its capacity in units (`None`: the
/// policy has no token rate).
pub(super) async fn check_unsourced(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    facts: &UnsourcedFacts,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<Option<(BucketState, i64)>, Refusal>> {
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
