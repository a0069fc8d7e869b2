//! Budgets: the admission limits of a scoped task (docs/conformance.md#admission, docs/conformance.md#budget-policies).

use crate::cost::CostLimits;
use crate::error::InvalidInput;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

/// The six admission limits of docs/conformance.md#admission and the optional cost limits of docs/conformance.md#cost-limits of a scoped task. Every field is a positive integer, so a
/// budget of zero cannot be represented.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Budget {
    /// Distinct logical steps admitted for one source in the last 24 h.
    pub max_steps_per_source: NonZeroU32,
    /// Distinct sources admitted in the scope in the last 24 h.
    pub sources_per_24_hours: NonZeroU32,
    /// Scoped tasks of the scope that are queued or running.
    pub scope_concurrent: NonZeroU32,
    /// Scoped tasks of all apps and scopes that are queued or running (server-wide).
    pub global_concurrent: NonZeroU32,
    /// Token-bucket capacity per (app, scope).
    pub burst: NonZeroU32,
    /// Token-bucket refill, in tasks per minute.
    pub tasks_per_minute: NonZeroU32,
    /// docs/conformance.md#cost-limits: the optional money and model-token limits, checked after the six above.
    #[serde(default, skip_serializing_if = "cost_limits_unset")]
    pub cost: CostLimits,
    /// The app's share of `global_concurrent` (docs/budgets.md, "Each app's share of
    /// the global capacity"); `None`: the app may take any free global slot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_share: Option<GlobalShare>,
}

/// An app's share of the service's `global_concurrent` slots (docs/budgets.md, "Each
/// app's share of the global capacity"): `share` slots are the app's alone (no other
/// app can take them); the slots no app reserved (`global_concurrent − reserved`, where
/// `reserved` is the sum of every app's share) are lent to any app that has used up its
/// own, first come first served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GlobalShare {
    /// The app's own slots (`global_concurrent_share`).
    pub share: u32,
    /// The sum of every app's share (at most `global_concurrent`).
    pub reserved: u32,
}

/// An app's use of the global capacity as an admission reads it: its own active scoped
/// tasks, and how many slots all apps together hold beyond their shares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ShareUse {
    /// The app's queued or running scoped tasks.
    pub app_active: u64,
    /// `Σ max(0, active − share)` over every app: the lent slots in use.
    pub borrowed: u64,
}

/// Whether an app may take one more global slot (docs/budgets.md, "Each app's share of
/// the global capacity"): one of its own while it holds fewer than its share, otherwise
/// one of the unreserved slots while any is free. Every app keeps its share free of
/// other apps whatever they submit, and the service never holds more than
/// `global_concurrent`: `Σ max(active, share) ≤ reserved + borrowed ≤ global_concurrent`.
pub fn decide_global_share(
    share: &GlobalShare,
    global_concurrent: u32,
    used: ShareUse,
) -> Result<(), crate::AdmissionRejection> {
    if used.app_active < u64::from(share.share) {
        return Ok(());
    }
    let lendable = u64::from(global_concurrent.saturating_sub(share.reserved));
    if used.borrowed < lendable {
        return Ok(());
    }
    Err(crate::AdmissionRejection::AppCapacity {
        in_use: u32::try_from(used.app_active).unwrap_or(u32::MAX),
        share: share.share,
        lendable: u32::try_from(lendable).unwrap_or(u32::MAX),
    })
}

fn cost_limits_unset(c: &CostLimits) -> bool {
    *c == CostLimits::NONE
}

impl Budget {
    /// Builds a budget from raw numbers, naming the first field that is not a positive
    /// 32-bit integer.
    pub fn new(
        max_steps_per_source: i64,
        sources_per_24_hours: i64,
        scope_concurrent: i64,
        global_concurrent: i64,
        burst: i64,
        tasks_per_minute: i64,
    ) -> Result<Budget, InvalidInput> {
        Ok(Budget {
            max_steps_per_source: positive("max_steps_per_source", max_steps_per_source)?,
            sources_per_24_hours: positive("sources_per_24_hours", sources_per_24_hours)?,
            scope_concurrent: positive("scope_concurrent", scope_concurrent)?,
            global_concurrent: positive("global_concurrent", global_concurrent)?,
            burst: positive("burst", burst)?,
            tasks_per_minute: positive("tasks_per_minute", tasks_per_minute)?,
            cost: CostLimits::NONE,
            global_share: None,
        })
    }

    /// A budget that admits everything a test or benchmark throws at it.
    pub fn unlimited() -> Budget {
        let max = NonZeroU32::MAX;
        Budget {
            max_steps_per_source: max,
            sources_per_24_hours: max,
            scope_concurrent: max,
            global_concurrent: max,
            burst: max,
            tasks_per_minute: max,
            cost: CostLimits::NONE,
            global_share: None,
        }
    }
}

/// Checks that a budget number is a positive integer that fits in 32 bits.
pub fn positive(field: &str, value: i64) -> Result<NonZeroU32, InvalidInput> {
    u32::try_from(value)
        .ok()
        .and_then(NonZeroU32::new)
        .ok_or_else(|| {
            InvalidInput::field(
                field,
                format!("must be a positive integer below 2^32, got {value}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_numbers_must_be_positive() {
        assert!(Budget::new(1, 1, 1, 1, 1, 1).is_ok());
        let err = Budget::new(1, 1, 0, 1, 1, 1).unwrap_err();
        assert!(err.to_string().contains("scope_concurrent"), "{err}");
        assert!(Budget::new(1, 1, 1, 1, -3, 1).is_err());
        assert!(Budget::new(1, 1, 1, 1, 1, 1 << 40).is_err());
        assert!(serde_json::from_str::<Budget>(r#"{"max_steps_per_source":1.5,"sources_per_24_hours":1,"scope_concurrent":1,"global_concurrent":1,"burst":1,"tasks_per_minute":1}"#).is_err());
    }

    #[test]
    fn an_app_takes_its_own_slots_then_only_the_unreserved_ones() {
        // 10 slots, two apps with 3 each: 4 unreserved.
        let share = GlobalShare {
            share: 3,
            reserved: 6,
        };
        let used = |app_active, borrowed| ShareUse {
            app_active,
            borrowed,
        };
        assert!(
            decide_global_share(&share, 10, used(2, 4)).is_ok(),
            "its own"
        );
        assert!(decide_global_share(&share, 10, used(3, 3)).is_ok(), "lent");
        let refused = decide_global_share(&share, 10, used(7, 4)).unwrap_err();
        assert_eq!(
            refused,
            crate::AdmissionRejection::AppCapacity {
                in_use: 7,
                share: 3,
                lendable: 4
            }
        );
        let message = refused.to_string();
        assert!(
            message.contains("global_concurrent_share") && !message.contains("the service"),
            "{message}"
        );
        assert_eq!(refused.code(), crate::ErrorCode::Capacity);
    }
}
