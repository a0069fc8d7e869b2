use super::*;
use proptest::prelude::*;

fn prices(input: f64, output: f64, cached: f64) -> Prices {
    Prices {
        input: price_from_usd_per_million("in", input).unwrap(),
        output: price_from_usd_per_million("out", output).unwrap(),
        cached_input: price_from_usd_per_million("cached", cached).unwrap(),
        cache_write_input: price_from_usd_per_million("in", input).unwrap(),
    }
}

fn usage(input: u64, output: u64, cached: Option<u64>) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cost_usd: None,
        cached_input_tokens: cached,
        cache_write_input_tokens: None,
        estimated: false,
        cost_nano_usd: None,
    }
}

#[test]
fn costs_are_exact_integers() {
    // gpt-4o-mini-like: $0.15 / $0.60 / $0.075 per million.
    let p = prices(0.15, 0.60, 0.075);
    assert_eq!(p.input, 150_000);
    // 1,000 input + 500 output = 150 µ$ + 300 µ$ = 450,000 n$.
    assert_eq!(p.cost_nano(&usage(1000, 500, None)), 450_000);
    // 400 of the input cached: 600 × 0.15 + 400 × 0.075 + 500 × 0.6 µ$.
    assert_eq!(p.cost_nano(&usage(1000, 500, Some(400))), 420_000);
    // One token at $0.15/M is 0.15 µ$ = 150 n$; rounding is up, never down.
    assert_eq!(p.cost_nano(&usage(1, 0, None)), 150);
    let tiny = prices(0.000_001, 0.0, 0.0);
    assert_eq!(tiny.cost_nano(&usage(1, 0, None)), 1);
    assert!(price_from_usd_per_million("x", -1.0).is_err());
    assert!(price_from_usd_per_million("x", f64::NAN).is_err());
    assert!(usd_limit_from_f64("x", 0.0).is_err());
    assert_eq!(usd_limit_from_f64("x", 2.5).unwrap().get(), 2_500_000_000);
}

/// Anthropic-like prompt caching: reads at a tenth of the input price, writes at 1.25×;
/// both are parts of the input tokens, and the bound prices every input token at the
/// dearest of the three.
#[test]
fn cache_reads_and_writes_are_priced_separately() {
    // $3 in, $15 out, $0.30 cache read, $3.75 cache write per million.
    let p = Prices {
        cache_write_input: price_from_usd_per_million("w", 3.75).unwrap(),
        ..prices(3.0, 15.0, 0.30)
    };
    let u = Usage {
        cached_input_tokens: Some(2_000),
        cache_write_input_tokens: Some(1_000),
        ..usage(4_000, 100, None)
    };
    // 1,000 × 3 + 2,000 × 0.3 + 1,000 × 3.75 + 100 × 15 µ$ = 8,850 µ$.
    assert_eq!(p.cost_nano(&u), 8_850_000);
    // Counts beyond the input are read as all of it, cache reads first.
    let absurd = Usage {
        cached_input_tokens: Some(3_500),
        cache_write_input_tokens: Some(9_999),
        ..usage(4_000, 0, None)
    };
    assert_eq!(p.cost_nano(&absurd), 3_500 * 300 + 500 * 3_750);
    assert_eq!(p.bound_nano(1_000, 0), 3_750_000);
    assert!(p.cost_nano(&u) <= p.bound_nano(4_000, 100));
    // Prices stored before cache writes were priced read them at the input price.
    let old: Prices =
        serde_json::from_value(serde_json::json!({"input": 7, "output": 9, "cached_input": 1}))
            .unwrap();
    assert_eq!(old.cache_write_input, 7);
    let round: Prices = serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap();
    assert_eq!(round, p);
    // Usage adds up, cache counts included.
    let twice = u.plus(&usage(10, 1, Some(5)));
    assert_eq!(
        (
            twice.input_tokens,
            twice.cached_input_tokens,
            twice.cache_write_input_tokens
        ),
        (4_010, Some(2_005), Some(1_000))
    );
}

#[test]
fn the_reservation_covers_the_first_attempt_and_each_reask_is_added() {
    // The docs/budgets.md worked example.
    let bound = TokenBound {
        input_tokens: 1_200,
        reask_input_tokens: 300,
        output_tokens: 500,
        attempts: 3,
    };
    assert_eq!(bound.first_attempt(), 1_700);
    assert_eq!(bound.per_attempt(), 2_000);
    let p = prices(2.50, 10.00, 1.25);
    let r = reservation(Some(&bound), Some(p));
    // 1,200 × $2.50/M + 500 × $10/M = $0.003 + $0.005 = $0.008.
    assert_eq!((r.tokens, r.nano_usd), (1_700, 8_000_000));
    assert!(r.bounded);
    // A re-ask of 1,350 input tokens, counted as sent: $0.003375 + $0.005.
    let reask = attempt_reservation(1_350, 500, Some(p));
    assert_eq!((reask.tokens, reask.nano_usd), (1_850, 8_375_000));
    let both = r.plus(&reask);
    assert_eq!((both.tokens, both.nano_usd), (3_550, 16_375_000));
    assert_eq!(both.prices, Some(p));
    let unbounded = reservation(None, Some(p));
    assert!(!unbounded.bounded);
    assert_eq!(unbounded.nano_usd, 0);
}

#[test]
fn cost_checks_run_in_spec_order() {
    let limit = NonZeroU64::new(1_000).unwrap();
    let rate = TokenRate {
        tokens_per_minute: NonZeroU32::new(60).unwrap(),
        token_burst: NonZeroU32::new(100).unwrap(),
    };
    let all = CostLimits {
        scope_nano_per_24_hours: Some(limit),
        token_rate: Some(rate),
        app_nano_per_24_hours: Some(limit),
    };
    let now = Timestamp(10_000_000);
    let unbounded = Reservation::default();
    let snap = CostSnapshot {
        scope_window_nano: 900,
        token_bucket: Some(BucketState { units: 0, at: now }),
        app_window_nano: 900,
    };
    assert_eq!(
        decide_cost(&all, &unbounded, &snap, now).unwrap_err(),
        CostRejection::OutputBoundRequired
    );
    // Unbounded is fine when no cost limit applies.
    assert_eq!(
        decide_cost(&CostLimits::NONE, &unbounded, &snap, now),
        Ok(None)
    );
    let r = Reservation {
        tokens: 50,
        nano_usd: 200,
        prices: None,
        bounded: true,
        from_token_bucket: false,
        limits: None,
    };
    let err = decide_cost(&all, &r, &snap, now).unwrap_err();
    assert_eq!(err.code(), ErrorCode::SpendBudget);
    let snap = CostSnapshot {
        scope_window_nano: 800,
        ..snap
    };
    let err = decide_cost(&all, &r, &snap, now).unwrap_err();
    assert_eq!(err.code(), ErrorCode::TokenRateLimit);
    // 50 tokens at one a second: 50 s.
    assert_eq!(err.retry_after(), Some(Duration::from_secs(50)));
    let snap = CostSnapshot {
        token_bucket: None,
        ..snap
    };
    let bucket = decide_cost(&all, &r, &snap, now).unwrap().unwrap();
    assert_eq!(bucket.units, 50 * TOKEN_UNITS);
    assert!(decide_app_spend(&all, &r, 800).is_ok());
    assert_eq!(
        decide_app_spend(&all, &r, 801).unwrap_err().code(),
        ErrorCode::SpendBudget
    );
    // More than the burst can never be admitted: no retry time.
    let huge = Reservation { tokens: 101, ..r };
    let err = decide_cost(&all, &huge, &snap, now).unwrap_err();
    assert_eq!(err.retry_after(), None);
    assert!(err.to_string().contains("token_burst"), "{err}");
}

#[test]
fn spend_leaves_the_window_at_bucket_boundaries() {
    let limit = NonZeroU64::new(100).unwrap();
    let now = Timestamp(100 * SPEND_BUCKET_MS + 10);
    // 60 spent in hour 76 (the oldest counted at `now`), 40 in hour 99.
    let buckets = [(99, 40), (76, 60)];
    assert_eq!(window_first_bucket(now), 76);
    let wait = spend_retry_after(&buckets, 30, limit, now).unwrap();
    assert_eq!(
        wait.as_millis() as i64,
        77 * SPEND_BUCKET_MS + SPEND_WINDOW_MS - now.0
    );
    assert_eq!(spend_retry_after(&buckets, 101, limit, now), None);
}

#[test]
fn settlement_replaces_the_reservation() {
    let p = prices(1.0, 2.0, 0.5);
    let r = Reservation {
        tokens: 1_000,
        nano_usd: p.bound_nano(600, 400),
        prices: Some(p),
        bounded: true,
        from_token_bucket: true,
        limits: None,
    };
    let down = settle(&r, Some(&usage(300, 100, None)), true);
    assert_eq!(down.nano_usd, 500_000);
    assert_eq!(down.refund_tokens, 600);
    assert_eq!(down.overrun_nano, 0);
    let up = settle(&r, Some(&usage(900, 400, None)), true);
    assert_eq!(up.overrun_tokens, 300);
    assert_eq!(up.overrun_nano, up.nano_usd - r.nano_usd);
    assert!(up.overrun_nano > 0);
    // Unknown usage: a task that never ran costs nothing, a running one everything.
    assert_eq!(
        settle(&r, None, false),
        Charge {
            refund_tokens: 1_000,
            ..Charge::default()
        }
    );
    let unknown = settle(&r, None, true);
    assert_eq!(unknown.nano_usd, r.nano_usd);
    assert_eq!(unknown.refund_tokens, 0);
    // An unpriced model costs nothing in money.
    let unpriced = Reservation { prices: None, ..r };
    assert_eq!(
        settle(&unpriced, Some(&usage(10, 10, None)), true).nano_usd,
        0
    );
    assert_eq!(refund_units(0, 5, 3 * TOKEN_UNITS), 3 * TOKEN_UNITS);
    assert_eq!(
        refund_units(TOKEN_UNITS, 1, 3 * TOKEN_UNITS),
        2 * TOKEN_UNITS
    );
}

proptest! {
    /// Actual usage within the bound never costs more than the reservation.
    #[test]
    fn usage_within_the_bound_never_overruns(
        input in 0u64..100_000, reask in 0u64..5_000, output in 1u64..50_000, attempts in 1u32..5,
        pin in 0u64..100_000_000, pout in 0u64..100_000_000, pcached in 0u64..100_000_000,
        share in 0.0f64..=1.0, cached_share in 0.0f64..=1.0,
    ) {
        let bound = TokenBound { input_tokens: input, reask_input_tokens: reask, output_tokens: output, attempts };
        let p = Prices { input: pin, output: pout, cached_input: pcached, cache_write_input: pin };
        let r = Reservation { from_token_bucket: true, ..reservation(Some(&bound), Some(p)) };
        let used_in = (bound.input_tokens as f64 * share) as u64;
        let used_out = (bound.output_tokens as f64 * share) as u64;
        let cached = (used_in as f64 * cached_share) as u64;
        let c = settle(&r, Some(&usage(used_in, used_out, Some(cached))), true);
        prop_assert!(c.nano_usd <= r.nano_usd);
        prop_assert_eq!(c.overrun_nano, 0);
        prop_assert_eq!(c.overrun_tokens, 0);
        prop_assert_eq!(c.tokens + c.refund_tokens, r.tokens);
    }

    /// Admissions through `decide_cost` never put a window over its limit.
    #[test]
    fn admitted_spend_never_exceeds_the_limit(limit in 1u64..10_000, asks in proptest::collection::vec(0i64..3_000, 1..100)) {
        let limits = CostLimits { scope_nano_per_24_hours: NonZeroU64::new(limit), ..CostLimits::NONE };
        let mut window = 0i64;
        for nano in asks {
            let r = Reservation { tokens: 1, nano_usd: nano, prices: None, bounded: true, from_token_bucket: false, limits: None };
            let snap = CostSnapshot { scope_window_nano: window, ..CostSnapshot::default() };
            if decide_cost(&limits, &r, &snap, Timestamp(0)).is_ok() { window += nano; }
            prop_assert!(window as u64 <= limit);
        }
    }
}

#[test]
fn a_route_reserves_its_dearest_deployment() {
    let cheap = Prices {
        input: 1_000,
        output: 2_000,
        cached_input: 1_000,
        cache_write_input: 1_000,
    };
    let dear = Prices {
        input: 5_000,
        output: 10_000,
        cached_input: 5_000,
        cache_write_input: 5_000,
    };
    let a = attempt_reservation(1_000, 100, Some(cheap));
    let b = attempt_reservation(400, 100, Some(dear));
    let r = dearest(&[a, b]).unwrap();
    assert_eq!(r.nano_usd, b.nano_usd);
    assert_eq!(r.prices, Some(dear));
    assert_eq!(r.tokens, 1_100, "the most tokens of any deployment");
    assert!(r.bounded);
    let unbounded = reservation(None, Some(cheap));
    assert!(!dearest(&[a, unbounded]).unwrap().bounded);
    assert_eq!(dearest(&[]), None);
}
