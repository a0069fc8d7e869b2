//! The global concurrency cap over striped counters (migration 0004): a fast path that
//! takes one stripe's allowance, and the exact rebalancing recount.

use super::super::Tx;
use crate::StoreResult;
use tollgate_core::canonical::sha256_hex;
use tollgate_core::{AdmissionRejection, AppId, Budget, ShareUse, TaskId, decide_global_share};

/// Number of `global_slots` stripes (migration 0004).
pub(super) const SLOT_STRIPES: i64 = 16;

/// A hash of a new task's random id, which its stripes are picked by.
fn id_hash(id: TaskId) -> u64 {
    id.to_string()
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
}

/// The slot stripe an admission tries first: spread by the new task's random id.
pub(super) fn slot_stripe(id: TaskId) -> i64 {
    (id_hash(id) % SLOT_STRIPES as u64) as i64
}

/// Number of `app_slots` stripes an app without a share counts on (1 to this; stripe 0
/// is a shared app's and every ending's, migration 0026).
const APP_SLOT_STRIPES: u64 = 15;

/// The `app_slots` stripe an admission of an app without a share counts on: spread by
/// the new task's random id, independently of its [`slot_stripe`].
pub(super) fn app_slot_stripe(id: TaskId) -> i64 {
    1 + ((id_hash(id) / SLOT_STRIPES as u64) % APP_SLOT_STRIPES) as i64
}

/// Slow path of the global cap, when the chosen stripe has no allowance left (or its
/// allowance was computed for another `global_concurrent`): lock every stripe in order,
/// count the service's active admitted tasks exactly (`Σ admitted − Σ finished`), and if
/// one more fits, take it on `stripe` and hand the rest of the free capacity out again
/// as allowances spread over the stripes.
///
/// Why the cap holds: a rebalance at a moment with `A₀ = Σ admitted` and `F₀` finished
/// (a read that can only lag, so `A₀ − F₀` is at least the true count) sets
/// `Σ capacity = A₀ + (cap − (A₀ − F₀))`. Fast-path admissions never take a stripe past
/// its capacity, so afterwards `Σ admitted ≤ cap + F₀ ≤ cap + F_now`: the active count
/// never exceeds the cap. Allowances are only used with the cap they were computed for.
/// Returns whether the slot was taken.
pub(super) async fn take_slot_rebalancing(tx: &mut Tx, stripe: i64, cap: i64) -> StoreResult<bool> {
    let rows: Vec<SlotRow> = sqlx::query_as(
        "SELECT admitted, \
         (SELECT COALESCE(SUM(finished), 0)::BIGINT FROM global_finished) AS finished \
         FROM global_slots ORDER BY stripe FOR UPDATE",
    )
    .fetch_all(&mut **tx)
    .await?;
    let admitted: i64 = rows.iter().map(|r| r.admitted).sum();
    let finished = rows.first().map_or(0, |r| r.finished);
    let active = admitted - finished;
    if active >= cap {
        return Ok(false);
    }
    let free = cap - active - 1;
    let share = free / SLOT_STRIPES;
    let rest = free % SLOT_STRIPES;
    sqlx::query(
        "UPDATE global_slots SET \
           admitted = admitted + CASE WHEN stripe = $1 THEN 1 ELSE 0 END, \
           capacity = admitted + CASE WHEN stripe = $1 THEN 1 + $3 ELSE 0 END + $2, \
           cap_for = $4",
    )
    .bind(stripe as i32)
    .bind(share)
    .bind(rest)
    .bind(cap)
    .execute(&mut **tx)
    .await?;
    Ok(true)
}

/// One stripe's admitted count, with the service's finished total beside it.
#[derive(sqlx::FromRow)]
struct SlotRow {
    admitted: i64,
    finished: i64,
}

/// The advisory lock every admission that may borrow an unreserved global slot holds to
/// its commit (docs/locking.md), distinct from every scope and app key.
fn share_pool_lock_key() -> i64 {
    let hex = sha256_hex(b"tollgate-global-share-pool");
    u64::from_str_radix(&hex[..16], 16).unwrap_or(0) as i64
}

/// Slow path of the app's share of the global capacity (docs/budgets.md, "Each app's
/// share of the global capacity"), when the fast path could not take one of the app's
/// own slots (or the global stripe's allowance ran out): with shares, under the pool's
/// advisory lock (so borrowers of every app are serialized across replicas) and the
/// app's row lock, count the app's active tasks and the slots all apps hold beyond
/// their shares exactly, and let core decide; then count the task on the app's row.
///
/// Why the shares hold: an app's own slots are taken only under its row lock while it
/// holds fewer than its share (the fast path's conditional upsert re-checks the locked
/// row), which leaves `Σ max(0, active − share)` unchanged; a slot beyond the share is
/// taken only here, one borrower at a time, after a read that sees every committed
/// borrower (and at worst too few finished tasks). So `Σ max(active, share) ≤
/// global_concurrent` and no app's share is ever taken by another.
pub(super) async fn take_share_rebalancing(
    tx: &mut Tx,
    app: &AppId,
    budget: &Budget,
) -> StoreResult<Result<(), AdmissionRejection>> {
    if let Some(share) = &budget.global_share {
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(share_pool_lock_key())
            .execute(&mut **tx)
            .await?;
        // Every row of the app, in stripe order; its count is their sum.
        let app_active: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(active), 0)::BIGINT FROM (SELECT active FROM app_slots \
             WHERE app = $1 ORDER BY stripe FOR UPDATE) AS mine",
        )
        .bind(app.as_str())
        .fetch_one(&mut **tx)
        .await?;
        // Each app's count and share as one row: the view `app_slot_counts` (migration
        // 0028) sums its stripes, its share the largest (only stripe 0 holds a share);
        // the admission facts read the same view.
        let borrowed: i64 = sqlx::query_scalar(
            "SELECT COALESCE(SUM(GREATEST(active - share, 0)), 0)::BIGINT \
             FROM app_slot_counts",
        )
        .fetch_one(&mut **tx)
        .await?;
        let used = ShareUse {
            app_active: app_active.max(0) as u64,
            borrowed: borrowed.max(0) as u64,
        };
        if let Err(refusal) = decide_global_share(share, budget.global_concurrent.get(), used) {
            return Ok(Err(refusal));
        }
    }
    // On stripe 0, the row an app with a share counts its own slots on.
    sqlx::query(
        "INSERT INTO app_slots (app, stripe, active, share) VALUES ($1, 0, 1, $2) \
         ON CONFLICT (app, stripe) DO UPDATE SET active = app_slots.active + 1, \
         share = EXCLUDED.share",
    )
    .bind(app.as_str())
    .bind(budget.global_share.map_or(0, |s| i64::from(s.share)))
    .execute(&mut **tx)
    .await?;
    Ok(Ok(()))
}
