//! docs/budgets.md, "The reservation" and "Settlement": admission reserves a task's first
//! attempt; each re-ask is reserved when the worker makes it, checked like admission;
//! absurd usage is clamped and kept as overrun; deleting an owner settles its in-flight
//! tasks as a cancel does.

use super::Backend;
use super::cost::{cost_budget, priced_task, reserve, tokens};
use super::fixtures::*;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use tollgate_core::{CostRejection, ErrorCode, MAX_REPORTED_TOKENS, Reservation, TaskStatus};
use tollgate_store::{SpendWindow, StoreError};

async fn scope_spend(
    s: &dyn tollgate_store::Store,
    app_name: &str,
    scope_name: &str,
) -> SpendWindow {
    s.spend(&app(app_name), Some(&scope(scope_name)))
        .await
        .expect("spend")
}

async fn refused(
    s: &dyn tollgate_store::Store,
    id: tollgate_core::TaskId,
    w: &tollgate_core::WorkerId,
    r: &Reservation,
) -> CostRejection {
    match s.reserve_attempt(id, &lease(w, 1), r).await {
        Err(StoreError::Cost(c)) => c,
        other => panic!("expected the re-ask to be refused, got {other:?}"),
    }
}

/// A re-ask's reservation is added to the task's and its scope's and app's windows, and
/// checked against the scope's spend, the token bucket and the app's spend the task was
/// admitted under; a refusal changes nothing; the task's end settles every attempt.
pub async fn reask_reservations_are_checked_like_admission(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    // Scope limit: 500,000 n$; each attempt reserves 200,000 n$.
    let limited = cost_budget(Some(500_000), None, None);
    let t = create_new(
        &*s,
        priced_task("acme", "s", "a", "doc", limited, reserve(100, 50)),
    )
    .await;
    assert_eq!(
        scope_spend(&*s, "acme", "s").await.reserved_nano,
        200_000,
        "admission reserves the first attempt only"
    );
    assert_eq!(
        s.reserve_attempt(t.id, &lease(&w, 1), &reserve(100, 50))
            .await
            .expect("reserve"),
        None,
        "a queued task (not held by the worker) reserves nothing"
    );
    claim(&*s, t.id, &w).await;
    assert_eq!(
        s.reserve_attempt(t.id, &lease(&worker("other"), 1), &reserve(100, 50))
            .await
            .expect("reserve"),
        None,
        "only the worker holding the task reserves its re-asks"
    );
    let after = s
        .reserve_attempt(t.id, &lease(&w, 1), &reserve(100, 50))
        .await
        .expect("reserve")
        .expect("a running task's re-ask fits");
    assert_eq!((after.tokens, after.nano_usd), (300, 400_000));
    let got = get(&*s, &app("acme"), t.id).await;
    assert_eq!(
        got.reservation.map(|r| (r.tokens, r.nano_usd)),
        Some((300, 400_000)),
        "the task keeps its whole reservation"
    );
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!((spent.reserved_nano, spent.reserved_tokens), (400_000, 300));
    assert_eq!(
        s.spend(&app("acme"), None)
            .await
            .expect("spend")
            .reserved_nano,
        400_000
    );
    let c = refused(&*s, t.id, &w, &reserve(100, 50)).await;
    assert_eq!(c.code(), ErrorCode::SpendBudget, "{c}");
    assert_eq!(
        scope_spend(&*s, "acme", "s").await.reserved_nano,
        400_000,
        "a refused re-ask changes nothing"
    );
    // The task fails having used two attempts: charged their usage, nothing reserved.
    s.fail_task(
        t.id,
        None,
        ErrorCode::SpendBudget,
        "the re-ask does not fit",
        Some(&tokens(150, 40)),
    )
    .await
    .expect("fail");
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!((spent.reserved_nano, spent.reserved_tokens), (0, 0));
    assert_eq!(spent.settled_nano, 150 * 1_000 + 40 * 2_000);
    assert_eq!(
        s.reserve_attempt(t.id, &lease(&w, 1), &reserve(100, 50))
            .await
            .expect("reserve"),
        None,
        "a finished task reserves nothing"
    );

    // The token bucket: burst 400, the first attempt takes 150, a re-ask 150 more, the
    // next does not fit; settlement gives back what was not used.
    let bucketed = cost_budget(None, Some((1, 400)), None);
    let t = create_new(
        &*s,
        priced_task("acme", "tok", "t", "doc", bucketed, reserve(100, 50)),
    )
    .await;
    claim(&*s, t.id, &w).await;
    s.reserve_attempt(t.id, &lease(&w, 1), &reserve(100, 50))
        .await
        .expect("reserve")
        .expect("fits the bucket");
    let c = refused(&*s, t.id, &w, &reserve(100, 50)).await;
    assert!(matches!(c, CostRejection::TokenRate { .. }), "{c}");
    s.complete_task(t.id, &lease(&w, 1), spam(), tokens(100, 20))
        .await
        .expect("complete");
    let bucket = scope_spend(&*s, "acme", "tok").await.token_bucket;
    let units = bucket.expect("the scope has a token bucket").units;
    assert_eq!(
        units,
        (400 - 120) * tollgate_core::admission::TOKEN_UNITS,
        "the unused 180 reserved tokens went back"
    );

    // The app's limit spans its scopes.
    let app_limited = cost_budget(None, None, Some(700_000));
    let a = create_new(
        &*s,
        priced_task("globex", "x", "a", "doc", app_limited, reserve(100, 50)),
    )
    .await;
    create_new(
        &*s,
        priced_task("globex", "y", "b", "doc", app_limited, reserve(100, 50)),
    )
    .await;
    claim(&*s, a.id, &w).await;
    s.reserve_attempt(a.id, &lease(&w, 1), &reserve(100, 50))
        .await
        .expect("reserve")
        .expect("600,000 of 700,000");
    let c = refused(&*s, a.id, &w, &reserve(100, 50)).await;
    assert!(matches!(c, CostRejection::AppSpend { .. }), "{c}");

    // An unscoped task has no reservation: nothing to reserve.
    let u = create_new(&*s, new_app_task("acme", "s", "u")).await;
    claim(&*s, u.id, &w).await;
    assert_eq!(
        s.reserve_attempt(u.id, &lease(&w, 1), &reserve(100, 50))
            .await
            .expect("reserve"),
        None
    );
}

/// Re-asks of running tasks race admissions of new tasks of one scope across store
/// instances: settled + reserved never exceeds the scope's limit, and every granted
/// reservation is in the window.
pub async fn racing_reasks_and_admissions_never_exceed_a_spend_limit(b: &dyn Backend) {
    const LIMIT: i64 = 4_000_000;
    let limited = cost_budget(Some(LIMIT as u64), None, None);
    let stores = open_stores(b, 4).await;
    let w = worker("w");
    // 8 running tasks (1,600,000 n$), then admissions and re-asks race for the rest.
    let mut running = Vec::new();
    for i in 0..8 {
        let t = create_new(
            &*stores[0],
            priced_task(
                "acme",
                "race",
                &format!("r{i}"),
                "doc",
                limited,
                reserve(100, 50),
            ),
        )
        .await;
        claim(&*stores[0], t.id, &w).await;
        running.push(t.id);
    }
    let granted = Arc::new(AtomicI64::new(8 * 200_000));
    let mut racers = Vec::new();
    for (n, s) in stores.iter().enumerate() {
        let s = s.clone();
        let running = running.clone();
        let granted = granted.clone();
        let w = w.clone();
        racers.push(tokio::spawn(async move {
            for i in 0..10 {
                if (n + i) % 2 == 0 {
                    let id = running[(n * 10 + i) % running.len()];
                    match s
                        .reserve_attempt(id, &lease(&w, 1), &reserve(100, 50))
                        .await
                    {
                        Ok(Some(_)) => {
                            granted.fetch_add(200_000, Ordering::SeqCst);
                        }
                        Err(StoreError::Cost(c)) => {
                            assert_eq!(c.code(), ErrorCode::SpendBudget, "{c}")
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                } else {
                    let new = priced_task(
                        "acme",
                        "race",
                        &format!("n{n}-{i}"),
                        "doc",
                        limited,
                        reserve(100, 50),
                    );
                    match s.create_task(new).await {
                        Ok(_) => {
                            granted.fetch_add(200_000, Ordering::SeqCst);
                        }
                        Err(StoreError::Cost(c)) => {
                            assert_eq!(c.code(), ErrorCode::SpendBudget, "{c}")
                        }
                        Err(e) => panic!("unexpected {e}"),
                    }
                }
            }
        }));
    }
    for r in racers {
        r.await.expect("racer");
    }
    let spent = scope_spend(&*stores[0], "acme", "race").await;
    let total = spent.reserved_nano + spent.settled_nano;
    assert!(total <= LIMIT, "{total} over the limit {LIMIT}");
    assert_eq!(
        total,
        granted.load(Ordering::SeqCst),
        "every granted reservation is counted"
    );
    assert_eq!(
        total, LIMIT,
        "the limit is filled exactly (12 of the 40 asks fit)"
    );
}

/// A provider's absurd usage (10^15 prompt tokens) is clamped to MAX_REPORTED_TOKENS:
/// the completion is recorded (the answer kept), the excess over the reservation is
/// recorded as overrun, and nothing overflows.
pub async fn absurd_usage_is_clamped_and_the_answer_kept(b: &dyn Backend) {
    let s = b.open().await;
    let free = cost_budget(None, None, None);
    let w = worker("w");
    let t = create_new(
        &*s,
        priced_task("acme", "s", "a", "doc", free, reserve(100, 50)),
    )
    .await;
    claim(&*s, t.id, &w).await;
    let absurd = tokens(1_000_000_000_000_000, 10);
    let done = s
        .complete_task(t.id, &lease(&w, 1), spam(), absurd)
        .await
        .expect("absurd usage never fails the completion");
    assert!(done.applied);
    let got = get(&*s, &app("acme"), t.id).await;
    assert_eq!(got.status, TaskStatus::Succeeded);
    assert_eq!(got.output, Some(spam()), "the answer is kept");
    let clamped = MAX_REPORTED_TOKENS as i64 * 1_000 + 10 * 2_000;
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!(spent.reserved_nano, 0);
    assert_eq!(spent.settled_nano, clamped);
    assert_eq!(spent.overrun_nano, clamped - 200_000);
    // A second one in the same bucket still adds up.
    let t2 = create_new(
        &*s,
        priced_task("acme", "s", "b", "doc", free, reserve(100, 50)),
    )
    .await;
    claim(&*s, t2.id, &w).await;
    s.fail_task(
        t2.id,
        None,
        ErrorCode::InvalidModelOutput,
        "bad",
        Some(&tokens(u64::MAX, u64::MAX)),
    )
    .await
    .expect("absurd usage never fails the failure either");
    let spent = scope_spend(&*s, "acme", "s").await;
    assert_eq!(
        spent.settled_nano,
        clamped + MAX_REPORTED_TOKENS as i64 * 3_000
    );
}

/// Deleting an owner's data settles its in-flight tasks as a cancel does: a running
/// task is charged its whole reservation, a queued one nothing; nothing stays reserved.
pub async fn deleting_an_owner_settles_its_in_flight_reservations(b: &dyn Backend) {
    let s = b.open().await;
    let bucketed = cost_budget(None, Some((1, 1_000)), None);
    let w = worker("w");
    let running = create_new(
        &*s,
        priced_task("acme", "s", "run", "doc", bucketed, reserve(100, 50)),
    )
    .await;
    claim(&*s, running.id, &w).await;
    create_new(
        &*s,
        priced_task("acme", "s", "queued", "doc", bucketed, reserve(200, 100)),
    )
    .await;
    let done = create_new(
        &*s,
        priced_task("acme", "s", "done", "doc", bucketed, reserve(10, 5)),
    )
    .await;
    claim(&*s, done.id, &w).await;
    s.complete_task(done.id, &lease(&w, 1), spam(), tokens(10, 5))
        .await
        .expect("complete");
    let before = scope_spend(&*s, "acme", "s").await;
    assert_eq!(before.reserved_nano, 200_000 + 400_000);
    assert_eq!(
        s.delete_owner_data(&app("acme"), &scope("s"), None)
            .await
            .expect("delete"),
        3
    );
    let after = scope_spend(&*s, "acme", "s").await;
    assert_eq!(
        (after.reserved_nano, after.reserved_tokens),
        (0, 0),
        "no reservation outlives its deleted task"
    );
    assert_eq!(
        after.settled_nano,
        before.settled_nano + 200_000,
        "the running task is charged its reservation, the queued one nothing"
    );
    assert_eq!(
        s.spend(&app("acme"), None)
            .await
            .expect("spend")
            .reserved_nano,
        0
    );
    // The queued task's tokens went back to the bucket (the running one's were spent).
    let units = after.token_bucket.expect("bucket").units;
    assert_eq!(
        units,
        (1_000 - 150 - 15) * tollgate_core::admission::TOKEN_UNITS,
        "the queued task's 300 tokens are back"
    );
}
