//! SPEC §4 between the SQL and core's [`decide`]: the facts an admission reads (each
//! backend reads them its own way, into [`AdmissionFacts`]), the decision, and what the
//! admission then writes to its scope's row ([`ScopeUpdate`]). A later admission rule
//! (cost reservations) adds its facts here and its arithmetic in core.

use crate::StoreError;
use tollgate_core::cost::{CostSnapshot, decide_cost};
use tollgate_core::{
    AdmissionRejection, AdmissionSnapshot, BucketState, Budget, CostRejection, Reservation,
    ShareUse, Timestamp, Usage, decide,
};

/// What an admission reads under its scope's lock.
#[derive(sqlx::FromRow, Debug, Clone, Default)]
pub(crate) struct AdmissionFacts {
    /// The scope's expired sightings pruned on the way.
    pub(crate) pruned: i64,
    /// The scope's bucket (`None` for a scope never admitted to).
    pub(crate) bucket_units: Option<i64>,
    pub(crate) bucket_at: Option<i64>,
    /// The scope's distinct-source count before the prune.
    pub(crate) sources_in_window: Option<i64>,
    /// The scope's active admitted tasks.
    pub(crate) active: Option<i64>,
    /// The source was admitted within the window.
    pub(crate) seen: bool,
    /// Distinct logical keys of the source within the window.
    pub(crate) steps: i64,
    /// This logical key is among them.
    pub(crate) counted: bool,
    /// The service's active admitted tasks.
    pub(crate) global_active: i64,
    /// SPEC §13: the scope's model-token bucket (`None`: never used).
    pub(crate) token_units: Option<i64>,
    pub(crate) token_at: Option<i64>,
    /// SPEC §13: the scope's settled + reserved nano-dollars in the window's buckets.
    pub(crate) scope_window_nano: i64,
    /// The app's active admitted tasks (`app_slots`; docs/budgets.md, "Each app's share
    /// of the global capacity").
    pub(crate) app_active: i64,
    /// The global slots all apps hold beyond their shares.
    pub(crate) borrowed: i64,
}

/// Why admission refused a task: SPEC §4's checks, then SPEC §13's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A SPEC §4 limit.
    Admission(AdmissionRejection),
    /// A SPEC §13 limit.
    Cost(CostRejection),
}

impl From<Refusal> for StoreError {
    fn from(r: Refusal) -> StoreError {
        match r {
            Refusal::Admission(a) => StoreError::Admission(a),
            Refusal::Cost(c) => StoreError::Cost(c),
        }
    }
}

/// What an admission writes to its scope's row: the bucket after taking a token and the
/// change in distinct sources (a new source, minus the expired sightings pruned).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScopeUpdate {
    pub(crate) bucket: BucketState,
    pub(crate) sources_delta: i64,
    /// SPEC §13: the model-token bucket after taking the reservation, with its capacity
    /// in units (`None`: the policy has no token rate; the stored bucket is kept).
    pub(crate) token_bucket: Option<(BucketState, i64)>,
}

impl AdmissionFacts {
    /// Asks core's [`decide`] (SPEC §4), then [`decide_cost`] (SPEC §13, the scope's part).
    pub(crate) fn decide(
        &self,
        budget: &Budget,
        reservation: &Reservation,
        now: Timestamp,
    ) -> Result<ScopeUpdate, Refusal> {
        let snapshot = AdmissionSnapshot {
            source_steps: self.steps.max(0) as u64,
            step_already_counted: self.counted,
            sources_in_window: self
                .sources_in_window
                .unwrap_or(0)
                .saturating_sub(self.pruned)
                .max(0) as u64,
            source_already_seen: self.seen,
            scope_active: self.active.unwrap_or(0).max(0) as u64,
            global_active: self.global_active.max(0) as u64,
            share: ShareUse {
                app_active: self.app_active.max(0) as u64,
                borrowed: self.borrowed.max(0) as u64,
            },
        };
        let bucket = match (self.bucket_units, self.bucket_at) {
            (Some(units), Some(at)) => Some(BucketState {
                units,
                at: Timestamp(at),
            }),
            _ => None,
        };
        let bucket = decide(budget, &snapshot, bucket, now).map_err(Refusal::Admission)?;
        let cost = CostSnapshot {
            scope_window_nano: self.scope_window_nano,
            token_bucket: match (self.token_units, self.token_at) {
                (Some(units), Some(at)) => Some(BucketState {
                    units,
                    at: Timestamp(at),
                }),
                _ => None,
            },
            app_window_nano: 0,
        };
        let token_bucket =
            decide_cost(&budget.cost, reservation, &cost, now).map_err(Refusal::Cost)?;
        // Relative updates: whoever deletes an expired sighting subtracts it, exactly once.
        Ok(ScopeUpdate {
            bucket,
            sources_delta: i64::from(!self.seen) - self.pruned,
            token_bucket: token_bucket.map(|b| (b, token_capacity_units(budget))),
        })
    }
}

/// The capacity of a policy's model-token bucket in units (0 without a token rate).
fn token_capacity_units(budget: &Budget) -> i64 {
    budget.cost.token_rate.map_or(0, |r| {
        i64::from(r.token_burst.get()) * tollgate_core::admission::TOKEN_UNITS
    })
}

/// What the cost checks of a task without a source read under its scope's lock
/// (docs/budgets.md, "Tasks without a source").
#[derive(sqlx::FromRow, Debug, Clone, Copy, Default)]
pub(crate) struct UnsourcedFacts {
    /// The scope's model-token bucket (`None`: never used).
    pub(crate) token_units: Option<i64>,
    pub(crate) token_at: Option<i64>,
    /// The scope's settled + reserved nano-dollars in the window's buckets.
    pub(crate) scope_window_nano: i64,
}

impl UnsourcedFacts {
    /// Core's [`decide_cost`] (SPEC §13's scope part; SPEC §4's limits are about sources
    /// and task counts and do not apply). On admission returns the token bucket to store
    /// with its capacity in units (`None`: the policy has no token rate).
    pub(crate) fn decide(
        &self,
        budget: &Budget,
        reservation: &Reservation,
        now: Timestamp,
    ) -> Result<Option<(BucketState, i64)>, Refusal> {
        let cost = CostSnapshot {
            scope_window_nano: self.scope_window_nano,
            token_bucket: match (self.token_units, self.token_at) {
                (Some(units), Some(at)) => Some(BucketState {
                    units,
                    at: Timestamp(at),
                }),
                _ => None,
            },
            app_window_nano: 0,
        };
        let token_bucket =
            decide_cost(&budget.cost, reservation, &cost, now).map_err(Refusal::Cost)?;
        Ok(token_bucket.map(|b| (b, token_capacity_units(budget))))
    }
}

/// The usage stored with a cache hit (no tokens were spent), in one form for both
/// backends.
pub(crate) fn cached_usage() -> String {
    serde_json::to_string(&Usage::default()).unwrap_or_else(|_| "{}".into())
}
