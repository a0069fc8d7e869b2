//! Tasks without a source (docs/budgets.md, "Tasks without a source"): the USD limits
//! and the token bucket apply to every task that can cost money, sourced or not, owned
//! by a run or by the application; the limits about sources and task counts do not.
//! Their reservations show in the usage windows and settle like a sourced task's.

use super::Backend;
use super::cost::{cost_budget, reserve, tokens};
use super::fixtures::*;
use std::sync::Arc;
use tokio::sync::Barrier;
use tollgate_core::{
    Budget, CostRejection, ErrorCode, NewTask, Reservation, RunId, TaskCost, TaskStatus,
};
use tollgate_store::{Created, SpendWindow, Store, StoreError, StoreResult};

/// An application task without a source, under `budget`'s cost limits, reserving `r`;
/// the input names the key.
pub fn unsourced_task(
    app_name: &str,
    scope_name: &str,
    effect_key: &str,
    budget: Budget,
    r: Reservation,
) -> NewTask {
    NewTask {
        cost: Some(TaskCost {
            budget,
            reservation: r,
        }),
        ..with_input(new_app_task(app_name, scope_name, effect_key), effect_key)
    }
}

/// A run's task without a source, under `budget`'s cost limits, reserving `r`.
pub fn unsourced_run_task(
    app_name: &str,
    run: RunId,
    effect_key: &str,
    budget: Budget,
    r: Reservation,
) -> NewTask {
    NewTask {
        cost: Some(TaskCost {
            budget,
            reservation: r,
        }),
        ..with_input(new_run_task(app_name, run, effect_key), effect_key)
    }
}

async fn window(s: &dyn Store, app_name: &str, scope_name: Option<&str>) -> SpendWindow {
    let scope_id = scope_name.map(scope);
    s.spend(&app(app_name), scope_id.as_ref())
        .await
        .expect("spend")
}

async fn cost_refusal(s: &dyn Store, new: NewTask) -> CostRejection {
    match s.create_task(new).await {
        Err(StoreError::Cost(c)) => c,
        other => panic!("expected a cost refusal, got {other:?}"),
    }
}

/// The issue's reproduction: an app near its `usd_per_24_hours` refuses tasks without a
/// source with `WORKFLOW_AI_SPEND_BUDGET` (and a retry time); what they reserve and
/// spend is in the scope's and the app's usage, and counts against sourced tasks too.
pub async fn unsourced_tasks_count_against_the_app_spend_limit(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let limited = cost_budget(None, None, Some(500_000));
    // 200,000 n$ reserved by each of two tasks without a source, in two scopes.
    let a = create_new(
        &*s,
        unsourced_task("acme", "s00", "a", limited, reserve(100, 50)),
    )
    .await;
    assert_eq!(
        a.reservation.map(|r| r.nano_usd),
        Some(200_000),
        "it keeps its reservation"
    );
    create_new(
        &*s,
        unsourced_task("acme", "s01", "b", limited, reserve(100, 50)),
    )
    .await;
    let scope_w = window(&*s, "acme", Some("s00")).await;
    assert_eq!(
        (scope_w.reserved_nano, scope_w.reserved_tokens),
        (200_000, 150)
    );
    assert_eq!(window(&*s, "acme", None).await.reserved_nano, 400_000);
    // A third does not fit the app's limit: refused, nothing written.
    let r = cost_refusal(
        &*s,
        unsourced_task("acme", "s02", "c", limited, reserve(100, 50)),
    )
    .await;
    assert!(matches!(r, CostRejection::AppSpend { .. }), "{r:?}");
    assert_eq!(r.code(), ErrorCode::SpendBudget);
    assert!(r.retry_after().is_some(), "the window's buckets say when");
    assert_eq!(get_by_key(&*s, &app("acme"), "c").await, None);
    assert_eq!(window(&*s, "acme", None).await.reserved_nano, 400_000);
    // Sourced tasks see the unsourced spend too.
    let r = cost_refusal(
        &*s,
        super::cost::priced_task("acme", "s03", "d", "doc", limited, reserve(100, 50)),
    )
    .await;
    assert!(matches!(r, CostRejection::AppSpend { .. }), "{r:?}");
    // Settled at what it cost (40 + 10 tokens: 60,000 n$), the first makes room.
    claim(&*s, a.id, &w).await;
    s.complete_task(a.id, &lease(&w, 1), spam(), tokens(40, 10))
        .await
        .expect("complete");
    let scope_w = window(&*s, "acme", Some("s00")).await;
    assert_eq!(
        (scope_w.reserved_nano, scope_w.settled_nano),
        (0, 60_000),
        "settled like a sourced task"
    );
    assert_eq!((scope_w.reserved_tokens, scope_w.settled_tokens), (0, 50));
    let app_w = window(&*s, "acme", None).await;
    assert_eq!((app_w.reserved_nano, app_w.settled_nano), (200_000, 60_000));
    create_new(
        &*s,
        unsourced_task("acme", "s02", "c", limited, reserve(100, 50)),
    )
    .await;
    // Another app is not affected.
    create_new(
        &*s,
        unsourced_task("globex", "s00", "a", limited, reserve(100, 50)),
    )
    .await;
}

/// The scope's `usd_per_24_hours` and token bucket apply to tasks without a source,
/// application- or run-owned, shared with sourced tasks; a task without an output bound
/// under a limit is refused; the source and task-count limits do not apply.
pub async fn unsourced_tasks_count_against_the_scope_limits(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    // Spend: 550,000 n$ a day. Tokens: 60 a minute, 400 of burst. Task counts: one.
    let limits = Budget {
        cost: cost_budget(Some(550_000), Some((60, 400)), None).cost,
        ..budget(1, 1, 1, 1, 1, 1)
    };
    let run = create_run(&*s, new_run("acme", "s")).await;
    // 150 tokens, 200,000 n$ each; scope_concurrent = burst = 1 do not stop the second.
    let a = create_new(
        &*s,
        unsourced_task("acme", "s", "a", limits, reserve(100, 50)),
    )
    .await;
    create_new(
        &*s,
        unsourced_run_task("acme", run.id, "b", limits, reserve(100, 50)),
    )
    .await;
    // Spend: 400,000 + 200,000 is over 550,000 (the spend check comes first).
    let r = cost_refusal(
        &*s,
        unsourced_task("acme", "s", "c", limits, reserve(100, 50)),
    )
    .await;
    assert!(matches!(r, CostRejection::ScopeSpend { .. }), "{r:?}");
    let wait = r.retry_after().expect("known");
    assert!(wait > hours(24) && wait <= hours(25), "{wait:?}");
    // Tokens: 100 left in the bucket; 101 (at 1,000 n$ each, within the spend) is not.
    let r = cost_refusal(
        &*s,
        unsourced_task("acme", "s", "d", limits, reserve(101, 0)),
    )
    .await;
    assert!(matches!(r, CostRejection::TokenRate { .. }), "{r:?}");
    assert_eq!(r.retry_after(), Some(secs(1)), "one token a second");
    // A sourced task shares the scope's window and bucket.
    let sourced = Budget {
        cost: limits.cost,
        ..unlimited()
    };
    let r = cost_refusal(
        &*s,
        super::cost::priced_task("acme", "s", "e", "doc", sourced, reserve(101, 0)),
    )
    .await;
    assert!(matches!(r, CostRejection::TokenRate { .. }), "{r:?}");
    // No output bound under a limit: refused.
    let r = cost_refusal(
        &*s,
        unsourced_task("acme", "s", "f", limits, Reservation::default()),
    )
    .await;
    assert_eq!(r, CostRejection::OutputBoundRequired);
    // Settlement gives unused tokens back: 150 reserved, 20 used.
    claim(&*s, a.id, &w).await;
    s.complete_task(a.id, &lease(&w, 1), spam(), tokens(10, 10))
        .await
        .expect("complete");
    let bucket = window(&*s, "acme", Some("s"))
        .await
        .token_bucket
        .expect("the scope's token bucket");
    assert_eq!(
        bucket.units / tollgate_core::admission::TOKEN_UNITS,
        400 - 150 - 20
    );
    create_new(
        &*s,
        unsourced_task("acme", "s", "d", limits, reserve(101, 0)),
    )
    .await;
    // Sourced tasks still count sources and tasks: the first is admitted, the second
    // source is over sources_per_24_hours = 1.
    create_new(
        &*s,
        super::cost::priced_task("acme", "s", "g", "doc-1", limits, reserve(1, 0)),
    )
    .await;
    let err = create_err(
        &*s,
        super::cost::priced_task("acme", "s", "h", "doc-2", limits, reserve(1, 0)),
    )
    .await;
    assert_eq!(err.code(), Some(ErrorCode::DailyBudget));
}

/// Every ending settles a task without a source as it settles a sourced one: canceled
/// while queued costs nothing, canceled while running its reservation, a failure what
/// it reported; tasks that reserve nothing change no window.
pub async fn unsourced_tasks_settle_on_every_ending(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let free = cost_budget(None, None, None);
    let queued = create_new(
        &*s,
        unsourced_task("acme", "s", "q", free, reserve(100, 50)),
    )
    .await;
    let running = create_new(
        &*s,
        unsourced_task("acme", "s", "r", free, reserve(100, 50)),
    )
    .await;
    let failing = create_new(
        &*s,
        unsourced_task("acme", "s", "f", free, reserve(100, 50)),
    )
    .await;
    assert_eq!(window(&*s, "acme", Some("s")).await.reserved_nano, 600_000);
    cancel(&*s, &app("acme"), queued.id).await;
    claim(&*s, running.id, &w).await;
    cancel(&*s, &app("acme"), running.id).await;
    claim(&*s, failing.id, &w).await;
    s.fail_task(
        failing.id,
        None,
        ErrorCode::InvalidModelOutput,
        "bad",
        Some(&tokens(70, 20)),
    )
    .await
    .expect("fail");
    let spent = window(&*s, "acme", Some("s")).await;
    assert_eq!(spent.reserved_nano, 0);
    assert_eq!(spent.settled_nano, 200_000 + 70_000 + 40_000);
    assert_eq!(
        get(&*s, &app("acme"), running.id).await.status,
        TaskStatus::Canceled
    );
    // Interrupted (no heartbeat): its reservation.
    let lost = create_new(&*s, unsourced_task("acme", "i", "i", free, reserve(10, 10))).await;
    claim(&*s, lost.id, &w).await;
    b.clock().advance(hours(1));
    sweep_all(&*s, &sweep_config()).await;
    assert_eq!(
        get(&*s, &app("acme"), lost.id).await.status,
        TaskStatus::Failed
    );
    let spent = window(&*s, "acme", Some("i")).await;
    assert_eq!((spent.reserved_nano, spent.settled_nano), (0, 30_000));
    // A task that can cost nothing known reserves nothing and changes no window.
    let plain = create_new(&*s, new_app_task("acme", "p", "p")).await;
    assert_eq!(plain.reservation, None);
    claim(&*s, plain.id, &w).await;
    s.complete_task(plain.id, &lease(&w, 1), spam(), tokens(40, 10))
        .await
        .expect("complete");
    let spent = window(&*s, "acme", Some("p")).await;
    assert_eq!((spent.reserved_nano, spent.settled_nano), (0, 0));
}

/// Exact across replicas: 40 tasks without a source, racing on four store instances,
/// half of them application-owned and half run-owned, each reserving 100,000 n$ under a
/// scope limit of 750,000 n$ and an app limit of 1,050,000 n$ (across two scopes):
/// exactly 10 are admitted in all, at most 7 in a scope, and the windows hold exactly
/// what was admitted.
pub async fn racing_unsourced_tasks_respect_the_spend_limits_exactly(b: &dyn Backend) {
    const RACERS: usize = 40;
    let stores = open_stores(b, 4).await;
    let limits = cost_budget(Some(750_000), Some((1, 1_000_000)), Some(1_050_000));
    let run_a = create_run(&*stores[0], new_run("acme", "a")).await;
    let run_b = create_run(&*stores[0], new_run("acme", "b")).await;
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut handles = Vec::with_capacity(RACERS);
    for i in 0..RACERS {
        let s = stores[i % stores.len()].clone();
        let barrier = barrier.clone();
        // Scope a first: its racers are the even ones.
        let (scope_name, run) = if i % 2 == 0 {
            ("a", run_a.id)
        } else {
            ("b", run_b.id)
        };
        let key = format!("k{i}");
        let new = if i % 4 < 2 {
            unsourced_task("acme", scope_name, &key, limits, reserve(50, 25))
        } else {
            unsourced_run_task("acme", run, &key, limits, reserve(50, 25))
        };
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let answer: StoreResult<Created> = s.create_task(new).await;
            (scope_name, answer)
        }));
    }
    let mut admitted = std::collections::BTreeMap::<&str, i64>::new();
    for h in handles {
        let (scope_name, answer) = h.await.expect("racer");
        match answer {
            Ok(c) => *admitted.entry(scope_name).or_default() += i64::from(c.created),
            Err(StoreError::Cost(
                CostRejection::ScopeSpend { .. } | CostRejection::AppSpend { .. },
            )) => {}
            Err(e) => panic!("unexpected answer: {e:?}"),
        }
    }
    let total: i64 = admitted.values().sum();
    assert_eq!(total, 10, "the app's limit holds exactly: {admitted:?}");
    for (scope_name, n) in &admitted {
        assert!(*n <= 7, "a scope's limit holds: {admitted:?}");
        let w = window(&*stores[0], "acme", Some(scope_name)).await;
        assert_eq!(w.reserved_nano, n * 100_000, "{scope_name}");
        assert_eq!(w.reserved_tokens, n * 75, "{scope_name}");
    }
    let app_w = window(&*stores[0], "acme", None).await;
    assert_eq!(app_w.reserved_nano, 1_000_000);
}

/// A batch (`create_tasks`) records each new unsourced task's reservation in its scope's
/// and the app's spend once, as single creations do: not for a replay (earlier in the
/// batch or before it), not for a task that can cost nothing; a limited one in the same
/// batch is checked on its own. Settled as a single creation's would be.
pub async fn unsourced_tasks_in_a_batch_record_their_reservations(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let free = cost_budget(None, None, None);
    let limited = cost_budget(Some(300_000), None, None);
    let before = create_new(
        &*s,
        unsourced_task("acme", "s1", "before", free, reserve(100, 50)),
    )
    .await;
    let batch = vec![
        unsourced_task("acme", "s1", "a", free, reserve(100, 50)),
        unsourced_task("acme", "s1", "b", free, reserve(100, 50)),
        unsourced_task("acme", "s1", "a", free, reserve(100, 50)),
        unsourced_task("acme", "s1", "before", free, reserve(100, 50)),
        new_app_task("acme", "s1", "plain"),
        unsourced_task("acme", "s2", "c", free, reserve(10, 10)),
        unsourced_task("acme", "s2", "big", limited, reserve(100, 50)),
        unsourced_task("acme", "s3", "over", limited, reserve(1_000, 500)),
    ];
    let answers = s.create_tasks(batch).await.expect("the batch runs");
    let created: Vec<Option<bool>> = answers
        .iter()
        .map(|a| a.as_ref().ok().map(|c| c.created))
        .collect();
    assert_eq!(
        created,
        vec![
            Some(true),
            Some(true),
            Some(false),
            Some(false),
            Some(true),
            Some(true),
            Some(true),
            None
        ],
        "{answers:?}"
    );
    assert!(
        matches!(
            answers[7],
            Err(StoreError::Cost(CostRejection::ScopeSpend { .. }))
        ),
        "the limited one over its limit is refused on its own: {:?}",
        answers[7]
    );
    let task = |i: usize| answers[i].as_ref().expect("created").task.clone();
    assert_eq!(task(2).id, task(0).id, "a repeated key answers its first");
    assert_eq!(task(3).id, before.id, "a taken key answers its task");
    assert_eq!(task(0).reservation.map(|r| r.nano_usd), Some(200_000));
    assert_eq!(task(4).reservation, None, "a task that can cost nothing");
    // s1: before, a, b (200,000 n$ and 150 tokens each); s2: c (30,000, 20) and big.
    let s1 = window(&*s, "acme", Some("s1")).await;
    assert_eq!((s1.reserved_nano, s1.reserved_tokens), (600_000, 450));
    let s2 = window(&*s, "acme", Some("s2")).await;
    assert_eq!((s2.reserved_nano, s2.reserved_tokens), (230_000, 170));
    assert_eq!(window(&*s, "acme", Some("s3")).await.reserved_nano, 0);
    assert_eq!(window(&*s, "acme", None).await.reserved_nano, 830_000);
    // Settled like a single creation's: 40 + 10 tokens cost 60,000 n$.
    let a = task(0);
    claim(&*s, a.id, &w).await;
    s.complete_task(a.id, &lease(&w, 1), spam(), tokens(40, 10))
        .await
        .expect("complete");
    let s1 = window(&*s, "acme", Some("s1")).await;
    assert_eq!((s1.reserved_nano, s1.settled_nano), (400_000, 60_000));
}

/// Batches racing on four store instances over the same effect keys record each task's
/// reservation exactly once: the windows hold what the tasks that exist reserved.
pub async fn racing_unsourced_batches_record_each_reservation_once(b: &dyn Backend) {
    const RACERS: usize = 8;
    let stores = open_stores(b, 4).await;
    let free = cost_budget(None, None, None);
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut handles = Vec::with_capacity(RACERS);
    for i in 0..RACERS {
        let s = stores[i % stores.len()].clone();
        let barrier = barrier.clone();
        // Each racer: 20 keys of 30, shifted by racer, in two scopes.
        let batch: Vec<NewTask> = (0..20)
            .map(|j| {
                let k = (i * 5 + j) % 30;
                let scope_name = if k % 2 == 0 { "even" } else { "odd" };
                unsourced_task("acme", scope_name, &format!("k{k}"), free, reserve(10, 5))
            })
            .collect();
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            s.create_tasks(batch).await
        }));
    }
    let mut created = 0;
    for h in handles {
        for answer in h.await.expect("racer").expect("the batch runs") {
            created += i64::from(answer.expect("each item is created or replayed").created);
        }
    }
    assert_eq!(created, 30, "each key is created once");
    for scope_name in ["even", "odd"] {
        let w = window(&*stores[0], "acme", Some(scope_name)).await;
        assert_eq!(
            (w.reserved_nano, w.reserved_tokens),
            (15 * 20_000, 15 * 15),
            "{scope_name}"
        );
    }
    assert_eq!(
        window(&*stores[0], "acme", None).await.reserved_nano,
        30 * 20_000
    );
}

/// Exact across replicas when many calls of one scope race (docs/locking.md, "Creations
/// of one scope together": one instance may create such calls in one transaction): 64
/// racers on four store instances, in one scope whose token bucket holds 17 tasks'
/// reservations and 74 tokens more. Four keys exist before the race and are replayed in
/// it; the other racers name 30 keys, each twice. Exactly 13 new tasks are created; a
/// replay is never refused; the racers of one key all get its task or are all refused;
/// the scope's window holds exactly the 17 tasks' reservations.
pub async fn racing_unsourced_tasks_of_one_scope_respect_the_token_bucket_exactly(b: &dyn Backend) {
    const RACERS: usize = 64;
    let stores = open_stores(b, 4).await;
    let limits = cost_budget(None, Some((1, 17 * 75 + 74)), None);
    let mut before = std::collections::BTreeMap::new();
    for k in 0..4 {
        let key = format!("old{k}");
        let task = create_new(
            &*stores[0],
            unsourced_task("acme", "p", &key, limits, reserve(50, 25)),
        )
        .await;
        before.insert(key, task.id);
    }
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut handles = Vec::with_capacity(RACERS);
    for i in 0..RACERS {
        let s = stores[i % stores.len()].clone();
        let barrier = barrier.clone();
        let key = if i < 4 {
            format!("old{i}")
        } else {
            format!("k{}", (i - 4) % 30)
        };
        let new = unsourced_task("acme", "p", &key, limits, reserve(50, 25));
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            let answer: StoreResult<Created> = s.create_task(new).await;
            (key, answer)
        }));
    }
    let mut by_key = std::collections::BTreeMap::<String, Vec<Option<Created>>>::new();
    for h in handles {
        let (key, answer) = h.await.expect("racer");
        let answer = match answer {
            Ok(c) => Some(c),
            Err(StoreError::Cost(CostRejection::TokenRate { .. })) => None,
            Err(e) => panic!("unexpected answer for {key}: {e:?}"),
        };
        by_key.entry(key).or_default().push(answer);
    }
    let mut created = 0;
    for (key, answers) in &by_key {
        if let Some(id) = before.get(key) {
            let c = answers[0]
                .as_ref()
                .unwrap_or_else(|| panic!("a replay of {key} was refused"));
            assert_eq!((c.task.id, c.created), (*id, false), "{key} replays");
            continue;
        }
        let ids: std::collections::BTreeSet<_> = answers
            .iter()
            .map(|a| a.as_ref().map(|c| c.task.id))
            .collect();
        assert_eq!(
            ids.len(),
            1,
            "the racers of {key} got one answer: {answers:?}"
        );
        let made = answers.iter().flatten().filter(|c| c.created).count();
        assert!(made <= 1, "{key} was created once");
        created += made;
    }
    assert_eq!(
        created, 13,
        "the bucket holds exactly 13 more tasks: {by_key:?}"
    );
    let w = window(&*stores[0], "acme", Some("p")).await;
    assert_eq!(
        (w.reserved_nano, w.reserved_tokens),
        (17 * 100_000, 17 * 75)
    );
}
