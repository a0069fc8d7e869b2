//! The global concurrency cap over striped counters (migration 0004): a fast path that
//! takes one stripe's allowance, and the exact rebalancing recount.

use super::super::Tx;
use crate::StoreResult;
use tollgate_core::TaskId;

/// Number of `global_slots` stripes (migration 0004).
pub(super) const SLOT_STRIPES: i64 = 16;

/// The slot stripe an admission tries first: spread by the new task's random id.
pub(super) fn slot_stripe(id: TaskId) -> i64 {
    let h = id
        .to_string()
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    (h % SLOT_STRIPES as u64) as i64
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
