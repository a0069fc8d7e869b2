//! docs/conformance.md#cost-settlement: money and tokens — reservations at admission, settlement at the end, the
//! spend and token limits, cache savings and the usage report.

use super::Backend;
use super::fixtures::*;
use std::num::{NonZeroU32, NonZeroU64};
use std::time::Duration;
use tollgate_core::cost::{CostLimits, TokenBound, TokenRate, reservation};
use tollgate_core::{
    Budget, CostRejection, ErrorCode, NewTask, Prices, Reservation, TaskStatus, Usage,
};
use tollgate_store::{SpendWindow, StoreError, SweepConfig};

/// $1 / $2 / $0.50 per million input / output / cached input tokens: 1,000 / 2,000 / 500
/// nano-dollars a token.
pub fn test_prices() -> Prices {
    Prices {
        input: 1_000_000,
        output: 2_000_000,
        cached_input: 500_000,
        cache_write_input: 1_000_000,
    }
}

/// The reservation of `input` + `output` tokens, one attempt, at [`test_prices`]:
/// `1,000 × input + 2,000 × output` nano-dollars.
pub fn reserve(input: u64, output: u64) -> Reservation {
    reservation(
        Some(&TokenBound {
            input_tokens: input,
            reask_input_tokens: 0,
            output_tokens: output,
            attempts: 1,
        }),
        Some(test_prices()),
    )
}

/// An unlimited docs/conformance.md#admission budget with the given cost limits (nano-dollars, tokens).
pub fn cost_budget(
    scope_nano: Option<u64>,
    tokens: Option<(u32, u32)>,
    app_nano: Option<u64>,
) -> Budget {
    Budget {
        cost: CostLimits {
            scope_nano_per_24_hours: scope_nano.and_then(NonZeroU64::new),
            token_rate: tokens.map(|(per_minute, burst)| TokenRate {
                tokens_per_minute: NonZeroU32::new(per_minute).expect("positive"),
                token_burst: NonZeroU32::new(burst).expect("positive"),
            }),
            app_nano_per_24_hours: app_nano.and_then(NonZeroU64::new),
        },
        ..Budget::unlimited()
    }
}

/// A scoped task of `source` under `budget` reserving `r`; the input names the key, so
/// every key is its own logical step (no cache hits between keys).
pub fn priced_task(
    app_name: &str,
    scope_name: &str,
    effect_key: &str,
    source_id: &str,
    budget: Budget,
    r: Reservation,
) -> NewTask {
    let mut t = with_input(
        new_scoped_task(app_name, scope_name, effect_key, source_id, budget),
        effect_key,
    );
    if let Some(scoped) = t.scope.as_mut() {
        scoped.reservation = r;
    }
    t
}

/// Usage of `input` + `output` tokens.
pub fn tokens(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cost_usd: None,
        cached_input_tokens: None,
        cache_write_input_tokens: None,
        estimated: false,
        cost_nano_usd: None,
    }
}

async fn scope_spend(
    s: &dyn tollgate_store::Store,
    app_name: &str,
    scope_name: &str,
) -> SpendWindow {
    s.spend(&app(app_name), Some(&scope(scope_name)))
        .await
        .expect("spend")
}

async fn app_spend(s: &dyn tollgate_store::Store, app_name: &str) -> SpendWindow {
    s.spend(&app(app_name), None).await.expect("spend")
}

async fn cost_rejection(s: &dyn tollgate_store::Store, new: NewTask) -> CostRejection {
    match s.create_task(new).await {
        Err(StoreError::Cost(c)) => c,
        other => panic!("expected a docs/conformance.md#money-and-tokens rejection, got {other:?}"),
    }
}

/// docs/conformance.md#cost-reservation "Reservation": admission reserves the task's worst case, keeps it on the
/// task, and the scope's and app's windows show it as reserved (not settled).
pub async fn admission_reserves_the_worst_case(b: &dyn Backend) {
    let s = b.open().await;
    let r = reserve(100, 50);
    assert_eq!(r.nano_usd, 200_000);
    let t = create_new(
        &*s,
        priced_task("acme", "s", "a", "doc", cost_budget(None, None, None), r),
    )
    .await;
    let stored = t
        .reservation
        .expect("an admitted task keeps its reservation");
    assert_eq!((stored.tokens, stored.nano_usd), (150, 200_000));
    let w = scope_spend(&*s, "acme", "s").await;
    assert_eq!((w.reserved_nano, w.settled_nano), (200_000, 0));
    assert_eq!((w.reserved_tokens, w.settled_tokens), (150, 0));
    let a = app_spend(&*s, "acme").await;
    assert_eq!(a.reserved_nano, 200_000);
    // Other scopes and apps see nothing of it.
    assert_eq!(scope_spend(&*s, "acme", "other").await.reserved_nano, 0);
    assert_eq!(app_spend(&*s, "globex").await.reserved_nano, 0);
    // An unscoped task is not admitted and reserves nothing.
    let u = create_new(&*s, new_app_task("acme", "s", "u")).await;
    assert_eq!(u.reservation, None);
}

/// docs/conformance.md#cost-settlement "Settlement": at the end the reservation is replaced by what the task cost
/// (down when it used less; up, recorded as overrun, when a provider reported more).
pub async fn settlement_replaces_the_reservation_up_and_down(b: &dyn Backend) {
    let s = b.open().await;
    let free = cost_budget(None, None, None);
    let w = worker("w");
    let down = create_new(
        &*s,
        priced_task("acme", "s", "down", "doc", free, reserve(100, 50)),
    )
    .await;
    claim(&*s, down.id, &w).await;
    let t = s
        .complete_task(down.id, &lease(&w, 1), spam(), tokens(40, 10))
        .await
        .expect("complete");
    assert!(t.applied);
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!(spent.reserved_nano, 0, "the reservation is gone");
    assert_eq!(spent.settled_nano, 40 * 1_000 + 10 * 2_000);
    assert_eq!((spent.reserved_tokens, spent.settled_tokens), (0, 50));
    assert_eq!(spent.overrun_nano, 0);

    let up = create_new(
        &*s,
        priced_task("acme", "s", "up", "doc", free, reserve(10, 5)),
    )
    .await;
    claim(&*s, up.id, &w).await;
    s.complete_task(up.id, &lease(&w, 1), spam(), tokens(30, 5))
        .await
        .expect("complete");
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!(spent.settled_nano, 60_000 + 30 * 1_000 + 5 * 2_000);
    assert_eq!(
        spent.overrun_nano, 20_000,
        "the excess is recorded, never dropped"
    );
    let a = app_spend(&*s, "acme").await;
    assert_eq!(
        (a.settled_nano, a.overrun_nano, a.reserved_nano),
        (spent.settled_nano, 20_000, 0)
    );
}

/// docs/conformance.md#money-and-tokens: the attempts of a task that fails or is canceled are charged too — what a
/// failure reports; the whole reservation when a running task ends with its usage
/// unknown (canceled or interrupted mid-call); nothing for a task that never started.
pub async fn failed_and_canceled_tasks_are_charged(b: &dyn Backend) {
    let s = b.open().await;
    let free = cost_budget(None, None, None);
    let w = worker("w");
    let failed = create_new(
        &*s,
        priced_task("acme", "f", "f", "doc", free, reserve(100, 50)),
    )
    .await;
    claim(&*s, failed.id, &w).await;
    let t = s
        .fail_task(
            failed.id,
            None,
            ErrorCode::InvalidModelOutput,
            "bad",
            Some(&tokens(70, 20)),
        )
        .await
        .expect("fail");
    assert!(t.applied);
    let task = t.task.expect("task");
    assert_eq!(
        task.usage,
        Some(tokens(70, 20)),
        "a failed task's usage is recorded"
    );
    assert_eq!(
        scope_spend(&*s, "acme", "f").await.settled_nano,
        70_000 + 40_000
    );

    let running = create_new(
        &*s,
        priced_task("acme", "c", "c1", "doc", free, reserve(100, 50)),
    )
    .await;
    claim(&*s, running.id, &w).await;
    cancel(&*s, &app("acme"), running.id).await;
    let queued = create_new(
        &*s,
        priced_task("acme", "c", "c2", "doc", free, reserve(100, 50)),
    )
    .await;
    cancel(&*s, &app("acme"), queued.id).await;
    let spent = scope_spend(&*s, "acme", "c").await;
    assert_eq!(spent.reserved_nano, 0);
    assert_eq!(
        spent.settled_nano, 200_000,
        "the running task is charged its reservation, the queued one nothing"
    );

    // Interrupted (no heartbeat): charged its reservation; queue timeout: nothing.
    let lost = create_new(
        &*s,
        priced_task("acme", "i", "i1", "doc", free, reserve(10, 10)),
    )
    .await;
    claim(&*s, lost.id, &w).await;
    let waiting = create_new(
        &*s,
        priced_task("acme", "i", "i2", "doc", free, reserve(10, 10)),
    )
    .await;
    b.clock().advance(hours(2));
    let config = SweepConfig {
        queue_timeout: Duration::from_secs(60),
        ..sweep_config()
    };
    sweep_all(&*s, &config).await;
    assert_eq!(
        get(&*s, &app("acme"), lost.id).await.status,
        TaskStatus::Failed
    );
    assert_eq!(
        get(&*s, &app("acme"), waiting.id).await.status,
        TaskStatus::Failed
    );
    let spent = scope_spend(&*s, "acme", "i").await;
    assert_eq!((spent.reserved_nano, spent.settled_nano), (0, 30_000));
}

/// docs/conformance.md#cost-reservation "Cache hits reserve and spend nothing; what they saved is reported."
pub async fn cache_hits_are_free_and_report_savings(b: &dyn Backend) {
    let s = b.open().await;
    let free = cost_budget(None, None, None);
    let w = worker("w");
    let mut first = new_scoped_task("acme", "s", "a", "doc", free);
    first.scope.as_mut().expect("scoped").reservation = reserve(100, 50);
    let first = create_new(&*s, first).await;
    claim(&*s, first.id, &w).await;
    s.complete_task(first.id, &lease(&w, 1), spam(), tokens(40, 10))
        .await
        .expect("complete");
    let mut again = new_scoped_task("acme", "s", "b", "doc", free);
    again.scope.as_mut().expect("scoped").reservation = reserve(100, 50);
    let hit = create(&*s, again).await;
    assert!(
        hit.task.cached(),
        "same source, revision and request: a cache hit"
    );
    assert_eq!(hit.task.reservation, None, "a cache hit reserves nothing");
    assert_eq!(
        hit.saved_nano, 60_000,
        "the answer tells what the hit saved"
    );
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!(spent.settled_nano, 60_000);
    assert_eq!(spent.reserved_nano, 0);
    assert_eq!(
        spent.saved_nano, 60_000,
        "the hit saved what the original cost"
    );
    assert_eq!(app_spend(&*s, "acme").await.saved_nano, 60_000);
}

/// docs/conformance.md#cost-settlement `usd_per_24_hours` (policy): settled + reserved spend of the scope never
/// exceeds the limit; `WORKFLOW_AI_SPEND_BUDGET` with the time when enough spend leaves
/// the window; other scopes are not affected; settling below the reservation makes room.
pub async fn scope_spend_limit_counts_settled_and_reserved(b: &dyn Backend) {
    let s = b.open().await;
    let limited = cost_budget(Some(500_000), None, None);
    let w = worker("w");
    let a = create_new(
        &*s,
        priced_task("acme", "s", "a", "doc", limited, reserve(100, 50)),
    )
    .await;
    create_new(
        &*s,
        priced_task("acme", "s", "b", "doc", limited, reserve(100, 50)),
    )
    .await;
    // 400,000 reserved: another 200,000 does not fit.
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s", "c", "doc", limited, reserve(100, 50)),
    )
    .await;
    assert_eq!(r.code(), ErrorCode::SpendBudget);
    assert_eq!(r.code().as_str(), "WORKFLOW_AI_SPEND_BUDGET");
    let wait = r.retry_after().expect("the window's buckets say when");
    assert!(wait > hours(24) && wait <= hours(25), "{wait:?}");
    assert!(r.to_string().contains("usd_per_24_hours"), "{r}");
    // Exactly up to the limit fits.
    create_new(
        &*s,
        priced_task("acme", "s", "d", "doc", limited, reserve(50, 25)),
    )
    .await;
    assert!(matches!(
        s.create_task(priced_task("acme", "s", "e", "doc", limited, reserve(1, 0)))
            .await,
        Err(StoreError::Cost(_))
    ));
    // Another scope has its own window.
    create_new(
        &*s,
        priced_task("acme", "s2", "a2", "doc", limited, reserve(100, 50)),
    )
    .await;
    // Settling below the reservation frees the difference.
    claim(&*s, a.id, &w).await;
    s.complete_task(a.id, &lease(&w, 1), spam(), tokens(0, 0))
        .await
        .expect("complete");
    create_new(
        &*s,
        priced_task("acme", "s", "c2", "doc", limited, reserve(100, 50)),
    )
    .await;
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!(spent.reserved_nano + spent.settled_nano, 500_000);
}

/// docs/conformance.md#cost-limits `tokens_per_minute` + `token_burst`: the scope's bucket in model tokens,
/// reserved at admission; `WORKFLOW_AI_TOKEN_RATE_LIMIT` with the time until enough
/// tokens are back; unused reserved tokens are given back at settlement; a reservation
/// above the burst is refused with no retry time.
pub async fn token_bucket_reserves_model_tokens(b: &dyn Backend) {
    let s = b.open().await;
    // 60 tokens a minute (one a second), 300 tokens of burst.
    let limited = cost_budget(None, Some((60, 300)), None);
    let w = worker("w");
    let a = create_new(
        &*s,
        priced_task("acme", "s", "a", "doc", limited, reserve(100, 100)),
    )
    .await;
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s", "b", "doc", limited, reserve(100, 50)),
    )
    .await;
    assert_eq!(r.code().as_str(), "WORKFLOW_AI_TOKEN_RATE_LIMIT");
    assert_eq!(
        r.retry_after(),
        Some(secs(50)),
        "150 needed, 100 left, one a second"
    );
    // Settling gives back what was not used: 200 reserved, 20 used.
    claim(&*s, a.id, &w).await;
    s.complete_task(a.id, &lease(&w, 1), spam(), tokens(10, 10))
        .await
        .expect("complete");
    create_new(
        &*s,
        priced_task("acme", "s", "b", "doc", limited, reserve(100, 50)),
    )
    .await;
    let window = scope_spend(&*s, "acme", "s").await;
    let bucket = window.token_bucket.expect("the scope's token bucket");
    assert_eq!(
        bucket.units / tollgate_core::admission::TOKEN_UNITS,
        300 - 20 - 150
    );
    // Time refills it.
    b.clock().advance(secs(20));
    create_new(
        &*s,
        priced_task("acme", "s", "c", "doc", limited, reserve(100, 50)),
    )
    .await;
    // More than the burst: never.
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s", "d", "doc", limited, reserve(300, 1)),
    )
    .await;
    assert_eq!(r.retry_after(), None);
}

/// docs/conformance.md#cost-limits: one batch of completions over several scopes (of two
/// apps, listed out of key order) gives each scope's token bucket back what its own task
/// did not use, and touches no other scope's.
pub async fn a_batch_of_completions_refunds_each_scopes_tokens(b: &dyn Backend) {
    let s = b.open().await;
    // 60 tokens a minute, 300 of burst; each task reserves 200 and uses 10 + 10 × n.
    let limited = cost_budget(None, Some((60, 300)), None);
    let w = worker("w");
    let owners = [("globex", "z"), ("acme", "s2"), ("acme", "s1")];
    let mut items = Vec::new();
    for (n, (app_name, scope_name)) in owners.iter().enumerate() {
        let t = create_new(
            &*s,
            priced_task(
                app_name,
                scope_name,
                scope_name,
                "doc",
                limited,
                reserve(100, 100),
            ),
        )
        .await;
        let copy = std::sync::Arc::new(claim(&*s, t.id, &w).await);
        let used = 10 * (n as u64 + 1);
        items.push(tollgate_store::Completion {
            id: t.id,
            lease: copy.lease().expect("a claimed copy"),
            output: spam(),
            usage: tokens(10, used),
            claimed: Some(copy),
            attempt: None,
        });
    }
    // A scope with a bucket of its own and nothing settling.
    create_new(
        &*s,
        priced_task("acme", "s3", "s3", "doc", limited, reserve(100, 100)),
    )
    .await;
    let answers = s.complete_tasks(items).await.expect("complete_tasks");
    assert!(
        answers.iter().all(|a| a.as_ref().is_ok_and(|t| t.applied)),
        "{answers:?}"
    );
    for (n, (app_name, scope_name)) in owners.iter().enumerate() {
        let used = 10 + 10 * (n as i64 + 1);
        let window = scope_spend(&*s, app_name, scope_name).await;
        let bucket = window.token_bucket.expect("the scope's token bucket");
        assert_eq!(
            bucket.units / tollgate_core::admission::TOKEN_UNITS,
            300 - used,
            "{app_name}/{scope_name}: 200 reserved, {used} used"
        );
    }
    let window = scope_spend(&*s, "acme", "s3").await;
    let bucket = window.token_bucket.expect("the scope's token bucket");
    assert_eq!(
        bucket.units / tollgate_core::admission::TOKEN_UNITS,
        100,
        "acme/s3 still holds its reservation"
    );
}

/// docs/conformance.md#cost-limits `usd_per_24_hours` (app): the app's spend over all its scopes; other apps
/// are not affected.
pub async fn app_spend_limit_spans_every_scope(b: &dyn Backend) {
    let s = b.open().await;
    let limited = cost_budget(None, None, Some(500_000));
    for i in 0..2 {
        create_new(
            &*s,
            priced_task(
                "acme",
                &format!("s{i}"),
                &format!("a{i}"),
                "doc",
                limited,
                reserve(100, 50),
            ),
        )
        .await;
    }
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s9", "a9", "doc", limited, reserve(100, 50)),
    )
    .await;
    assert_eq!(r.code(), ErrorCode::SpendBudget);
    assert!(r.to_string().contains("app"), "{r}");
    assert!(r.retry_after().is_some());
    create_new(
        &*s,
        priced_task("globex", "s9", "a", "doc", limited, reserve(100, 50)),
    )
    .await;
    let a = app_spend(&*s, "acme").await;
    assert_eq!(a.reserved_nano, 400_000);
}

/// docs/conformance.md#cost-limits checks run after docs/conformance.md#admission-order's, in the table's order: scope spend, token bucket,
/// app spend; and a request under a cost limit without an output bound is refused.
pub async fn cost_checks_follow_admission_checks_in_order(b: &dyn Backend) {
    let s = b.open().await;
    let one = budget(100, 100, 100, 100, 1, 1);
    let all = Budget {
        cost: cost_budget(Some(300_000), Some((60, 200)), Some(350_000)).cost,
        ..one
    };
    // 150 tokens and 200,000 n$: scope window 200,000, token bucket 50 left, app 200,000.
    create_new(
        &*s,
        priced_task("acme", "s", "a", "doc", all, reserve(100, 50)),
    )
    .await;
    // The docs/conformance.md#admission token bucket is empty: its rejection comes first.
    let err = create_err(
        &*s,
        priced_task("acme", "s", "b", "doc", all, reserve(100, 50)),
    )
    .await;
    assert_eq!(err.code(), Some(ErrorCode::RateLimit));
    // One second later the docs/conformance.md#admission bucket has a token again (and the token bucket 51 tokens).
    b.clock().advance(secs(1));
    let all = Budget {
        burst: nz(100),
        tasks_per_minute: nz(100),
        ..all
    };
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s", "c", "doc", all, reserve(100, 50)),
    )
    .await;
    assert!(matches!(r, CostRejection::ScopeSpend { .. }), "{r:?}");
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s", "d", "doc", all, reserve(52, 0)),
    )
    .await;
    assert!(matches!(r, CostRejection::TokenRate { .. }), "{r:?}");
    // Other scopes: app window 200,000 + 50,000, then 120,000 more is over 350,000.
    create_new(
        &*s,
        priced_task("acme", "s2", "e", "doc", all, reserve(40, 5)),
    )
    .await;
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s3", "f", "doc", all, reserve(100, 10)),
    )
    .await;
    assert!(matches!(r, CostRejection::AppSpend { .. }), "{r:?}");
    // No output bound under a cost limit: refused, naming max_output_tokens.
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s4", "g", "doc", all, Reservation::default()),
    )
    .await;
    assert_eq!(r, CostRejection::OutputBoundRequired);
    assert!(r.to_string().contains("max_output_tokens"), "{r}");
    // Without cost limits an unbounded task is admitted (and reserves nothing).
    create_new(
        &*s,
        priced_task("acme", "s4", "h", "doc", one, Reservation::default()),
    )
    .await;
}

/// docs/conformance.md#money-and-tokens: the 24 h window slides; spend is attributed to the admission hour and leaves
/// the window at most one hour after 24 h (the conservative side, docs/budgets.md).
pub async fn spend_window_slides(b: &dyn Backend) {
    let s = b.open().await;
    let limited = cost_budget(Some(200_000), None, None);
    let w = worker("w");
    let a = create_new(
        &*s,
        priced_task("acme", "s", "a", "doc", limited, reserve(100, 50)),
    )
    .await;
    b.clock().advance(hours(20));
    claim(&*s, a.id, &w).await;
    s.complete_task(a.id, &lease(&w, 1), spam(), tokens(100, 50))
        .await
        .expect("complete");
    assert!(matches!(
        s.create_task(priced_task(
            "acme",
            "s",
            "b",
            "doc",
            limited,
            reserve(100, 50)
        ))
        .await,
        Err(StoreError::Cost(_))
    ));
    b.clock().advance(hours(4));
    // 24 h after admission: still in the window's oldest (partial) bucket.
    let r = cost_rejection(
        &*s,
        priced_task("acme", "s", "b", "doc", limited, reserve(100, 50)),
    )
    .await;
    let wait = r.retry_after().expect("known");
    assert!(wait <= hours(1), "{wait:?}");
    b.clock().advance(wait);
    create_new(
        &*s,
        priced_task("acme", "s", "b", "doc", limited, reserve(100, 50)),
    )
    .await;
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!((spent.settled_nano, spent.reserved_nano), (0, 200_000));
    // Sweeps prune buckets older than the window; the report is unchanged.
    sweep_all(&*s, &sweep_config()).await;
    assert_eq!(scope_spend(&*s, "acme", "s").await, spent);
}
