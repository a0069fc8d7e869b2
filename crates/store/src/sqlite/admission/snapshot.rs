//! docs/conformance.md#admission's and docs/conformance.md#cost-reservation's facts under the write lock, read each bounded independently of
//! the window's size; the decision is core's, through [`AdmissionFacts::decide`] and the
//! shared end of an admission ([`spend_checked`]); the writes are one query
//! (`sql/admit.sql`, `sql/reserve_unsourced.sql`).

use super::insert::SPEND_UPSERTS;
use crate::StoreResult;
use crate::shared::admission::{
    AdmissionFacts, Refusal, SpendReads, UnsourcedFacts, bind_token, spend_checked,
    stored_reservation,
};
use crate::shared::cost::{SpendDelta, bind_spend};
use crate::shared::named::{NamedStatement, Parts};
use crate::shared::sql::Exec;
use sqlx::SqliteConnection;
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::cost::{spend_bucket, window_first_bucket};
use tollgate_core::{
    AppId, BucketState, Budget, Reservation, ScopeId, SourceId, TaskCost, Timestamp,
};

/// The spend upserts, writing whatever their delta.
const SPEND_ALWAYS: &[Parts] = &[&[("spend_upserts", SPEND_UPSERTS), ("spend_when", "1")]];

/// An admission's writes but its record.
static ADMIT: NamedStatement =
    NamedStatement::new("admit", include_str!("../sql/admit.sql"), SPEND_ALWAYS);

/// A task without a source: its reservation and its scope's token bucket.
static RESERVE_UNSOURCED: NamedStatement = NamedStatement::new(
    "reserve_unsourced",
    include_str!("../sql/reserve_unsourced.sql"),
    SPEND_ALWAYS,
);

/// The names [`admit`] and [`reserve_unsourced`] bind first.
const SCOPE_NAMES: &[&str] = &["app", "scope"];
/// The names [`admit`] binds of the admission's counters, after the spend and token groups.
const ADMISSION_NAMES: &[&str] = &[
    "bucket_units",
    "bucket_at",
    "sources_delta",
    "source",
    "now",
    "share",
];
/// The names [`reserve_unsourced`] binds of the scope's task bucket.
const TASK_BUCKET_NAMES: &[&str] = &["bucket_units", "bucket_at"];

/// docs/conformance.md#admission, docs/conformance.md#money-and-tokens under the write lock: gathers the snapshot, asks core's [`decide`]
/// and cost checks (the app's spend last), and on admission stores the buckets, the
/// reservation in the spend buckets and the source's sighting. Returns the reservation
/// as stored. The admission record itself is inserted by the caller once the task row
/// exists.
#[allow(clippy::too_many_arguments)]
pub(super) async fn admit(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    source: &SourceId,
    logical_key: &str,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<Reservation, Refusal>> {
    let first = window_first_bucket(now);
    let cutoff = now.minus(ADMISSION_WINDOW).0;
    let pruned = sqlx::query(
        "DELETE FROM scope_sources WHERE app = ? AND scope = ? AND last_admitted_at <= ?",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(cutoff)
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;
    // The scope's spend window is read only under a USD limit, in the same statement
    // (no scope row: never admitted into, so nothing in its buckets counts).
    let state = scope_state(tx, app, scope, budget, first).await?;
    let seen: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM scope_sources WHERE app = ? AND scope = ? AND source_id = ? \
         AND last_admitted_at > ?",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.as_str())
    .bind(cutoff)
    .fetch_optional(&mut *tx)
    .await?;
    let steps: SourceStepsRow = sqlx::query_as(
        "SELECT COUNT(DISTINCT logical_key) AS steps, \
         COALESCE(MAX(logical_key = ?), 0) AS counted FROM admissions \
         WHERE app = ? AND scope = ? AND source_id = ? AND admitted_at > ? \
         AND logical_key IS NOT NULL",
    )
    .bind(logical_key)
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.as_str())
    .bind(cutoff)
    .fetch_one(&mut *tx)
    .await?;
    let global_active: i64 = sqlx::query_scalar(
        "SELECT (SELECT admitted FROM global_admission WHERE id = 1) \
         - (SELECT COALESCE(SUM(finished), 0) FROM global_finished)",
    )
    .fetch_one(&mut *tx)
    .await?;
    // docs/budgets.md, "Each app's share of the global capacity": the app's active
    // admitted tasks and the slots all apps hold beyond their shares.
    let (app_active, borrowed): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE((SELECT active FROM app_slots WHERE app = ?), 0), \
         COALESCE((SELECT SUM(MAX(active - share, 0)) FROM app_slots), 0)",
    )
    .bind(app.as_str())
    .fetch_one(&mut *tx)
    .await?;
    let facts = AdmissionFacts {
        app_active,
        borrowed,
        pruned,
        bucket_units: state.bucket_units,
        bucket_at: state.bucket_at,
        sources_in_window: state.sources_in_window,
        active: state.active,
        seen: seen.is_some(),
        steps: steps.steps,
        counted: steps.counted != 0,
        global_active,
        token_units: state.token_units,
        token_at: state.token_at,
        scope_window_nano: state.scope_window_nano,
    };
    let decided = facts.decide(budget, reservation, now);
    let reads = &mut *tx;
    let update = match spend_checked(reads, app, scope, budget, reservation, now, decided).await? {
        Ok(update) => update,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let (bucket, sources_delta) = (update.bucket, update.sources_delta);
    let token = update.token_bucket;
    let stored = stored_reservation(reservation, budget, token.is_some());
    // Every write of the admission in one query (one hop to the connection's thread).
    let mut b = ADMIT.binder();
    b.group(SCOPE_NAMES, |b| {
        b.bind("app", app.as_str()).bind("scope", scope.as_str());
    });
    bind_spend(
        &mut b,
        scope.as_str(),
        spend_bucket(now),
        SpendDelta::reserve(&stored),
    );
    bind_token(&mut b, token);
    b.group(ADMISSION_NAMES, |b| {
        b.bind("bucket_units", bucket.units)
            .bind("bucket_at", bucket.at.0)
            .bind("sources_delta", sources_delta)
            .bind("source", source.as_str())
            .bind("now", now.0)
            .bind(
                "share",
                budget.global_share.map_or(0, |s| i64::from(s.share)),
            );
    });
    tx.run(b.statement()?).await?;
    Ok(Ok(stored))
}

/// docs/budgets.md, "Tasks without a source": the cost checks of a task without a
/// source under the write lock — docs/conformance.md#cost-reservation's in order (output bound, the scope's spend,
/// the scope's token bucket, the app's spend), none of docs/conformance.md#admission's — then its reservation
/// in the spend buckets and the token bucket taken. Returns the reservation as stored.
pub(super) async fn reserve_unsourced(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    cost: &TaskCost,
    now: Timestamp,
) -> StoreResult<Result<Reservation, Refusal>> {
    let (budget, reservation) = (&cost.budget, &cost.reservation);
    let mut token = None;
    if cost.limited() {
        let first = window_first_bucket(now);
        let state = scope_state(tx, app, scope, budget, first).await?;
        let facts = UnsourcedFacts {
            token_units: state.token_units,
            token_at: state.token_at,
            scope_window_nano: state.scope_window_nano,
        };
        let decided = facts.decide(budget, reservation, now);
        let reads = &mut *tx;
        token = match spend_checked(reads, app, scope, budget, reservation, now, decided).await? {
            Ok(token) => token,
            Err(refusal) => return Ok(Err(refusal)),
        };
    }
    let stored = stored_reservation(reservation, budget, token.is_some());
    // The scope's row may not exist yet: a task bucket that was never used is full.
    let tasks = BucketState::full(budget.burst.get(), now);
    let mut b = RESERVE_UNSOURCED.binder();
    b.group(SCOPE_NAMES, |b| {
        b.bind("app", app.as_str()).bind("scope", scope.as_str());
    });
    bind_spend(
        &mut b,
        scope.as_str(),
        spend_bucket(now),
        SpendDelta::reserve(&stored),
    );
    b.group(TASK_BUCKET_NAMES, |b| {
        b.bind("bucket_units", tasks.units)
            .bind("bucket_at", tasks.at.0);
    });
    bind_token(&mut b, token);
    tx.run(b.statement()?).await?;
    Ok(Ok(stored))
}

/// A scope's counters and its spend window (read only under a scope USD limit), whether
/// or not the scope has a counters row: a task without a source may have reserved in
/// its buckets before any admission.
async fn scope_state(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    budget: &Budget,
    first: i64,
) -> StoreResult<ScopeStateRow> {
    Ok(sqlx::query_as(
        "SELECT s.bucket_units, s.bucket_at, s.sources_in_window, s.active, s.token_units, \
         s.token_at, CASE WHEN ?3 THEN (SELECT COALESCE(SUM(reserved_nano + settled_nano), 0) \
           FROM scope_spend WHERE app = ?1 AND scope = ?2 AND bucket >= ?4) ELSE 0 END \
           AS scope_window_nano \
         FROM (SELECT 1) LEFT JOIN scope_state s ON s.app = ?1 AND s.scope = ?2",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(budget.cost.scope_nano_per_24_hours.is_some())
    .bind(first)
    .fetch_one(&mut *tx)
    .await?)
}

/// SQLite's serialization of an app's spend checks ([`spend_checked`]): the write lock.
#[async_trait::async_trait]
impl SpendReads for SqliteConnection {
    async fn lock_app(&mut self, _app: &AppId) -> StoreResult<()> {
        // The write lock serializes every admission already.
        Ok(())
    }
}

/// A scope's counters row (`None`s: no row yet) and its spend window.
#[derive(sqlx::FromRow)]
struct ScopeStateRow {
    bucket_units: Option<i64>,
    bucket_at: Option<i64>,
    sources_in_window: Option<i64>,
    active: Option<i64>,
    token_units: Option<i64>,
    token_at: Option<i64>,
    scope_window_nano: i64,
}

/// A source's distinct steps within the window, and whether this logical key is one.
#[derive(sqlx::FromRow)]
struct SourceStepsRow {
    steps: i64,
    counted: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::admission::TOKEN_NAMES;
    use crate::shared::cost::SPEND_NAMES;
    use crate::shared::named::check_binds;

    /// Every statement of this module, with the groups its binder binds, in order.
    #[test]
    fn every_statement_and_its_binder_agree() {
        check_binds(
            &ADMIT,
            &[SCOPE_NAMES, SPEND_NAMES, TOKEN_NAMES, ADMISSION_NAMES],
        );
        check_binds(
            &RESERVE_UNSOURCED,
            &[SCOPE_NAMES, SPEND_NAMES, TASK_BUCKET_NAMES, TOKEN_NAMES],
        );
    }
}
