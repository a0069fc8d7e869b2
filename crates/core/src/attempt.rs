//! Attempts (docs/routes.md, "Attempts") as pure rules: a task makes attempts, each one
//! deployment's provider call with its re-asks; a transient failure or an interruption
//! (a crashed worker, a lost lease) starts the next attempt while the task has tries
//! left ([`may_try_again`]), up to its [`MaxAttempts`]. Each attempt is charged what it
//! used, or its reservation when its usage is unknown ([`attempt_charge`]); a task's
//! settlement sums its attempts ([`settle_charged`]).

use crate::cost::{Charge, Prices, Reservation};
use crate::error::{ErrorCode, InvalidInput};
use crate::task::{TaskError, Usage};
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// How many attempts a task may make: 1 to [`MaxAttempts::LIMIT`]. `1` is today's
/// at-most-once behaviour (the choice for calls with side effects): a task whose only
/// attempt was interrupted or failed transiently fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct MaxAttempts(u32);

impl MaxAttempts {
    /// One attempt: at most once.
    pub const ONE: MaxAttempts = MaxAttempts(1);
    /// The default when neither the model nor the app sets one.
    pub const DEFAULT: MaxAttempts = MaxAttempts(3);
    /// The most attempts a task may make.
    pub const LIMIT: u32 = 20;

    /// `n` attempts, refused unless `1..=20`.
    pub fn new(n: u32) -> Result<MaxAttempts, InvalidInput> {
        if (1..=Self::LIMIT).contains(&n) {
            Ok(MaxAttempts(n))
        } else {
            Err(InvalidInput::field(
                "max_attempts",
                format!("must be from 1 to {}, got {n}", Self::LIMIT),
            ))
        }
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0
    }
}

impl Default for MaxAttempts {
    fn default() -> Self {
        MaxAttempts::DEFAULT
    }
}

impl TryFrom<u32> for MaxAttempts {
    type Error = InvalidInput;
    fn try_from(n: u32) -> Result<Self, Self::Error> {
        MaxAttempts::new(n)
    }
}

impl From<MaxAttempts> for u32 {
    fn from(m: MaxAttempts) -> u32 {
        m.0
    }
}

/// A task's attempt limit from its model's and its app's settings: the smaller of those
/// set, [`MaxAttempts::DEFAULT`] when neither is.
pub fn max_attempts(model: Option<MaxAttempts>, app: Option<MaxAttempts>) -> MaxAttempts {
    match (model, app) {
        (Some(m), Some(a)) => m.min(a),
        (Some(one), None) | (None, Some(one)) => one,
        (None, None) => MaxAttempts::DEFAULT,
    }
}

/// Whether a task that has made `made` attempts may make another.
pub fn may_try_again(made: u32, max: MaxAttempts) -> bool {
    made < max.get()
}

/// The wait before attempt `next` (2, 3, …) that follows a transient failure in the same
/// execution: 200 ms doubling, at most 5 s (the provider's own retries already waited).
pub fn retry_backoff(next: u32) -> Duration {
    let doublings = next.saturating_sub(2).min(5);
    Duration::from_millis(200 * (1u64 << doublings)).min(Duration::from_secs(5))
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// Not ended yet: the call is in flight.
    Running,
    /// A valid output.
    Succeeded,
    /// A transient provider failure (rate limit, 5xx, timeout, dropped connection after
    /// the provider's own retries): the next attempt may follow.
    Unavailable,
    /// A failure that another attempt would not mend (bad request, invalid outputs after
    /// every re-ask, an output too large).
    Failed,
    /// Its worker crashed, lost its lease or shut down mid-call.
    Interrupted,
    /// The task was canceled, deleted or expired during the attempt.
    Canceled,
    /// Its reservation did not fit the budget: no call was made.
    Refused,
}

impl AttemptOutcome {
    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptOutcome::Running => "running",
            AttemptOutcome::Succeeded => "succeeded",
            AttemptOutcome::Unavailable => "unavailable",
            AttemptOutcome::Failed => "failed",
            AttemptOutcome::Interrupted => "interrupted",
            AttemptOutcome::Canceled => "canceled",
            AttemptOutcome::Refused => "refused",
        }
    }

    /// Parses the stable string form.
    pub fn parse(s: &str) -> Option<AttemptOutcome> {
        [
            AttemptOutcome::Running,
            AttemptOutcome::Succeeded,
            AttemptOutcome::Unavailable,
            AttemptOutcome::Failed,
            AttemptOutcome::Interrupted,
            AttemptOutcome::Canceled,
            AttemptOutcome::Refused,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }

    /// The outcome of an attempt that ended the task with `code` (the task fails or
    /// stops with it).
    pub fn of_error(code: ErrorCode) -> AttemptOutcome {
        match code {
            ErrorCode::Interrupted => AttemptOutcome::Interrupted,
            ErrorCode::Canceled => AttemptOutcome::Canceled,
            ErrorCode::SpendBudget => AttemptOutcome::Refused,
            _ => AttemptOutcome::Failed,
        }
    }
}

/// One recorded attempt of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub n: u32,
    /// The deployment it went to (`provider/model`).
    pub deployment: String,
    /// When it started.
    pub started_at: Timestamp,
    /// When it ended (`None` while running).
    pub ended_at: Option<Timestamp>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// What its calls used, when the provider reported it.
    pub usage: Option<Usage>,
    /// What it reserved: nano-dollars and model tokens (its re-asks included).
    pub reserved: Charged,
    /// What it is charged once ended ([`attempt_charge`]); while running, its
    /// reservation.
    pub charged: Charged,
    /// Its error, when it did not succeed.
    pub error: Option<TaskError>,
}

/// Nano-dollars and model tokens charged (or reserved).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Charged {
    /// Nano-dollars.
    pub nano_usd: i64,
    /// Model tokens.
    pub tokens: u64,
}

impl Charged {
    /// What a reservation holds.
    pub fn of_reservation(r: &Reservation) -> Charged {
        Charged {
            nano_usd: r.nano_usd,
            tokens: r.tokens,
        }
    }

    /// The sum.
    pub fn plus(self, other: Charged) -> Charged {
        Charged {
            nano_usd: self.nano_usd.saturating_add(other.nano_usd),
            tokens: self.tokens.saturating_add(other.tokens),
        }
    }
}

/// What one ended attempt is charged: its reported usage at its deployment's `prices`
/// (nothing known for an unpriced deployment), or, when its usage is unknown (a crash,
/// a dropped call, an error without usage), its whole reservation: the provider may
/// have billed it, so never less is assumed.
pub fn attempt_charge(prices: Option<Prices>, usage: Option<&Usage>, reserved: Charged) -> Charged {
    match usage {
        Some(u) => Charged {
            nano_usd: prices.map_or(0, |p| p.cost_nano(u)),
            tokens: u.input_tokens.saturating_add(u.output_tokens),
        },
        None => reserved,
    }
}

/// Settlement of a task that made attempts: its reservation (every attempt's, summed)
/// is replaced by the sum of what its attempts are charged (`charged`, each from
/// [`attempt_charge`], a running one at its reservation). Above the reservation is
/// overrun; reserved tokens not charged go back to the token bucket when admission took
/// them from it. A task without attempts settles by [`crate::cost::settle`].
pub fn settle_charged(reservation: &Reservation, charged: Charged) -> Charge {
    let (overrun_nano, overrun_tokens) = if reservation.bounded {
        (
            (charged.nano_usd - reservation.nano_usd).max(0),
            charged.tokens.saturating_sub(reservation.tokens),
        )
    } else {
        (0, 0)
    };
    Charge {
        nano_usd: charged.nano_usd,
        tokens: charged.tokens,
        overrun_nano,
        overrun_tokens,
        refund_tokens: if reservation.from_token_bucket {
            reservation.tokens.saturating_sub(charged.tokens)
        } else {
            0
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn prices() -> Prices {
        Prices {
            input: 1_000,
            output: 2_000,
            cached_input: 500,
            cache_write_input: 1_250,
        }
    }

    #[test]
    fn the_limit_is_the_smaller_of_model_and_app_and_three_by_default() {
        let n = |v| MaxAttempts::new(v).unwrap();
        assert_eq!(max_attempts(None, None), n(3));
        assert_eq!(max_attempts(Some(n(5)), None), n(5));
        assert_eq!(max_attempts(None, Some(n(2))), n(2));
        assert_eq!(max_attempts(Some(n(5)), Some(n(2))), n(2));
        assert_eq!(max_attempts(Some(n(1)), Some(n(20))), n(1));
        assert!(MaxAttempts::new(0).is_err());
        assert!(MaxAttempts::new(21).is_err());
        assert!(serde_json::from_str::<MaxAttempts>("0").is_err());
        assert_eq!(serde_json::from_str::<MaxAttempts>("4").unwrap(), n(4));
    }

    #[test]
    fn one_attempt_never_tries_again() {
        assert!(may_try_again(0, MaxAttempts::ONE));
        assert!(!may_try_again(1, MaxAttempts::ONE));
        assert!(may_try_again(2, MaxAttempts::DEFAULT));
        assert!(!may_try_again(3, MaxAttempts::DEFAULT));
    }

    #[test]
    fn backoff_doubles_and_is_capped() {
        assert_eq!(retry_backoff(2), Duration::from_millis(200));
        assert_eq!(retry_backoff(3), Duration::from_millis(400));
        assert_eq!(
            retry_backoff(20),
            Duration::from_millis(6_400).min(Duration::from_secs(5))
        );
    }

    #[test]
    fn an_attempt_without_usage_is_charged_its_reservation() {
        let reserved = Charged {
            nano_usd: 700,
            tokens: 90,
        };
        assert_eq!(attempt_charge(Some(prices()), None, reserved), reserved);
        let used = Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Usage::default()
        };
        assert_eq!(
            attempt_charge(Some(prices()), Some(&used), reserved),
            Charged {
                nano_usd: 20,
                tokens: 15
            }
        );
        assert_eq!(attempt_charge(None, Some(&used), reserved).nano_usd, 0);
    }

    #[test]
    fn outcomes_round_trip() {
        for o in [
            AttemptOutcome::Running,
            AttemptOutcome::Succeeded,
            AttemptOutcome::Unavailable,
            AttemptOutcome::Failed,
            AttemptOutcome::Interrupted,
            AttemptOutcome::Canceled,
            AttemptOutcome::Refused,
        ] {
            assert_eq!(AttemptOutcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(AttemptOutcome::parse("nope"), None);
    }

    proptest! {
        /// The settlement charges exactly the attempts' sum; overrun is what exceeds the
        /// reservation; refunds never exceed what was reserved.
        #[test]
        fn settlement_charges_the_sum_of_the_attempts(
            reserved in proptest::collection::vec((0i64..1_000_000, 0u64..100_000), 1..6),
            used in proptest::collection::vec(proptest::option::of((0u64..50_000, 0u64..50_000)), 1..6),
            bucket in any::<bool>(),
        ) {
            let n = reserved.len().min(used.len());
            let mut total_reserved = Charged::default();
            let mut total_charged = Charged::default();
            for i in 0..n {
                let r = Charged { nano_usd: reserved[i].0, tokens: reserved[i].1 };
                let u = used[i].map(|(i, o)| Usage { input_tokens: i, output_tokens: o, ..Usage::default() });
                total_reserved = total_reserved.plus(r);
                total_charged = total_charged.plus(attempt_charge(Some(prices()), u.as_ref(), r));
            }
            let reservation = Reservation {
                tokens: total_reserved.tokens,
                nano_usd: total_reserved.nano_usd,
                prices: Some(prices()),
                bounded: true,
                from_token_bucket: bucket,
                limits: None,
            };
            let c = settle_charged(&reservation, total_charged);
            prop_assert_eq!(c.nano_usd, total_charged.nano_usd);
            prop_assert_eq!(c.tokens, total_charged.tokens);
            prop_assert_eq!(c.overrun_nano, (total_charged.nano_usd - total_reserved.nano_usd).max(0));
            prop_assert!(c.refund_tokens <= total_reserved.tokens);
            if !bucket { prop_assert_eq!(c.refund_tokens, 0); }
        }
    }
}
