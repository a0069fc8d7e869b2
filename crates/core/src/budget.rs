//! Budgets: the admission limits of a scoped task (SPEC §4, §10).

use crate::cost::CostLimits;
use crate::error::InvalidInput;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;

/// The six admission limits of SPEC §4 and the optional cost limits of SPEC §13 of a scoped task. Every field is a positive integer, so a
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
    /// SPEC §13: the optional money and model-token limits, checked after the six above.
    #[serde(default, skip_serializing_if = "cost_limits_unset")]
    pub cost: CostLimits,
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
}
