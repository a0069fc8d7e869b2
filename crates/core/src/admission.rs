//! Admission arithmetic (docs/conformance.md#admission) as pure functions. Both store backends gather a
//! [`AdmissionSnapshot`] under their locks and call [`decide`]; there is no second copy.

use crate::budget::Budget;
use crate::error::ErrorCode;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// One token, in the bucket's integer unit. A token is 60,000 units so that a refill of
/// `tasks_per_minute` tokens a minute is exactly `tasks_per_minute` units a millisecond:
/// the bucket is integer arithmetic with no rounding drift.
pub const TOKEN_UNITS: i64 = 60_000;

/// The 24 h admission window.
pub const ADMISSION_WINDOW: Duration = Duration::from_secs(24 * 60 * 60);

/// A token bucket's stored state: units held at an instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketState {
    /// Tokens held, in [`TOKEN_UNITS`].
    pub units: i64,
    /// When `units` was last computed.
    pub at: Timestamp,
}

impl BucketState {
    /// A full bucket for a scope seen for the first time.
    pub fn full(burst: u32, now: Timestamp) -> BucketState {
        BucketState {
            units: i64::from(burst) * TOKEN_UNITS,
            at: now,
        }
    }

    /// The state refilled up to `now`, capped at `burst` tokens. A clock that moved back
    /// refills nothing (and keeps the later instant, so time never runs twice).
    pub fn refilled(self, burst: u32, tasks_per_minute: u32, now: Timestamp) -> BucketState {
        let capacity = i64::from(burst) * TOKEN_UNITS;
        let elapsed = (now.0 - self.at.0).max(0);
        let units = self
            .units
            .saturating_add(elapsed.saturating_mul(i64::from(tasks_per_minute)))
            .min(capacity);
        BucketState {
            units,
            at: Timestamp(now.0.max(self.at.0)),
        }
    }

    /// Takes one token after refilling, or says how long until the next token arrives.
    pub fn take(
        self,
        burst: u32,
        tasks_per_minute: u32,
        now: Timestamp,
    ) -> Result<BucketState, Duration> {
        // One token never exceeds a positive burst, so a wait is always known.
        self.take_n(burst, tasks_per_minute, 1, now)
            .map_err(|wait| wait.unwrap_or(Duration::MAX))
    }

    /// Takes `n` tokens after refilling (docs/conformance.md#admission takes one task, docs/conformance.md#money-and-tokens a task's
    /// reserved model tokens), or says how long until `n` are there — `None` when `n`
    /// exceeds the capacity and never will be.
    pub fn take_n(
        self,
        burst: u32,
        per_minute: u32,
        n: u64,
        now: Timestamp,
    ) -> Result<BucketState, Option<Duration>> {
        if n > u64::from(burst) {
            return Err(None);
        }
        // n ≤ burst < 2^32, so n × TOKEN_UNITS fits.
        let needed = n as i64 * TOKEN_UNITS;
        let refilled = self.refilled(burst, per_minute, now);
        if refilled.units >= needed {
            Ok(BucketState {
                units: refilled.units - needed,
                at: refilled.at,
            })
        } else {
            let missing = needed - refilled.units;
            let per_ms = i64::from(per_minute);
            let wait_ms = (missing + per_ms - 1) / per_ms;
            Err(Some(Duration::from_millis(wait_ms as u64)))
        }
    }
}

/// What admission needs to know about a scope, gathered by a backend under its locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AdmissionSnapshot {
    /// Distinct live logical keys admitted for this task's source in the window.
    pub source_steps: u64,
    /// Whether this task's logical key is already one of them (asking again for the same
    /// logical step does not count twice).
    pub step_already_counted: bool,
    /// Distinct sources admitted in the scope in the window.
    pub sources_in_window: u64,
    /// Whether this task's source is already one of them (always allowed).
    pub source_already_seen: bool,
    /// Scoped tasks of the scope that are queued or running.
    pub scope_active: u64,
    /// Scoped tasks of all apps and scopes that are queued or running.
    pub global_active: u64,
    /// The app's use of the global capacity, for a budget with a
    /// [`GlobalShare`](crate::GlobalShare).
    pub share: crate::ShareUse,
}

/// Why admission refused a task. The first failing check in docs/conformance.md#admission-order's order decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionRejection {
    /// `max_steps_per_source` reached.
    #[error(
        "the source already has {limit} distinct steps in the last 24 h (max_steps_per_source)"
    )]
    SourceBudget {
        /// The limit.
        limit: u32,
    },
    /// `sources_per_24_hours` reached.
    #[error(
        "the scope already has {limit} distinct sources in the last 24 h (sources_per_24_hours)"
    )]
    DailyBudget {
        /// The limit.
        limit: u32,
    },
    /// `scope_concurrent` reached.
    #[error("the scope already has {limit} queued or running tasks (scope_concurrent)")]
    ScopeCapacity {
        /// The limit.
        limit: u32,
    },
    /// `global_concurrent` reached.
    #[error("the service already has {limit} queued or running scoped tasks (global_concurrent)")]
    GlobalCapacity {
        /// The limit.
        limit: u32,
    },
    /// The app holds its share of the global capacity and every unreserved slot is lent
    /// (docs/budgets.md, "Each app's share of the global capacity").
    #[error(
        "the app already has {in_use} queued or running scoped tasks: its own {share} global \
         slots (global_concurrent_share) and the {lendable} slots no app reserved are in use"
    )]
    AppCapacity {
        /// The app's queued or running scoped tasks.
        in_use: u32,
        /// Its share.
        share: u32,
        /// The global slots no app reserved.
        lendable: u32,
    },
    /// The scope's token bucket is empty.
    #[error("rate limit reached for the scope (burst/tasks_per_minute); next token in {} ms", retry_after.as_millis())]
    RateLimit {
        /// Time until the next token arrives.
        retry_after: Duration,
    },
}

impl AdmissionRejection {
    /// The docs/conformance.md#error-codes error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            AdmissionRejection::SourceBudget { .. } => ErrorCode::SourceBudget,
            AdmissionRejection::DailyBudget { .. } => ErrorCode::DailyBudget,
            AdmissionRejection::ScopeCapacity { .. }
            | AdmissionRejection::GlobalCapacity { .. }
            | AdmissionRejection::AppCapacity { .. } => ErrorCode::Capacity,
            AdmissionRejection::RateLimit { .. } => ErrorCode::RateLimit,
        }
    }

    /// When to retry, where known (rate limit: when the next token arrives).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            AdmissionRejection::RateLimit { retry_after } => Some(*retry_after),
            _ => None,
        }
    }
}

/// The ordered decision of docs/conformance.md#admission: steps per source, distinct sources, scope
/// concurrency, global concurrency, then the token bucket. On admission returns the
/// bucket state to store.
pub fn decide(
    budget: &Budget,
    snapshot: &AdmissionSnapshot,
    bucket: Option<BucketState>,
    now: Timestamp,
) -> Result<BucketState, AdmissionRejection> {
    let steps = budget.max_steps_per_source.get();
    if !snapshot.step_already_counted && snapshot.source_steps >= u64::from(steps) {
        return Err(AdmissionRejection::SourceBudget { limit: steps });
    }
    let sources = budget.sources_per_24_hours.get();
    if !snapshot.source_already_seen && snapshot.sources_in_window >= u64::from(sources) {
        return Err(AdmissionRejection::DailyBudget { limit: sources });
    }
    let scope = budget.scope_concurrent.get();
    if snapshot.scope_active >= u64::from(scope) {
        return Err(AdmissionRejection::ScopeCapacity { limit: scope });
    }
    let global = budget.global_concurrent.get();
    match &budget.global_share {
        // docs/budgets.md, "Each app's share of the global capacity": the share keeps
        // the service within global_concurrent and a refusal names the app's limit.
        Some(share) => crate::decide_global_share(share, global, snapshot.share)?,
        None if snapshot.global_active >= u64::from(global) => {
            return Err(AdmissionRejection::GlobalCapacity { limit: global });
        }
        None => {}
    }
    let burst = budget.burst.get();
    let rate = budget.tasks_per_minute.get();
    let state = bucket.unwrap_or_else(|| BucketState::full(burst, now));
    state
        .take(burst, rate, now)
        .map_err(|retry_after| AdmissionRejection::RateLimit { retry_after })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn budget(steps: i64, sources: i64, scope: i64, global: i64, burst: i64, rate: i64) -> Budget {
        Budget::new(steps, sources, scope, global, burst, rate).unwrap()
    }

    #[test]
    fn bucket_starts_full_and_refills_continuously() {
        let t0 = Timestamp(1_000_000);
        let mut s = BucketState::full(2, t0);
        s = s.take(2, 60, t0).unwrap();
        s = s.take(2, 60, t0).unwrap();
        // 60/min = one token a second.
        assert_eq!(s.take(2, 60, t0), Err(Duration::from_secs(1)));
        assert_eq!(
            s.take(2, 60, Timestamp(t0.0 + 400)),
            Err(Duration::from_millis(600))
        );
        assert!(s.take(2, 60, Timestamp(t0.0 + 1000)).is_ok());
        // Never more than burst.
        let later = s.refilled(2, 60, Timestamp(t0.0 + 3_600_000));
        assert_eq!(later.units, 2 * TOKEN_UNITS);
    }

    #[test]
    fn clock_going_back_refills_nothing() {
        let s = BucketState {
            units: 0,
            at: Timestamp(10_000),
        };
        let r = s.refilled(5, 60, Timestamp(5_000));
        assert_eq!(r.units, 0);
        assert_eq!(r.at, Timestamp(10_000));
    }

    #[test]
    fn checks_run_in_spec_order() {
        let b = budget(1, 1, 1, 1, 1, 1);
        let all_full = AdmissionSnapshot {
            source_steps: 1,
            step_already_counted: false,
            sources_in_window: 1,
            source_already_seen: false,
            scope_active: 1,
            global_active: 1,
            share: crate::ShareUse::default(),
        };
        let empty_bucket = Some(BucketState {
            units: 0,
            at: Timestamp(0),
        });
        let now = Timestamp(0);
        let d = |s: AdmissionSnapshot| decide(&b, &s, empty_bucket, now).unwrap_err().code();
        assert_eq!(d(all_full), ErrorCode::SourceBudget);
        let s = AdmissionSnapshot {
            step_already_counted: true,
            ..all_full
        };
        assert_eq!(d(s), ErrorCode::DailyBudget);
        let s = AdmissionSnapshot {
            source_already_seen: true,
            ..s
        };
        assert!(matches!(
            decide(&b, &s, empty_bucket, now),
            Err(AdmissionRejection::ScopeCapacity { limit: 1 })
        ));
        let s = AdmissionSnapshot {
            scope_active: 0,
            ..s
        };
        assert!(matches!(
            decide(&b, &s, empty_bucket, now),
            Err(AdmissionRejection::GlobalCapacity { limit: 1 })
        ));
        let s = AdmissionSnapshot {
            global_active: 0,
            ..s
        };
        let err = decide(&b, &s, empty_bucket, now).unwrap_err();
        assert_eq!(err.code(), ErrorCode::RateLimit);
        assert_eq!(err.retry_after(), Some(Duration::from_secs(60)));
        assert!(decide(&b, &s, None, now).is_ok());
    }

    proptest! {
        /// Over any sequence of attempts, admitted ≤ burst + rate × elapsed.
        #[test]
        fn bucket_never_overshoots(burst in 1u32..20, rate in 1u32..600, steps in proptest::collection::vec(0i64..5_000, 1..200)) {
            let mut now = Timestamp(0);
            let mut state = BucketState::full(burst, now);
            let mut admitted = 0i64;
            for dt in steps {
                now = Timestamp(now.0 + dt);
                if let Ok(s) = state.take(burst, rate, now) { state = s; admitted += 1; }
                let allowed_units = i64::from(burst) * TOKEN_UNITS + now.0 * i64::from(rate);
                prop_assert!(admitted * TOKEN_UNITS <= allowed_units);
            }
        }

        /// The reported retry time is exactly when the next token arrives.
        #[test]
        fn retry_after_is_exact(burst in 1u32..5, rate in 1u32..1000, units in 0i64..TOKEN_UNITS) {
            let s = BucketState { units, at: Timestamp(0) };
            let wait = s.take(burst, rate, Timestamp(0)).unwrap_err();
            let ms = wait.as_millis() as i64;
            prop_assert!(s.take(burst, rate, Timestamp(ms)).is_ok());
            prop_assert!(ms == 0 || s.take(burst, rate, Timestamp(ms - 1)).is_err());
        }
    }
}
