//! docs/conformance.md#priority dispatch arithmetic: task priority and its ageing, scope weights, and the
//! stride schedule that shares claims across (app, scope) queues. Pure functions; the
//! store turns them into SQL and the engine's provider pace calls [`pace_cost_us`].
//!
//! # The order a claim follows
//!
//! - **Across scopes: stride scheduling.** Every (app, scope) with queued tasks is a
//!   queue with a virtual time, its `pass`. Claiming `n` tasks from a queue of weight `w`
//!   advances its pass by `n × stride(w)` where `stride(w) = PASS_SCALE / w`; a claim
//!   serves the queues with the smallest pass first ([`allocate_claims`]). Over a long
//!   backlog, queues are served in proportion to their weights. A queue that becomes
//!   active (new, or back from idle) starts at [`join_credit`]: at most
//!   [`JOIN_CREDIT_TASKS`] of its own tasks behind the *floor* (the least standing of
//!   the active queues, a queue holding joining credit standing at the floor it found),
//!   no earlier than one stride after its app's furthest fresh queue (not claimed from
//!   since it joined), and never behind the pass it left with. So it is served in the
//!   next claim batch whatever the other queues' backlogs, a small burst gets ahead of a
//!   long backlog (the way a scheduler's sleeper credit favours interactive work), and
//!   an idle queue banks no more than that one burst however long it was idle. Joining
//!   queues never lower the floor and an app's new queues line up behind each other, so
//!   no queue is ever more than one burst behind the floor and a flood of new queues
//!   gets one burst ahead of the others in all, not one each (docs/engine.md,
//!   "Dispatch order").
//! - **Within a scope: priority, then age, with ageing.** A task's static dispatch key is
//!   `created_at − (priority − DEFAULT) × ageing_step` ([`dispatch_key`]); a scope's
//!   tasks start in key order. One priority level is worth `ageing_step` of waiting, so a
//!   task of the lowest priority waits at most `(MAX − MIN) × ageing_step` behind newer
//!   work of the highest priority: low priority is never starved.

use crate::error::InvalidInput;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::num::NonZeroU32;
use std::time::Duration;

/// A task's priority (docs/conformance.md#priority): an integer from [`Priority::MIN`] to [`Priority::MAX`],
/// higher starts first within its scope; [`Priority::DEFAULT`] when a request names none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Priority(u8);

impl Priority {
    /// The lowest priority.
    pub const MIN: Priority = Priority(0);
    /// The highest priority.
    pub const MAX: Priority = Priority(9);
    /// The priority of a task that names none.
    pub const DEFAULT: Priority = Priority(5);

    /// A priority from a request's number, naming the field `priority` when it is out of
    /// range.
    pub fn new(value: i64) -> Result<Priority, InvalidInput> {
        if (i64::from(Self::MIN.0)..=i64::from(Self::MAX.0)).contains(&value) {
            Ok(Priority(value as u8))
        } else {
            Err(InvalidInput::field(
                "priority",
                format!(
                    "must be an integer from {} to {}, got {value}",
                    Self::MIN.0,
                    Self::MAX.0
                ),
            ))
        }
    }

    /// The number.
    pub fn get(self) -> u8 {
        self.0
    }
}

impl Default for Priority {
    fn default() -> Self {
        Priority::DEFAULT
    }
}

impl TryFrom<i64> for Priority {
    type Error = InvalidInput;
    fn try_from(value: i64) -> Result<Priority, InvalidInput> {
        Priority::new(value)
    }
}

impl From<Priority> for i64 {
    fn from(p: Priority) -> i64 {
        i64::from(p.0)
    }
}

/// A scope's share of claims relative to other scopes (docs/conformance.md#fair-share): the `weight` of its
/// budget policy, from 1 (the default) to [`Weight::MAX`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "i64", into = "i64")]
pub struct Weight(NonZeroU32);

impl Weight {
    /// The largest weight (so that a stride stays a whole number of pass units).
    pub const MAX: u32 = 1000;

    /// A weight, naming the field `weight` when it is not an integer from 1 to
    /// [`Weight::MAX`].
    pub fn new(value: i64) -> Result<Weight, InvalidInput> {
        u32::try_from(value)
            .ok()
            .filter(|v| *v <= Self::MAX)
            .and_then(NonZeroU32::new)
            .map(Weight)
            .ok_or_else(|| {
                InvalidInput::field(
                    "weight",
                    format!("must be an integer from 1 to {}, got {value}", Self::MAX),
                )
            })
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

impl Default for Weight {
    fn default() -> Self {
        Weight(NonZeroU32::MIN)
    }
}

impl TryFrom<i64> for Weight {
    type Error = InvalidInput;
    fn try_from(value: i64) -> Result<Weight, InvalidInput> {
        Weight::new(value)
    }
}

impl From<Weight> for i64 {
    fn from(w: Weight) -> i64 {
        i64::from(w.get())
    }
}

/// Default value of one priority level in waiting time (docs/conformance.md#priority ageing).
pub const DEFAULT_AGEING_STEP: Duration = Duration::from_secs(60);

/// How a new task is dispatched (docs/conformance.md#priority): its priority, its scope's weight (from the
/// budget policy) and what one priority level is worth in waiting time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatch {
    /// Priority within its scope.
    pub priority: Priority,
    /// Its scope's weight against other scopes.
    pub weight: Weight,
    /// What one priority level is worth in waiting time.
    pub ageing_step: Duration,
}

impl Default for Dispatch {
    fn default() -> Self {
        Dispatch {
            priority: Priority::DEFAULT,
            weight: Weight::default(),
            ageing_step: DEFAULT_AGEING_STEP,
        }
    }
}

impl Dispatch {
    /// The task's static dispatch key for a task created at `created_at`
    /// ([`dispatch_key`]).
    pub fn key(&self, created_at: Timestamp) -> i64 {
        dispatch_key(created_at, self.priority, self.ageing_step)
    }
}

/// docs/conformance.md#dispatch: the within-scope start order of a task, smallest first:
/// `created_at − (priority − DEFAULT) × ageing_step` in milliseconds. A default-priority
/// task's key is its creation time; each level above the default moves it one ageing step
/// earlier, each level below one step later. Saturates instead of overflowing.
pub fn dispatch_key(created_at: Timestamp, priority: Priority, ageing_step: Duration) -> i64 {
    let step = i64::try_from(ageing_step.as_millis()).unwrap_or(i64::MAX);
    let levels = i64::from(priority.0) - i64::from(Priority::DEFAULT.0);
    created_at.0.saturating_sub(levels.saturating_mul(step))
}

/// Pass units one claim costs a queue of weight 1 (docs/conformance.md#fair-share stride scheduling).
pub const PASS_SCALE: i64 = 1_000_000;

/// docs/conformance.md#fair-share: how far one claimed task advances the pass of a queue of this weight.
pub fn stride(weight: Weight) -> i64 {
    PASS_SCALE / i64::from(weight.get())
}

/// How many of its own tasks a queue that becomes active may start ahead of the active
/// queues (docs/conformance.md#fair-share): the most an idle queue ever banks ([`join_credit`]).
pub const JOIN_CREDIT_TASKS: u32 = 100;

/// docs/conformance.md#fair-share: how far below the floor (the least standing of the active queues) a queue
/// of this weight that becomes active may start: [`JOIN_CREDIT_TASKS`] of its strides.
/// The store (one SQL statement for both backends) starts a joining queue at
/// `max(its own last pass, floor − this, its app's furthest fresh pass + stride)`; with
/// no queue active, at the greatest pass of all (0 for the first queue ever).
pub fn join_credit(weight: Weight) -> i64 {
    stride(weight).saturating_mul(i64::from(JOIN_CREDIT_TASKS))
}

/// What a claim knows of one active queue: its virtual time and weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueShare {
    /// The queue's pass (virtual time).
    pub pass: i64,
    /// Its weight.
    pub weight: Weight,
}

/// docs/conformance.md#fair-share: how many of `n` claim slots go to each queue, in the order given: stride
/// scheduling run forward `n` steps (each step serves the queue with the smallest
/// `pass + taken × stride`, ties to the earlier queue). Sums to `n` whenever `queues` is
/// not empty.
pub fn allocate_claims(queues: &[QueueShare], n: u32) -> Vec<u32> {
    let mut taken = vec![0u32; queues.len()];
    if queues.is_empty() {
        return taken;
    }
    let mut next: Vec<i64> = queues.iter().map(|q| q.pass).collect();
    for _ in 0..n {
        let (best, _) = next
            .iter()
            .enumerate()
            .min_by_key(|(i, pass)| (**pass, *i))
            .unwrap_or((0, &0));
        taken[best] += 1;
        next[best] = next[best].saturating_add(stride(queues[best].weight));
    }
    taken
}

/// docs/conformance.md#provider-pace provider pace: how long, in microseconds, `amount` (calls or tokens) holds
/// a schedule that allows `per_window` of them per `window` (GCRA without burst: each
/// call moves the schedule on by this much, so no window ever holds more than the limit
/// plus one call). Rounded up, so the pace is never exceeded by rounding.
pub fn pace_cost_us(amount: u64, per_window: NonZeroU32, window: Duration) -> i64 {
    let window_us = window.as_micros();
    let cost = (u128::from(amount) * window_us).div_ceil(u128::from(per_window.get()));
    i64::try_from(cost).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn w(n: i64) -> Weight {
        Weight::new(n).unwrap()
    }

    #[test]
    fn pace_costs_spread_a_window_evenly_rounding_up() {
        let minute = Duration::from_secs(60);
        let n = |v| NonZeroU32::new(v).unwrap();
        assert_eq!(pace_cost_us(1, n(60), minute), 1_000_000);
        assert_eq!(pace_cost_us(1, n(7), minute), 8_571_429);
        assert_eq!(pace_cost_us(500, n(1000), minute), 30_000_000);
    }

    #[test]
    fn priority_range_is_checked_naming_the_field() {
        assert_eq!(Priority::new(0).unwrap(), Priority::MIN);
        assert_eq!(Priority::new(9).unwrap(), Priority::MAX);
        let e = Priority::new(10).unwrap_err();
        assert!(e.to_string().contains("priority"), "{e}");
        assert!(Priority::new(-1).is_err());
        assert_eq!(Priority::default().get(), 5);
    }

    #[test]
    fn weight_range_is_checked_naming_the_field() {
        assert!(Weight::new(0).unwrap_err().to_string().contains("weight"));
        assert!(Weight::new(1001).is_err());
        assert_eq!(Weight::default().get(), 1);
        assert_eq!(stride(w(1)), PASS_SCALE);
        assert_eq!(stride(w(4)), PASS_SCALE / 4);
    }

    #[test]
    fn higher_priority_goes_first_until_the_older_task_has_aged() {
        let step = Duration::from_secs(60);
        let old_low = dispatch_key(Timestamp(0), Priority::new(4).unwrap(), step);
        let new_high = dispatch_key(Timestamp(30_000), Priority::new(5).unwrap(), step);
        assert!(new_high < old_low, "30 s younger but one level higher");
        let newer_high = dispatch_key(Timestamp(61_000), Priority::new(5).unwrap(), step);
        assert!(old_low < newer_high, "more than one step younger: age wins");
        assert_eq!(
            dispatch_key(Timestamp(7), Priority::DEFAULT, step),
            7,
            "default priority: the key is the creation time"
        );
    }

    #[test]
    fn a_new_queue_at_the_minimum_pass_is_served_at_once() {
        let queues = [
            QueueShare {
                pass: 10 * PASS_SCALE,
                weight: w(1),
            },
            QueueShare {
                pass: 10 * PASS_SCALE,
                weight: w(1),
            },
        ];
        assert_eq!(allocate_claims(&queues, 4), vec![2, 2]);
        assert_eq!(allocate_claims(&[], 4), Vec::<u32>::new());
    }

    #[test]
    fn a_joining_queue_gets_one_burst_of_credit_and_never_its_idle_time() {
        let credit = join_credit(w(1));
        assert_eq!(credit, i64::from(JOIN_CREDIT_TASKS) * PASS_SCALE);
        assert_eq!(join_credit(w(4)), credit / 4, "the same number of tasks");
        let least = 1_000 * PASS_SCALE;
        // With the burst taken, the queue alternates with the others.
        let queues = [
            QueueShare {
                pass: least,
                weight: w(1),
            },
            QueueShare {
                pass: least - credit,
                weight: w(1),
            },
        ];
        let n = JOIN_CREDIT_TASKS + 10;
        assert_eq!(allocate_claims(&queues, n), vec![5, JOIN_CREDIT_TASKS + 5]);
    }

    proptest! {
        #[test]
        fn allocation_sums_to_n_and_follows_weights(
            weights in proptest::collection::vec(1i64..=10, 1..6),
            n in 0u32..200,
        ) {
            let queues: Vec<QueueShare> =
                weights.iter().map(|&x| QueueShare { pass: 0, weight: w(x) }).collect();
            let got = allocate_claims(&queues, n);
            prop_assert_eq!(got.iter().sum::<u32>(), n);
            // From equal passes, each queue's share stays within the number of queues of
            // n × w / Σw (stride scheduling's error bound), whatever n.
            let total: i64 = weights.iter().sum();
            let bound = weights.len() as f64;
            for (i, &x) in weights.iter().enumerate() {
                let ideal = f64::from(n) * x as f64 / total as f64;
                prop_assert!((f64::from(got[i]) - ideal).abs() <= bound,
                    "queue {} got {} of {} (ideal {})", i, got[i], n, ideal);
            }
        }
    }
}
