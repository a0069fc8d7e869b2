//! docs/conformance.md#creating-a-task ("correct with any number of replicas creating tasks at once") and docs/conformance.md#admission ("limits
//! are exact under any concurrency"): racing store instances on one database.
//!
//! Every race opens [`STORES`] independent instances (each its own connection pool, as
//! separate replicas would) and releases all racers at once through a barrier.

use super::Backend;
use super::fixtures::*;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Barrier;
use tollgate_core::{AdmissionRejection, NewTask, TaskId, TaskStatus, WorkerId};
use tollgate_store::{Created, Store, StoreError, StoreResult};

/// Store instances per race.
pub const STORES: usize = 4;

/// Racers per race.
pub const RACERS: usize = 40;

/// Runs `RACERS` racers, racer `i` on store `i % STORES`, all released at once; returns
/// their answers in racer order.
async fn race<T, F, Fut>(b: &dyn Backend, racer: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize, Arc<dyn Store>) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let stores = open_stores(b, STORES).await;
    let barrier = Arc::new(Barrier::new(RACERS));
    let mut handles = Vec::with_capacity(RACERS);
    for i in 0..RACERS {
        let fut = racer(i, stores[i % STORES].clone());
        let barrier = barrier.clone();
        handles.push(tokio::spawn(async move {
            barrier.wait().await;
            fut.await
        }));
    }
    let mut answers = Vec::with_capacity(RACERS);
    for h in handles {
        answers.push(h.await.expect("racer panicked"));
    }
    answers
}

/// Races creates of the tasks `make(i)`; returns the admitted tasks' ids and the
/// rejections, panicking on any other error.
async fn race_creates(
    b: &dyn Backend,
    make: impl Fn(usize) -> NewTask,
) -> (Vec<TaskId>, Vec<AdmissionRejection>) {
    let answers: Vec<StoreResult<Created>> = race(b, |i, s| {
        let new = make(i);
        async move { s.create_task(new).await }
    })
    .await;
    let mut admitted = Vec::new();
    let mut rejected = Vec::new();
    for answer in answers {
        match answer {
            Ok(c) => {
                assert!(c.created, "each racer has its own effect key: {c:?}");
                admitted.push(c.task.id);
            }
            Err(StoreError::Admission(r)) => rejected.push(r),
            Err(e) => panic!("a racing create failed with {e:?} (only admission may refuse)"),
        }
    }
    (admitted, rejected)
}

/// docs/conformance.md#create-insert: ≥ 32 creates racing on one effect key from several instances make
/// exactly one task; every racer gets it, exactly one with `created = true`.
pub async fn racing_creates_on_one_effect_key_make_one_task(b: &dyn Backend) {
    let answers = race(b, |_, s| async move {
        s.create_task(new_scoped_task("acme", "s", "race", "doc", unlimited()))
            .await
    })
    .await;
    let answers: Vec<Created> = answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|e| panic!("a racing create failed: {e:?}")))
        .collect();
    let ids: BTreeSet<TaskId> = answers.iter().map(|c| c.task.id).collect();
    assert_eq!(ids.len(), 1, "every racer gets the same task: {ids:?}");
    assert_eq!(
        answers.iter().filter(|c| c.created).count(),
        1,
        "exactly one racer created it"
    );
    let s = b.open().await;
    let stored = get_by_key(&*s, &app("acme"), "race")
        .await
        .expect("the task exists");
    assert!(ids.contains(&stored.id));
}

/// docs/conformance.md#create-idempotency, docs/conformance.md#create-insert: racing replays of one key are never refused by admission, even
/// with a budget that admits a single task: the key names the one task.
pub async fn racing_replays_are_never_refused_by_admission(b: &dyn Backend) {
    let tight = budget(1, 1, 1, 1, 1, 1);
    let answers = race(b, move |_, s| async move {
        s.create_task(new_scoped_task("acme", "s", "race", "doc", tight))
            .await
    })
    .await;
    let mut ids = BTreeSet::new();
    let mut created = 0;
    for a in answers {
        let c = a.unwrap_or_else(|e| panic!("a racing replay of one key was refused: {e:?}"));
        ids.insert(c.task.id);
        created += usize::from(c.created);
    }
    assert_eq!((ids.len(), created), (1, 1));
}

/// docs/conformance.md#admission-exact: with `scope_concurrent = 5`, 40 racing admissions in one scope admit exactly
/// 5, the rest are refused with `WORKFLOW_AI_CAPACITY`.
pub async fn racing_admissions_respect_scope_concurrent_exactly(b: &dyn Backend) {
    let limits = budget(1000, 1000, 5, 1000, 1000, 1000);
    let (admitted, rejected) = race_creates(b, |i| {
        new_scoped_task("acme", "s", &format!("k{i}"), &format!("doc-{i}"), limits)
    })
    .await;
    assert_eq!(
        admitted.len(),
        5,
        "exactly scope_concurrent tasks are admitted"
    );
    assert!(
        rejected
            .iter()
            .all(|r| *r == AdmissionRejection::ScopeCapacity { limit: 5 }),
        "{rejected:?}"
    );
}

/// docs/conformance.md#admission: with `global_concurrent = 5`, 40 racing admissions in 40 scopes (of two apps)
/// admit exactly 5.
pub async fn racing_admissions_respect_global_concurrent_exactly(b: &dyn Backend) {
    let limits = budget(1000, 1000, 1000, 5, 1000, 1000);
    let (admitted, rejected) = race_creates(b, |i| {
        let app_name = if i % 2 == 0 { "acme" } else { "globex" };
        new_scoped_task(
            app_name,
            &format!("scope-{i}"),
            &format!("k{i}"),
            "doc",
            limits,
        )
    })
    .await;
    assert_eq!(
        admitted.len(),
        5,
        "exactly global_concurrent tasks are admitted"
    );
    assert!(
        rejected
            .iter()
            .all(|r| *r == AdmissionRejection::GlobalCapacity { limit: 5 }),
        "{rejected:?}"
    );
}

/// docs/conformance.md#admission: at a frozen clock, 40 racing admissions against a bucket of `burst = 7`
/// admit exactly 7.
pub async fn racing_admissions_respect_the_token_bucket_exactly(b: &dyn Backend) {
    let limits = budget(1000, 1000, 1000, 1000, 7, 1);
    let (admitted, rejected) = race_creates(b, |i| {
        new_scoped_task("acme", "s", &format!("k{i}"), &format!("doc-{i}"), limits)
    })
    .await;
    assert_eq!(admitted.len(), 7, "exactly burst tasks are admitted");
    assert!(
        rejected
            .iter()
            .all(|r| matches!(r, AdmissionRejection::RateLimit { .. })),
        "{rejected:?}"
    );
}

/// docs/conformance.md#admission: racing admissions never exceed `sources_per_24_hours` (40 new sources, limit 6)
/// nor `max_steps_per_source` (40 new steps of one source, limit 6).
pub async fn racing_admissions_respect_daily_and_source_budgets_exactly(b: &dyn Backend) {
    let sources = budget(1000, 6, 1000, 1000, 1000, 1000);
    let (admitted, rejected) = race_creates(b, |i| {
        new_scoped_task(
            "acme",
            "daily",
            &format!("d{i}"),
            &format!("doc-{i}"),
            sources,
        )
    })
    .await;
    assert_eq!(
        admitted.len(),
        6,
        "exactly sources_per_24_hours sources are admitted"
    );
    assert!(
        rejected
            .iter()
            .all(|r| *r == AdmissionRejection::DailyBudget { limit: 6 }),
        "{rejected:?}"
    );

    let steps = budget(6, 1000, 1000, 1000, 1000, 1000);
    let (admitted, rejected) = race_creates(b, |i| {
        with_input(
            new_scoped_task("acme", "steps", &format!("s{i}"), "doc", steps),
            &format!("step {i}"),
        )
    })
    .await;
    assert_eq!(
        admitted.len(),
        6,
        "exactly max_steps_per_source steps are admitted"
    );
    assert!(
        rejected
            .iter()
            .all(|r| *r == AdmissionRejection::SourceBudget { limit: 6 }),
        "{rejected:?}"
    );
}

async fn queued_tasks(b: &dyn Backend, n: usize) -> Vec<TaskId> {
    let s = b.open().await;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        ids.push(
            create_new(&*s, new_app_task("acme", "s", &format!("task-{i}")))
                .await
                .id,
        );
    }
    ids
}

/// docs/conformance.md#lifecycle: many workers on several instances racing `claim_task` over the same tasks
/// claim each task exactly once.
pub async fn racing_claims_claim_each_task_once(b: &dyn Backend) {
    let ids = Arc::new(queued_tasks(b, 30).await);
    let claims = race(b, |i, s| {
        let ids = ids.clone();
        async move {
            let w = WorkerId::new(format!("w{i}")).expect("worker id");
            let mut mine = Vec::new();
            for k in 0..ids.len() {
                let id = ids[(k + i) % ids.len()];
                if let Some(t) = s.claim_task(id, &w).await.expect("claim_task") {
                    assert_eq!(t.worker.as_ref(), Some(&w));
                    mine.push(id);
                }
            }
            (w, mine)
        }
    })
    .await;
    check_claimed_once(b, &ids, claims).await;
}

/// docs/conformance.md#lifecycle, docs/conformance.md#sweep-recovery: many workers racing `claim_next` claim each task exactly once. (An empty
/// answer does not prove the queue is empty, so workers look again until all are taken.)
pub async fn racing_claim_next_claims_each_task_once(b: &dyn Backend) {
    let ids = Arc::new(queued_tasks(b, 30).await);
    let total = ids.len();
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let claims = race(b, |i, s| {
        let taken = taken.clone();
        async move {
            let w = WorkerId::new(format!("w{i}")).expect("worker id");
            let mut mine = Vec::new();
            let mut largest = 0;
            for _ in 0..10_000 {
                if taken.load(std::sync::atomic::Ordering::SeqCst) >= total {
                    assert!(largest <= 3, "claim_next(limit 3) returned {largest} tasks");
                    return (w, mine);
                }
                let got = s.claim_next(&w, 3).await.expect("claim_next");
                // Checked after the race, so one bad answer does not strand the others.
                largest = largest.max(got.len());
                taken.fetch_add(got.len(), std::sync::atomic::Ordering::SeqCst);
                if got.is_empty() {
                    tokio::task::yield_now().await;
                }
                mine.extend(got.into_iter().map(|t| t.id));
            }
            panic!("worker {w} gave up: tasks stayed unclaimed");
        }
    })
    .await;
    check_claimed_once(b, &ids, claims).await;
}

async fn check_claimed_once(b: &dyn Backend, ids: &[TaskId], claims: Vec<(WorkerId, Vec<TaskId>)>) {
    let mut by_task: BTreeMap<TaskId, Vec<WorkerId>> = BTreeMap::new();
    for (w, mine) in claims {
        for id in mine {
            by_task.entry(id).or_default().push(w.clone());
        }
    }
    assert_eq!(by_task.len(), ids.len(), "every task is claimed");
    let s = b.open().await;
    for (id, workers) in by_task {
        assert_eq!(workers.len(), 1, "task {id} was claimed by {workers:?}");
        let t = get(&*s, &app("acme"), id).await;
        assert_eq!((t.status, t.attempt), (TaskStatus::Running, 1));
        assert_eq!(
            t.worker.as_ref(),
            Some(&workers[0]),
            "the stored worker is the one that claimed it"
        );
    }
}

/// docs/conformance.md#application-tasks: owner deletion is serialized with task creation: with creates racing a
/// deletion, every created task is either counted as deleted or still there.
pub async fn delete_owner_data_racing_creates_loses_no_task(b: &dyn Backend) {
    let answers = race(b, |i, s| async move {
        if i == RACERS / 2 {
            Err(s
                .delete_owner_data(&app("acme"), &scope("s"), None)
                .await
                .expect("delete_owner_data"))
        } else {
            let created = s
                .create_task(new_app_task("acme", "s", &format!("k{i}")))
                .await
                .expect("create_task");
            assert!(created.created);
            Ok(created.task.id)
        }
    })
    .await;
    let deleted = answers
        .iter()
        .find_map(|a| a.as_ref().err().copied())
        .expect("the deletion answered");
    let created: Vec<TaskId> = answers.into_iter().filter_map(Result::ok).collect();
    let s = b.open().await;
    let mut remaining = 0;
    for id in &created {
        remaining += u64::from(try_get(&*s, &app("acme"), *id).await.is_some());
    }
    assert_eq!(
        deleted + remaining,
        created.len() as u64,
        "deleted {deleted} + remaining {remaining} must be every created task"
    );
}

/// docs/conformance.md#sweeps: sweeps of several replicas at once never wait on each other's rows and never
/// finish a task twice: every expired task is finished exactly once in total.
pub async fn racing_sweeps_finish_each_task_once(b: &dyn Backend) {
    let ids = queued_tasks(b, 30).await;
    b.clock().advance(secs(601));
    let config = tollgate_store::SweepConfig {
        batch_size: 4,
        ..sweep_config()
    };
    let reports = race(b, move |_, s| {
        let config = config.clone();
        async move { sweep_all(&*s, &config).await }
    })
    .await;
    let total: u64 = reports.iter().map(|r| r.queue_timed_out).sum();
    assert_eq!(
        total, 30,
        "each expired task is counted once across all sweepers"
    );
    let mut finished: Vec<TaskId> = reports.into_iter().flat_map(|r| r.finished).collect();
    finished.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(
        finished, expected,
        "each expired task is finished by exactly one sweeper"
    );
    let s = b.open().await;
    for id in ids {
        assert_eq!(get(&*s, &app("acme"), id).await.status, TaskStatus::Failed);
    }
}

/// docs/budgets.md, "Each app's share of the global capacity": `global_concurrent = 12`,
/// three apps with a share of 2 each (6 reserved, 6 lent). 40 racing admissions in 40
/// scopes (most of them from `acme`, which floods) admit exactly 12: every app gets at
/// least its share, none more than its share plus the 6 lent, and no app takes another's
/// share (`Σ max(admitted, share) ≤ 12`). Refusals name the app's share, not the service.
pub async fn racing_admissions_respect_each_apps_global_share_exactly(b: &dyn Backend) {
    let share = tollgate_core::GlobalShare {
        share: 2,
        reserved: 6,
    };
    let limits = tollgate_core::Budget {
        global_share: Some(share),
        ..budget(1000, 1000, 1000, 12, 1000, 1000)
    };
    let app_of = |i: usize| match i % 8 {
        0 => "globex",
        1 => "initech",
        _ => "acme",
    };
    let answers: Vec<StoreResult<Created>> = race(b, |i, s| {
        let new = new_scoped_task(
            app_of(i),
            &format!("scope-{i}"),
            &format!("k{i}"),
            "doc",
            limits,
        );
        async move { s.create_task(new).await }
    })
    .await;
    let mut per_app: BTreeMap<&str, u32> = BTreeMap::new();
    let mut rejected = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        match answer {
            Ok(c) => *per_app.entry(app_of(i)).or_default() += u32::from(c.created),
            Err(StoreError::Admission(r)) => rejected.push(r),
            Err(e) => panic!("a racing create failed with {e:?} (only admission may refuse)"),
        }
    }
    let total: u32 = per_app.values().sum();
    assert_eq!(total, 12, "exactly global_concurrent tasks: {per_app:?}");
    for a in ["acme", "globex", "initech"] {
        let n = per_app.get(a).copied().unwrap_or(0);
        assert!(
            (2..=8).contains(&n),
            "app {a} got {n} slots, outside its share 2 plus the 6 lent: {per_app:?}"
        );
    }
    let claimed: u32 = per_app.values().map(|n| (*n).max(2)).sum();
    assert!(claimed <= 12, "an app took another's share: {per_app:?}");
    assert!(
        rejected.iter().all(|r| matches!(
            r,
            AdmissionRejection::AppCapacity {
                share: 2,
                lendable: 6,
                ..
            }
        )),
        "{rejected:?}"
    );
}

/// docs/budgets.md, "Each app's share of the global capacity": one app filling the
/// service cannot lock another out. With `global_concurrent = 10` and two apps of share
/// 3, `acme` gets 7 (its 3 and the 4 lent) and is then refused naming its share;
/// `globex` still gets its 3; when `acme`'s tasks end, its slots (and the lent ones)
/// come back.
pub async fn one_app_filling_the_service_leaves_the_others_their_share(b: &dyn Backend) {
    let s = b.open().await;
    let limits = tollgate_core::Budget {
        global_share: Some(tollgate_core::GlobalShare {
            share: 3,
            reserved: 6,
        }),
        ..budget(1000, 1000, 1000, 10, 1000, 1000)
    };
    let mut flood = Vec::new();
    for i in 0..7 {
        let new = new_scoped_task("acme", &format!("a{i}"), &format!("a{i}"), "doc", limits);
        flood.push(create_new(&*s, new).await.id);
    }
    let refused = rejection(&*s, new_scoped_task("acme", "a7", "a7", "doc", limits)).await;
    assert_eq!(
        refused,
        AdmissionRejection::AppCapacity {
            in_use: 7,
            share: 3,
            lendable: 4
        }
    );
    for i in 0..3 {
        create_new(
            &*s,
            new_scoped_task("globex", &format!("g{i}"), &format!("g{i}"), "doc", limits),
        )
        .await;
    }
    assert!(matches!(
        rejection(&*s, new_scoped_task("globex", "g3", "g3", "doc", limits)).await,
        AdmissionRejection::AppCapacity { in_use: 3, .. }
    ));
    // Two of acme's tasks end: two lent slots are free again, for either app.
    for id in flood.iter().take(2) {
        cancel(&*s, &app("acme"), *id).await;
    }
    create_new(&*s, new_scoped_task("globex", "g4", "g4", "doc", limits)).await;
    create_new(&*s, new_scoped_task("acme", "a8", "a8", "doc", limits)).await;
    assert!(matches!(
        rejection(&*s, new_scoped_task("acme", "a9", "a9", "doc", limits)).await,
        AdmissionRejection::AppCapacity { .. }
    ));
}

/// docs/budgets.md, "Each app's share of the global capacity": an app's count of queued
/// or running admitted tasks is one count whether or not it had a share when each was
/// admitted, and tasks ending give back on it. With `global_concurrent = 10` and shares
/// of 3 (4 lent): `acme` admits 3 without a share and one ends (2 in use); `globex`
/// takes its 3 and the 2 lent slots `acme`'s 2 leave; `acme` then gets its own third
/// slot and the 2 lent ones it gave back by holding its share, and is refused at 5. Two
/// of its tasks ending give back two; with shares removed only the service's cap applies.
pub async fn an_apps_count_carries_across_its_share_being_set_and_removed(b: &dyn Backend) {
    let s = b.open().await;
    let unshared = budget(1000, 1000, 1000, 10, 1000, 1000);
    let shared = tollgate_core::Budget {
        global_share: Some(tollgate_core::GlobalShare {
            share: 3,
            reserved: 6,
        }),
        ..unshared
    };
    let scoped = |a: &str, i: &str, limits| new_scoped_task(a, i, i, "doc", limits);
    let full = |in_use| AdmissionRejection::AppCapacity {
        in_use,
        share: 3,
        lendable: 4,
    };
    let mut acme = Vec::new();
    for i in 0..3 {
        acme.push(
            create_new(&*s, scoped("acme", &format!("u{i}"), unshared))
                .await
                .id,
        );
    }
    cancel(&*s, &app("acme"), acme.remove(0)).await;
    for i in 0..5 {
        create_new(&*s, scoped("globex", &format!("g{i}"), shared)).await;
    }
    assert_eq!(
        rejection(&*s, scoped("globex", "g5", shared)).await,
        full(5),
        "acme's 2 admitted without a share hold 2 of the lent slots"
    );
    for i in 0..3 {
        acme.push(
            create_new(&*s, scoped("acme", &format!("s{i}"), shared))
                .await
                .id,
        );
    }
    assert_eq!(
        rejection(&*s, scoped("acme", "s3", shared)).await,
        full(5),
        "the 2 admitted without a share count against acme's share"
    );
    for id in acme.drain(..2) {
        cancel(&*s, &app("acme"), id).await;
    }
    for i in 4..6 {
        create_new(&*s, scoped("acme", &format!("s{i}"), shared)).await;
    }
    assert_eq!(rejection(&*s, scoped("acme", "s6", shared)).await, full(5));
    // Without shares, only the service's cap (10, all in use) applies.
    assert_eq!(
        rejection(&*s, scoped("acme", "u9", unshared)).await,
        AdmissionRejection::GlobalCapacity { limit: 10 }
    );
    cancel(&*s, &app("acme"), acme.remove(0)).await;
    create_new(&*s, scoped("acme", "u10", unshared)).await;
}
