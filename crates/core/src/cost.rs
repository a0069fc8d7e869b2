//! Money and tokens (docs/conformance.md#cost-reservation) as pure functions: prices, the reservation of a task's
//! worst case, the ordered cost checks of admission, the sliding 24 h spend window over
//! hourly buckets, and settlement. Both store backends gather a [`CostSnapshot`] under
//! their locks and call [`decide_cost`]; settlement is [`settle`]; there is no second copy.
//!
//! Money is integer **nano-dollars** (10⁻⁹ USD) everywhere it is added up, and prices are
//! integer **pico-dollars per token** (= micro-dollars per million tokens), so sums are
//! exact; `f64` appears only at the edges (configuration in, display out).
//!
//! ## The spend window (docs/conformance.md#cost-exact "Exact", docs/conformance.md#constant-admission "O(1)")
//!
//! Spend is kept per (app, scope) and per app in buckets of [`SPEND_BUCKET_MS`] (one
//! hour), keyed by the hour of the task's **admission**. The window at `now` is read as
//! the [`SPEND_WINDOW_BUCKETS`] buckets from the hour of `now − 24 h` to the hour of
//! `now`: at most 25 rows whatever the number of reservations, and a superset of the true
//! 24 h window (the oldest partial hour counts whole), so "settled + reserved never
//! exceeds the limit in any 24 h window" holds, conservatively: spend leaves the window
//! at most one hour later than it strictly would.

use crate::admission::{BucketState, TOKEN_UNITS};
use crate::error::{ErrorCode, InvalidInput};
use crate::task::Usage;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;

/// Nano-dollars in one US dollar.
pub const NANO_PER_USD: i64 = 1_000_000_000;

/// Width of one spend bucket: one hour.
pub const SPEND_BUCKET_MS: i64 = 3_600_000;

/// The 24 h window in milliseconds.
pub const SPEND_WINDOW_MS: i64 = 24 * SPEND_BUCKET_MS;

/// Buckets a window reads: the hour of `now − 24 h` through the hour of `now`.
pub const SPEND_WINDOW_BUCKETS: i64 = 25;

/// Stripes of the per-app spend buckets: admissions of different scopes of one app add
/// to different rows (stripe = a hash of the scope), so the app-wide sum is never one
/// hot row.
pub const APP_SPEND_STRIPES: i64 = 8;

/// The spend bucket (hour number) of an instant.
pub fn spend_bucket(at: Timestamp) -> i64 {
    at.0.div_euclid(SPEND_BUCKET_MS)
}

/// The oldest bucket counted in the window at `now` (see the module docs).
pub fn window_first_bucket(now: Timestamp) -> i64 {
    spend_bucket(Timestamp(now.0 - SPEND_WINDOW_MS))
}

/// The app spend stripe of a scope (docs/conformance.md#money-and-tokens: the app-wide sum without one hot row).
pub fn app_spend_stripe(scope: &str) -> i64 {
    let h = scope
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    (h % APP_SPEND_STRIPES as u64) as i64
}

/// A model's prices in pico-dollars per token (= micro-dollars per million tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "StoredPrices")]
pub struct Prices {
    /// Per input token neither read from nor written to the provider's prompt cache.
    pub input: u64,
    /// Per output token.
    pub output: u64,
    /// Per cached input token (read from the provider's prompt cache).
    pub cached_input: u64,
    /// Per input token written to the provider's prompt cache (Anthropic's
    /// `cache_creation_input_tokens`). Prices stored before this field existed read it as
    /// the input price.
    pub cache_write_input: u64,
}

/// [`Prices`] as stored, before `cache_write_input` was always written.
#[derive(Deserialize)]
struct StoredPrices {
    input: u64,
    output: u64,
    cached_input: u64,
    #[serde(default)]
    cache_write_input: Option<u64>,
}

impl From<StoredPrices> for Prices {
    fn from(p: StoredPrices) -> Prices {
        Prices {
            input: p.input,
            output: p.output,
            cached_input: p.cached_input,
            cache_write_input: p.cache_write_input.unwrap_or(p.input),
        }
    }
}

/// USD per million tokens → pico-dollars per token, rounded to the nearest micro-dollar
/// per million; negative, non-finite or absurd (≥ $1,000,000 per million) prices are
/// refused, naming `field`.
pub fn price_from_usd_per_million(field: &str, usd: f64) -> Result<u64, InvalidInput> {
    if !usd.is_finite() || !(0.0..1_000_000.0).contains(&usd) {
        return Err(InvalidInput::field(
            field,
            format!("must be a price in USD per million tokens from 0 to 1000000, got {usd}"),
        ));
    }
    Ok((usd * 1_000_000.0).round() as u64)
}

/// A USD limit → nano-dollars, rounded down (a limit is never loosened by rounding);
/// refused unless it is a positive finite number of at least one nano-dollar.
pub fn usd_limit_from_f64(field: &str, usd: f64) -> Result<NonZeroU64, InvalidInput> {
    let ok = usd.is_finite() && usd > 0.0 && usd < 9.0e9;
    ok.then(|| NonZeroU64::new((usd * NANO_PER_USD as f64).floor() as u64))
        .flatten()
        .ok_or_else(|| {
            InvalidInput::field(
                field,
                format!("must be a positive number of US dollars below 9e9, got {usd}"),
            )
        })
}

/// Nano-dollars as US dollars, for display.
pub fn nano_to_usd(nano: i64) -> f64 {
    nano as f64 / NANO_PER_USD as f64
}

/// `ceil(a / b)` for non-negative `a` and positive `b`, in 128 bits.
fn div_ceil(a: u128, b: u128) -> u128 {
    a.div_ceil(b)
}

impl Prices {
    /// What `usage` cost, in nano-dollars, rounded up: the input tokens read from the
    /// prompt cache at the cached price, those written to it at the cache-write price, the
    /// rest of the input at the input price, the output tokens at the output price
    /// (docs/budgets.md, "Prices"). Cache counts are parts of `input_tokens`: a provider
    /// reporting more is read as all of the input (cache reads first).
    pub fn cost_nano(&self, usage: &Usage) -> i64 {
        let cached = usage
            .cached_input_tokens
            .unwrap_or(0)
            .min(usage.input_tokens);
        let written = usage
            .cache_write_input_tokens
            .unwrap_or(0)
            .min(usage.input_tokens - cached);
        let pico = u128::from(usage.input_tokens - cached - written) * u128::from(self.input)
            + u128::from(cached) * u128::from(self.cached_input)
            + u128::from(written) * u128::from(self.cache_write_input)
            + u128::from(usage.output_tokens) * u128::from(self.output);
        i64::try_from(div_ceil(pico, 1000)).unwrap_or(i64::MAX)
    }

    /// The worst-case cost of `input` and `output` tokens: every input token at the
    /// dearest of the input, cached-input and cache-write prices.
    pub fn bound_nano(&self, input: u64, output: u64) -> i64 {
        let per_input = self
            .input
            .max(self.cached_input)
            .max(self.cache_write_input);
        let pico = u128::from(input) * u128::from(per_input)
            + u128::from(output) * u128::from(self.output);
        i64::try_from(div_ceil(pico, 1000)).unwrap_or(i64::MAX)
    }
}

/// The token bound of one task (docs/conformance.md#cost-reservation "Reservation"): what every attempt may send and
/// receive. Re-asks send the first attempt's messages plus one correction message.
/// Admission reserves the first attempt only ([`reservation`]); each re-ask is reserved
/// when the worker makes it, counted exactly ([`attempt_reservation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBound {
    /// Input tokens of the first attempt: never below what the provider counts
    /// (messages, template overhead, labels, schema).
    pub input_tokens: u64,
    /// Extra input tokens of a re-ask (the correction message and its overhead).
    pub reask_input_tokens: u64,
    /// The output-token bound of one attempt.
    pub output_tokens: u64,
    /// How many attempts the task may make (1 + re-asks).
    pub attempts: u32,
}

impl TokenBound {
    /// Model tokens (input + output) of the first attempt: what admission takes from the
    /// token bucket.
    pub fn first_attempt(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// Model tokens of the dearest single attempt (a re-ask): what one provider call may
    /// use at most — the per-call figure for provider pacing (docs/conformance.md#dispatch).
    pub fn per_attempt(&self) -> u64 {
        let reask = if self.attempts > 1 {
            self.reask_input_tokens
        } else {
            0
        };
        self.input_tokens
            .saturating_add(reask)
            .saturating_add(self.output_tokens)
    }
}

/// What admission reserves for a task and keeps on its row until settlement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Reservation {
    /// Model tokens reserved (0 when the task has no output bound).
    pub tokens: u64,
    /// Nano-dollars reserved (0 when unpriced or unbounded).
    pub nano_usd: i64,
    /// The model's prices (`None`: the model has no prices; its cost is unknown, shown as
    /// `cost_usd: null`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<Prices>,
    /// Whether `tokens`/`nano_usd` are a real worst case (the task had an output bound).
    pub bounded: bool,
    /// Whether admission took `tokens` from the scope's token bucket (set by the store):
    /// only then does settlement give unused tokens back.
    #[serde(default)]
    pub from_token_bucket: bool,
    /// The cost limits the task was admitted under (set by the store at admission): a
    /// re-ask's reservation is checked against them (docs/budgets.md, "The reservation").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<CostLimits>,
}

impl Reservation {
    /// This reservation with one more attempt's added (`attempt` from
    /// [`attempt_reservation`]).
    pub fn plus(&self, attempt: &Reservation) -> Reservation {
        Reservation {
            tokens: self.tokens.saturating_add(attempt.tokens),
            nano_usd: self.nano_usd.saturating_add(attempt.nano_usd),
            ..*self
        }
    }
}

/// docs/conformance.md#cost-reservation "Reservation": the bound's tokens of the **first attempt**, priced at the
/// model's prices (input tokens at the dearer input price). Each re-ask is reserved when
/// the worker makes it ([`attempt_reservation`]). `None` bound: nothing can be reserved
/// (the task has no output-token bound); admission refuses such a task under any USD or
/// token limit ([`CostLimits::needs_bound`]).
pub fn reservation(bound: Option<&TokenBound>, prices: Option<Prices>) -> Reservation {
    match bound {
        None => Reservation {
            tokens: 0,
            nano_usd: 0,
            prices,
            bounded: false,
            from_token_bucket: false,
            limits: None,
        },
        Some(b) => attempt_reservation(b.input_tokens, b.output_tokens, prices),
    }
}

/// docs/routes.md: the reservation of a first attempt that may go to any of several
/// deployments (each one's reservation given): the dearest in nano-dollars (ties: in
/// tokens), holding the most tokens of any. Unbounded when any of them is (that
/// deployment's call has no worst case). `None` for an empty list.
pub fn dearest(reservations: &[Reservation]) -> Option<Reservation> {
    if let Some(unbounded) = reservations.iter().find(|r| !r.bounded) {
        return Some(*unbounded);
    }
    let most_tokens = reservations.iter().map(|r| r.tokens).max()?;
    reservations
        .iter()
        .max_by_key(|r| (r.nano_usd, r.tokens))
        .map(|r| Reservation {
            tokens: most_tokens,
            ..*r
        })
}

/// The reservation of one attempt that sends `input_tokens` (counted exactly, as sent)
/// and may receive `output_tokens`, at `prices` (docs/budgets.md, "The reservation").
pub fn attempt_reservation(
    input_tokens: u64,
    output_tokens: u64,
    prices: Option<Prices>,
) -> Reservation {
    Reservation {
        tokens: input_tokens.saturating_add(output_tokens),
        nano_usd: prices.map_or(0, |p| p.bound_nano(input_tokens, output_tokens)),
        prices,
        bounded: true,
        from_token_bucket: false,
        limits: None,
    }
}

/// The token-bucket limit of a policy: `token_burst` capacity, refilled at
/// `tokens_per_minute`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TokenRate {
    /// Refill in model tokens per minute.
    pub tokens_per_minute: NonZeroU32,
    /// Capacity in model tokens.
    pub token_burst: NonZeroU32,
}

/// The cost limits of a scoped task (docs/conformance.md#cost-limits), in addition to docs/conformance.md#admission's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub struct CostLimits {
    /// The scope's spend in 24 h, settled plus reserved, in nano-dollars (policy
    /// `usd_per_24_hours`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope_nano_per_24_hours: Option<NonZeroU64>,
    /// The scope's token bucket (policy `tokens_per_minute` + `token_burst`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_rate: Option<TokenRate>,
    /// The whole app's spend in 24 h, all scopes (app `usd_per_24_hours`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_nano_per_24_hours: Option<NonZeroU64>,
}

impl CostLimits {
    /// No cost limits.
    pub const NONE: CostLimits = CostLimits {
        scope_nano_per_24_hours: None,
        token_rate: None,
        app_nano_per_24_hours: None,
    };

    /// Whether a task under these limits needs an output-token bound (any USD or token
    /// limit is set).
    pub fn needs_bound(&self) -> bool {
        self.scope_nano_per_24_hours.is_some()
            || self.token_rate.is_some()
            || self.app_nano_per_24_hours.is_some()
    }
}

/// What the cost checks read under the scope's lock (and the app's, for the app limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CostSnapshot {
    /// The scope's settled + reserved nano-dollars in the window's buckets.
    pub scope_window_nano: i64,
    /// The scope's token bucket (`None`: never used).
    pub token_bucket: Option<BucketState>,
    /// The app's settled + reserved nano-dollars in the window's buckets (read only when
    /// the app has a limit).
    pub app_window_nano: i64,
}

/// Why the cost checks refused a task (docs/conformance.md#money-and-tokens, checked after docs/conformance.md#admission-order in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CostRejection {
    /// A USD or token limit applies and the task has no output-token bound.
    #[error(
        "the task falls under a USD or token limit but has no output-token bound: set \
         max_output_tokens on the request or on the model"
    )]
    OutputBoundRequired,
    /// The scope's `usd_per_24_hours` would be exceeded.
    #[error("the scope's spend limit (usd_per_24_hours = {}) would be exceeded: {} USD settled and reserved in the last 24 h, this task reserves {} USD", nano_to_usd(*limit_nano), nano_to_usd(*window_nano), nano_to_usd(*reserved_nano))]
    ScopeSpend {
        /// The limit, nano-dollars.
        limit_nano: i64,
        /// Settled + reserved in the window, nano-dollars.
        window_nano: i64,
        /// This task's reservation, nano-dollars.
        reserved_nano: i64,
        /// When enough spend leaves the window, where known.
        retry_after: Option<Duration>,
    },
    /// The scope's token bucket lacks the task's reserved tokens.
    #[error("token rate limit of the scope (token_burst/tokens_per_minute): this task reserves {needed} tokens{}", if retry_after.is_none() { ", more than token_burst: it can never be admitted under this policy" } else { "" })]
    TokenRate {
        /// Tokens the task reserves.
        needed: u64,
        /// When the bucket holds them (`None`: never, the reservation exceeds the burst).
        retry_after: Option<Duration>,
    },
    /// The app's `usd_per_24_hours` would be exceeded.
    #[error("the app's spend limit (usd_per_24_hours = {}) would be exceeded: {} USD settled and reserved in the last 24 h, this task reserves {} USD", nano_to_usd(*limit_nano), nano_to_usd(*window_nano), nano_to_usd(*reserved_nano))]
    AppSpend {
        /// The limit, nano-dollars.
        limit_nano: i64,
        /// Settled + reserved in the window, nano-dollars.
        window_nano: i64,
        /// This task's reservation, nano-dollars.
        reserved_nano: i64,
        /// When enough spend leaves the window, where known.
        retry_after: Option<Duration>,
    },
}

impl CostRejection {
    /// The docs/conformance.md#money-and-tokens error code.
    pub fn code(&self) -> ErrorCode {
        match self {
            CostRejection::OutputBoundRequired => ErrorCode::OutputBoundRequired,
            CostRejection::ScopeSpend { .. } | CostRejection::AppSpend { .. } => {
                ErrorCode::SpendBudget
            }
            CostRejection::TokenRate { .. } => ErrorCode::TokenRateLimit,
        }
    }

    /// When to retry, where known.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            CostRejection::OutputBoundRequired => None,
            CostRejection::ScopeSpend { retry_after, .. }
            | CostRejection::AppSpend { retry_after, .. }
            | CostRejection::TokenRate { retry_after, .. } => *retry_after,
        }
    }

    /// The same rejection with a retry time computed from the window's buckets.
    pub fn with_retry_after(self, wait: Option<Duration>) -> CostRejection {
        match self {
            CostRejection::ScopeSpend {
                limit_nano,
                window_nano,
                reserved_nano,
                ..
            } => CostRejection::ScopeSpend {
                limit_nano,
                window_nano,
                reserved_nano,
                retry_after: wait,
            },
            CostRejection::AppSpend {
                limit_nano,
                window_nano,
                reserved_nano,
                ..
            } => CostRejection::AppSpend {
                limit_nano,
                window_nano,
                reserved_nano,
                retry_after: wait,
            },
            other => other,
        }
    }
}

/// The scope part of docs/conformance.md#cost-reservation's checks, in order: output bound, scope spend, token
/// bucket. On admission returns the token bucket to store (`None` without a token rate).
/// The app's spend is checked by [`decide_app_spend`] once the app is locked.
pub fn decide_cost(
    limits: &CostLimits,
    reservation: &Reservation,
    snapshot: &CostSnapshot,
    now: Timestamp,
) -> Result<Option<BucketState>, CostRejection> {
    if limits.needs_bound() && !reservation.bounded {
        return Err(CostRejection::OutputBoundRequired);
    }
    if let Some(limit) = limits.scope_nano_per_24_hours
        && over_limit(snapshot.scope_window_nano, reservation.nano_usd, limit)
    {
        return Err(CostRejection::ScopeSpend {
            limit_nano: limit.get() as i64,
            window_nano: snapshot.scope_window_nano,
            reserved_nano: reservation.nano_usd,
            retry_after: None,
        });
    }
    let Some(rate) = limits.token_rate else {
        return Ok(None);
    };
    let burst = rate.token_burst.get();
    let per_minute = rate.tokens_per_minute.get();
    let state = snapshot
        .token_bucket
        .unwrap_or_else(|| BucketState::full(burst, now));
    state
        .take_n(burst, per_minute, reservation.tokens, now)
        .map(Some)
        .map_err(|retry_after| CostRejection::TokenRate {
            needed: reservation.tokens,
            retry_after,
        })
}

/// The last check of docs/conformance.md#money-and-tokens: the app's spend, read under the app's lock.
pub fn decide_app_spend(
    limits: &CostLimits,
    reservation: &Reservation,
    app_window_nano: i64,
) -> Result<(), CostRejection> {
    match limits.app_nano_per_24_hours {
        Some(limit) if over_limit(app_window_nano, reservation.nano_usd, limit) => {
            Err(CostRejection::AppSpend {
                limit_nano: limit.get() as i64,
                window_nano: app_window_nano,
                reserved_nano: reservation.nano_usd,
                retry_after: None,
            })
        }
        _ => Ok(()),
    }
}

fn over_limit(window: i64, reserved: i64, limit: NonZeroU64) -> bool {
    i128::from(window) + i128::from(reserved) > i128::from(limit.get())
}

/// When a window over `limit` has room for `reserved` again, from its buckets (`(bucket,
/// settled + reserved)`, any order): the first bucket boundary at which enough of the
/// oldest buckets have left the window. `None` when even an empty window could not hold
/// it. Spend settled below its reservation meanwhile may make room sooner.
pub fn spend_retry_after(
    buckets: &[(i64, i64)],
    reserved: i64,
    limit: NonZeroU64,
    now: Timestamp,
) -> Option<Duration> {
    if i128::from(reserved) > i128::from(limit.get()) {
        return None;
    }
    let mut sorted: Vec<(i64, i64)> = buckets.to_vec();
    sorted.sort_unstable();
    let mut total: i128 = sorted.iter().map(|(_, v)| i128::from(*v)).sum();
    for (bucket, amount) in sorted {
        total -= i128::from(amount);
        if total + i128::from(reserved) <= i128::from(limit.get()) {
            // Bucket `b` leaves the window when the hour of `now − 24 h` passes it.
            let leaves_at = (bucket + 1) * SPEND_BUCKET_MS + SPEND_WINDOW_MS;
            return Some(Duration::from_millis((leaves_at - now.0).max(0) as u64));
        }
    }
    None
}

/// What settling one task changes (docs/conformance.md#cost-settlement "Settlement").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Charge {
    /// What the task is charged, nano-dollars (replaces its reserved amount).
    pub nano_usd: i64,
    /// Model tokens it is charged.
    pub tokens: u64,
    /// Nano-dollars above the reservation (a provider reported more than the bound).
    pub overrun_nano: i64,
    /// Tokens above the reservation.
    pub overrun_tokens: u64,
    /// Reserved tokens not used, given back to the scope's token bucket.
    pub refund_tokens: u64,
}

/// docs/conformance.md#cost-settlement "Settlement": a task's reservation is replaced by what it actually cost.
/// `actual` is its usage summed over every attempt, charged at its exact
/// `cost_nano_usd` when the worker priced each call
/// at its deployment's prices, else at the reservation's; `None` means the usage is unknown:
/// a task that never started costs nothing, one that was running (canceled or
/// interrupted mid-call) is charged its whole reservation — the provider may have
/// billed the aborted call, so never less is assumed.
pub fn settle(reservation: &Reservation, actual: Option<&Usage>, started: bool) -> Charge {
    let (nano, tokens) = match actual {
        Some(u) => (
            u.cost_nano_usd
                .unwrap_or_else(|| reservation.prices.map_or(0, |p| p.cost_nano(u))),
            u.input_tokens.saturating_add(u.output_tokens),
        ),
        None if started => (reservation.nano_usd, reservation.tokens),
        None => (0, 0),
    };
    let (overrun_nano, overrun_tokens) = if reservation.bounded {
        (
            (nano - reservation.nano_usd).max(0),
            tokens.saturating_sub(reservation.tokens),
        )
    } else {
        (0, 0)
    };
    Charge {
        nano_usd: nano,
        tokens,
        overrun_nano,
        overrun_tokens,
        refund_tokens: if reservation.from_token_bucket {
            reservation.tokens.saturating_sub(tokens)
        } else {
            0
        },
    }
}

/// A token bucket's refund in units, capped at its capacity (what a settlement does to
/// the scope's token bucket: never above `token_burst`, never below what it held).
pub fn refund_units(units: i64, refund_tokens: u64, capacity_units: i64) -> i64 {
    let refund = i64::try_from(refund_tokens)
        .unwrap_or(i64::MAX)
        .saturating_mul(TOKEN_UNITS);
    units.saturating_add(refund).min(capacity_units).max(units)
}

#[cfg(test)]
mod tests;
