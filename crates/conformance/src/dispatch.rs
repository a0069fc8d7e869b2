//! docs/conformance.md#priority dispatch order: fair share across (app, scope) queues by weight, priority
//! then age within a scope, ageing, and fair claims racing on several store instances.

use super::Backend;
use super::fixtures::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use tollgate_core::{
    Dispatch, JOIN_CREDIT_TASKS, ManualClock, NewTask, Priority, ScopeId, Task, TaskId, TaskStatus,
    Weight,
};
use tollgate_store::Store;

/// A backlog of `n` application tasks in `(app, scope)` created in batches of 500, with
/// the given dispatch settings.
async fn backlog(
    s: &dyn Store,
    app_name: &str,
    scope_name: &str,
    n: usize,
    dispatch: Dispatch,
) -> Vec<TaskId> {
    // Effect keys unique within the test, however many backlogs a scope gets.
    static BATCH: AtomicUsize = AtomicUsize::new(0);
    let tag = BATCH.fetch_add(1, Ordering::SeqCst);
    let mut ids = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let batch: Vec<NewTask> = (i..n.min(i + 500))
            .map(|j| NewTask {
                dispatch,
                ..new_app_task(app_name, scope_name, &format!("{scope_name}-{tag}-{j}"))
            })
            .collect();
        i += batch.len();
        for created in s.create_tasks(batch).await.expect("create_tasks") {
            let created = created.expect("backlog task created");
            assert!(created.created);
            ids.push(created.task.id);
        }
    }
    ids
}

fn weighted(weight: u32) -> Dispatch {
    Dispatch {
        weight: Weight::new(i64::from(weight)).expect("weight"),
        ..Dispatch::default()
    }
}

fn prioritized(priority: u8) -> Dispatch {
    Dispatch {
        priority: Priority::new(i64::from(priority)).expect("priority"),
        ..Dispatch::default()
    }
}

async fn claim_batch(s: &dyn Store, n: u32) -> Vec<Task> {
    s.claim_next(&worker("w"), n).await.expect("claim_next")
}

/// docs/conformance.md#fair-share: a backlog of one scope never holds back a task newly submitted in another
/// scope for longer than a few claim batches, whatever the backlog's size: with 5,000
/// tasks queued in scope A, the 10 that scope B submits afterwards are all claimed within
/// the first two batches of 10.
pub async fn a_backlog_never_holds_back_another_scope(b: &dyn Backend) {
    let s = b.open().await;
    backlog(&*s, "acme", "a", 5_000, Dispatch::default()).await;
    // A has already been served a while before B arrives.
    for _ in 0..3 {
        assert_eq!(claim_batch(&*s, 10).await.len(), 10);
    }
    b.clock().advance(secs(1));
    let newcomers: BTreeSet<TaskId> = backlog(&*s, "acme", "b", 10, Dispatch::default())
        .await
        .into_iter()
        .collect();
    let mut seen = BTreeSet::new();
    for batch in 0..2 {
        for t in claim_batch(&*s, 10).await {
            if newcomers.contains(&t.id) {
                seen.insert(t.id);
            }
        }
        assert!(
            batch == 0 || seen.len() == newcomers.len(),
            "scope B's 10 tasks were not all claimed within 2 batches of 10 behind a \
             5,000-task backlog (got {})",
            seen.len()
        );
    }
}

/// docs/conformance.md#fair-share: weights 3:1 give claim shares of 3:1 (within 10 %) over a long backlog
/// (after the second queue's joining burst; it is another app's, as an app's queues
/// opened together share one burst: docs/engine.md, "Dispatch order").
pub async fn weights_share_claims_in_proportion(b: &dyn Backend) {
    let s = b.open().await;
    let heavy: BTreeSet<TaskId> = backlog(&*s, "acme", "heavy", 600, weighted(3))
        .await
        .into_iter()
        .collect();
    backlog(&*s, "globex", "light", 600, weighted(1)).await;
    // The queue that joined second takes its joining burst first.
    let mut burst = 0;
    while burst < JOIN_CREDIT_TASKS as usize {
        let got = claim_batch(&*s, 10).await;
        assert!(
            got.iter().all(|t| !heavy.contains(&t.id)),
            "the joining queue's burst comes first"
        );
        burst += got.len();
    }
    let mut heavy_claims = 0usize;
    let mut total = 0usize;
    while total < 400 {
        let got = claim_batch(&*s, 8).await;
        assert!(!got.is_empty(), "both backlogs still hold tasks");
        total += got.len();
        heavy_claims += got.iter().filter(|t| heavy.contains(&t.id)).count();
    }
    let share = heavy_claims as f64 / (total - heavy_claims) as f64;
    assert!(
        (2.7..=3.3).contains(&share),
        "weights 3:1 gave claim shares {heavy_claims}:{} ({share:.2}:1)",
        total - heavy_claims
    );
}

/// docs/conformance.md#priority: within one scope higher priority starts first, then oldest first.
pub async fn priority_then_age_within_a_scope(b: &dyn Backend) {
    let s = b.open().await;
    let mut made: Vec<(u8, TaskId)> = Vec::new();
    for (i, p) in [5u8, 2, 9, 5, 2, 9].into_iter().enumerate() {
        let t = create_new(
            &*s,
            NewTask {
                dispatch: prioritized(p),
                ..new_app_task("acme", "s", &format!("p{i}"))
            },
        )
        .await;
        assert_eq!(t.priority.get(), p, "the task shows its priority");
        made.push((p, t.id));
        b.clock().advance(secs(1));
    }
    let mut order = Vec::new();
    while let Some(t) = claim_batch(&*s, 1).await.pop() {
        order.push(t.id);
    }
    let mut expected = made.clone();
    // Higher priority first; the stable sort keeps creation order within a priority.
    expected.sort_by_key(|(p, _)| std::cmp::Reverse(*p));
    assert_eq!(
        order,
        expected.into_iter().map(|(_, id)| id).collect::<Vec<_>>(),
        "priority first, then age"
    );
}

/// docs/conformance.md#priority ageing: a low-priority task is never starved. One priority level is worth
/// one ageing step (60 s by default) of waiting: a priority-0 task precedes
/// priority-9 work submitted more than 9 steps after it, but not work submitted sooner.
pub async fn ageing_lets_old_low_priority_tasks_start_before_new_high_priority_ones(
    b: &dyn Backend,
) {
    let s = b.open().await;
    let low = create_new(
        &*s,
        NewTask {
            dispatch: prioritized(0),
            ..new_app_task("acme", "s", "low")
        },
    )
    .await;
    b.clock().advance(secs(8 * 60));
    let soon = create_new(
        &*s,
        NewTask {
            dispatch: prioritized(9),
            ..new_app_task("acme", "s", "soon")
        },
    )
    .await;
    b.clock().advance(secs(2 * 60));
    let late = create_new(
        &*s,
        NewTask {
            dispatch: prioritized(9),
            ..new_app_task("acme", "s", "late")
        },
    )
    .await;
    let mut order = Vec::new();
    while let Some(t) = claim_batch(&*s, 1).await.pop() {
        order.push(t.id);
    }
    assert_eq!(
        order,
        vec![soon.id, low.id, late.id],
        "8 minutes of waiting is less than 9 levels, 10 minutes is more"
    );
}

/// docs/conformance.md#fair-share with docs/conformance.md#lifecycle under concurrency: 4 store instances claiming fairly while 2
/// others create tasks in 6 scopes never claim one task twice and never lose one (every
/// created task is claimed, none is left queued in a queue marked idle).
pub async fn racing_fair_claims_claim_each_task_once_and_lose_none(b: &dyn Backend) {
    const CREATORS: usize = 2;
    const CLAIMERS: usize = 4;
    const PER_CREATOR: usize = 150;
    let stores = open_stores(b, CREATORS + CLAIMERS).await;
    // Some backlog before the race starts.
    let mut created: Vec<TaskId> = backlog(&*stores[0], "acme", "s0", 100, weighted(2)).await;
    let done_creating = Arc::new(AtomicBool::new(false));
    let claimed_count = Arc::new(AtomicUsize::new(0));
    let mut creators = Vec::new();
    for (c, s) in stores.iter().take(CREATORS).enumerate() {
        let s = s.clone();
        creators.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for i in 0..PER_CREATOR {
                let scope_name = format!("s{}", (i + c) % 6);
                let app_name = if i % 5 == 0 { "globex" } else { "acme" };
                let new = new_app_task(app_name, &scope_name, &format!("c{c}-{i}"));
                let t = if i % 3 == 0 {
                    // Batches too: their queues are activated at the end, in lock order.
                    let more = NewTask {
                        effect_key: key(&format!("c{c}-{i}-b")),
                        ..new.clone()
                    };
                    let got = s.create_tasks(vec![new, more]).await.expect("create_tasks");
                    got.into_iter()
                        .map(|r| r.expect("created").task.id)
                        .collect::<Vec<_>>()
                } else {
                    vec![s.create_task(new).await.expect("create_task").task.id]
                };
                ids.extend(t);
                if i % 10 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            ids
        }));
    }
    let mut claimers = Vec::new();
    for (k, s) in stores.iter().skip(CREATORS).enumerate() {
        let s = s.clone();
        let done = done_creating.clone();
        let count = claimed_count.clone();
        claimers.push(tokio::spawn(async move {
            let w = worker(&format!("w{k}"));
            let mut mine: Vec<TaskId> = Vec::new();
            let mut idle_after_done = 0;
            loop {
                let got = s.claim_next(&w, 5).await.expect("claim_next");
                count.fetch_add(got.len(), Ordering::SeqCst);
                if got.is_empty() {
                    if done.load(Ordering::SeqCst) {
                        idle_after_done += 1;
                        if idle_after_done > 50 {
                            return mine;
                        }
                    }
                    tokio::task::yield_now().await;
                } else {
                    idle_after_done = 0;
                }
                mine.extend(got.into_iter().map(|t| t.id));
            }
        }));
    }
    for h in creators {
        created.extend(h.await.expect("creator panicked"));
    }
    done_creating.store(true, Ordering::SeqCst);
    let mut by_task: HashMap<TaskId, usize> = HashMap::new();
    for h in claimers {
        for id in h.await.expect("claimer panicked") {
            *by_task.entry(id).or_default() += 1;
        }
    }
    let twice: Vec<_> = by_task.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "tasks claimed more than once: {twice:?}");
    let lost: Vec<&TaskId> = created
        .iter()
        .filter(|id| !by_task.contains_key(id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} created tasks were never claimed (first: {:?})",
        lost.len(),
        created.len(),
        lost.first()
    );
    assert_eq!(
        by_task.len(),
        created.len(),
        "nothing claimed that was not created"
    );
    let s = b.open().await;
    for id in created.iter().take(20) {
        let app_name = ["acme", "globex"];
        let mut found = None;
        for a in app_name {
            if let Some(t) = try_get(&*s, &app(a), *id).await {
                found = Some(t);
            }
        }
        let t = found.expect("created task exists");
        assert_eq!((t.status, t.attempt), (TaskStatus::Running, 1));
    }
}

/// docs/conformance.md#dispatch: a scope that was idle joins at most one burst ([`JOIN_CREDIT_TASKS`]
/// tasks) ahead of the active queues: it gets that burst first, then shares claims
/// equally; it does not catch up on the time it was idle (300 tasks here), nor wait
/// behind the others' history.
pub async fn an_idle_scope_banks_no_credit(b: &dyn Backend) {
    let s = b.open().await;
    // B is served once, then idles while A alone is served 300 times.
    backlog(&*s, "acme", "b", 1, Dispatch::default()).await;
    backlog(&*s, "acme", "a", 700, Dispatch::default()).await;
    let mut served: BTreeMap<ScopeId, usize> = BTreeMap::new();
    for _ in 0..31 {
        for t in claim_batch(&*s, 10).await {
            *served.entry(t.scope).or_default() += 1;
        }
    }
    assert_eq!(served.get(&scope("b")), Some(&1));
    backlog(&*s, "acme", "b", 400, Dispatch::default()).await;
    let burst = JOIN_CREDIT_TASKS as usize;
    let mut after: BTreeMap<ScopeId, usize> = BTreeMap::new();
    let mut first_burst_b = 0;
    for i in 0..(burst + 200) / 10 {
        for t in claim_batch(&*s, 10).await {
            if i < burst / 10 && t.scope == scope("b") {
                first_burst_b += 1;
            }
            *after.entry(t.scope).or_default() += 1;
        }
    }
    assert_eq!(
        first_burst_b, burst,
        "B's first {burst} claims after returning are its burst"
    );
    let (a, bb) = (after[&scope("a")], after[&scope("b")] - burst);
    assert!(
        a.abs_diff(bb) <= 10,
        "after its burst, B shares claims equally with A (A {a}, B {bb}), \
         instead of catching up on the time it was idle"
    );
}

/// docs/conformance.md#fair-share (docs/engine.md, "Dispatch order"): a flood of new queues shares one burst of
/// joining credit. Scope `live` of another app is established (served a while); then one
/// app submits one task in each of 10,000 new scopes. The flood as a whole gets at most
/// one burst ([`JOIN_CREDIT_TASKS`] tasks, plus one tie) ahead of `live`, whose next
/// task is claimed within a few claim batches; after that the two alternate.
///
/// The store claims from its recent view of the queues for a period (50 ms by default),
/// so here some claims may plan from the view and others read the queues again, as the
/// machine's speed has it. `tests/queue_view.rs` runs [`flood_shares_one_burst`] with
/// every claim inside the period and with every claim reading the queues: both keep
/// these rules, with the same claims.
pub async fn a_flood_of_new_queues_shares_one_burst(b: &dyn Backend) {
    let s = b.open().await;
    flood_shares_one_burst(&*s, b.clock()).await;
}

/// The scenario and the checks of [`a_flood_of_new_queues_shares_one_burst`] on a store
/// `s` of a fresh database whose clock is `clock`. Returns the scopes each of its 12
/// claim batches of 32 took (sorted within the batch), to compare runs at different
/// claim timings.
pub async fn flood_shares_one_burst(s: &dyn Store, clock: &ManualClock) -> Vec<Vec<String>> {
    const FLOOD: usize = 10_000;
    const BATCH: u32 = 32;
    let live: BTreeSet<TaskId> = backlog(s, "globex", "live", 400, Dispatch::default())
        .await
        .into_iter()
        .collect();
    for _ in 0..3 {
        assert_eq!(claim_batch(s, 10).await.len(), 10);
    }
    clock.advance(secs(1));
    let mut i = 0;
    while i < FLOOD {
        let batch: Vec<NewTask> = (i..FLOOD.min(i + 500))
            .map(|j| new_app_task("acme", &format!("f{j}"), &format!("flood-{j}")))
            .collect();
        i += batch.len();
        for created in s.create_tasks(batch).await.expect("create_tasks") {
            assert!(created.expect("flood task created").created);
        }
    }
    let mut flood_before_live = 0usize;
    let mut batches = 0;
    let mut live_after = 0usize;
    let mut flood_after = 0usize;
    let mut seen_live = false;
    let mut claims: Vec<Vec<String>> = Vec::new();
    while batches < 12 {
        let got = claim_batch(s, BATCH).await;
        batches += 1;
        assert_eq!(
            got.len(),
            BATCH as usize,
            "batch {batches}: every slot is filled while tasks are claimable"
        );
        let mut scopes: Vec<String> = got.iter().map(|t| t.scope.as_str().to_owned()).collect();
        scopes.sort();
        claims.push(scopes);
        for t in got {
            let is_live = live.contains(&t.id);
            if !seen_live && !is_live {
                flood_before_live += 1;
            } else if seen_live && is_live {
                live_after += 1;
            } else if seen_live {
                flood_after += 1;
            }
            seen_live |= is_live;
        }
        if !seen_live {
            assert!(
                batches < 5,
                "scope `live` waited more than 4 claim batches of {BATCH} behind a flood of \
                 {FLOOD} new queues ({flood_before_live} flood tasks claimed first)"
            );
        }
    }
    assert!(
        flood_before_live <= JOIN_CREDIT_TASKS as usize + 1,
        "the flood of {FLOOD} new queues got {flood_before_live} tasks ahead of `live`, more \
         than one burst ({JOIN_CREDIT_TASKS})"
    );
    let after = live_after + flood_after;
    assert!(
        live_after * 3 >= after && flood_after * 3 >= after,
        "after the burst `live` and the flood take turns (live {live_after}, flood {flood_after})"
    );
    claims
}

/// docs/conformance.md#fair-share (docs/engine.md, "Dispatch order"): a claim fills every slot it asks for
/// while anything is claimable, however many drained queues sit ahead of the claimable
/// ones: 1,000 one-task scopes are claimed beside a long backlog, and every claim of 8
/// returns 8 (a short claim puts workers to sleep for the poll interval).
pub async fn claims_fill_every_slot_behind_drained_queues(b: &dyn Backend) {
    const FLOOD: usize = 1_000;
    let s = b.open().await;
    backlog(&*s, "globex", "live", 3_000, Dispatch::default()).await;
    assert_eq!(claim_batch(&*s, 8).await.len(), 8);
    b.clock().advance(secs(1));
    let mut flood: BTreeSet<TaskId> = BTreeSet::new();
    let mut i = 0;
    while i < FLOOD {
        let batch: Vec<NewTask> = (i..FLOOD.min(i + 500))
            .map(|j| new_app_task("acme", &format!("d{j}"), &format!("drain-{j}")))
            .collect();
        i += batch.len();
        for created in s.create_tasks(batch).await.expect("create_tasks") {
            flood.insert(created.expect("flood task created").task.id);
        }
    }
    let mut claims = 0;
    while !flood.is_empty() {
        let got = claim_batch(&*s, 8).await;
        claims += 1;
        assert_eq!(
            got.len(),
            8,
            "claim {claims} returned {} of 8 with {} one-task scopes and the backlog still \
             queued",
            got.len(),
            flood.len()
        );
        for t in got {
            flood.remove(&t.id);
        }
        assert!(claims < 2_000, "the flood is never drained");
    }
    for _ in 0..5 {
        assert_eq!(
            claim_batch(&*s, 8).await.len(),
            8,
            "the drained queues do not hold back the backlog"
        );
    }
}
