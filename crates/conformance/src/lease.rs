//! docs/conformance.md#lease-fence: every write a worker makes about a task it executes
//! names its lease (the worker and the claim it got the task by) and applies only while
//! the task runs under both. The case that matters is a stale execution of the *same*
//! worker: its task went silent, the sweep put it back in the queue, and the same worker
//! (same worker id) claimed it again while the first execution still ran. Every write of
//! the stale execution is refused and changes nothing; the current one goes on.

use super::Backend;
use super::cost::{cost_budget, priced_task, reserve, tokens};
use super::fixtures::*;
use std::sync::Arc;
use tollgate_core::{
    AttemptOutcome, Clock, ErrorCode, Lease, MaxAttempts, NewTask, Task, TaskError, TaskStatus,
    WorkerId,
};
use tollgate_store::{AttemptEnd, SpendWindow, Store};

const DEPLOYMENT: &str = "openai/gpt-test";

fn three_tries(key: &str, doc: &str) -> NewTask {
    let budget = cost_budget(Some(100_000_000), None, None);
    let mut t = priced_task("acme", "s", key, doc, budget, reserve(100, 50));
    t.max_attempts = MaxAttempts::new(3).expect("1..=20");
    t
}

async fn spend(s: &dyn Store) -> SpendWindow {
    s.spend(&app("acme"), Some(&scope("s")))
        .await
        .expect("spend")
}

/// A task the same worker claimed twice: claim 1 went silent and was requeued by the
/// sweep, claim 2 is current (its attempt 2 open). Returns the stale and current leases.
async fn claimed_again(
    b: &dyn Backend,
    s: &dyn Store,
    w: &WorkerId,
    key: &str,
) -> (Task, Lease, Lease) {
    let t = create_new(s, three_tries(key, &format!("doc-{key}"))).await;
    let stale = claim(s, t.id, w).await;
    b.clock().advance(secs(31));
    assert_eq!(
        sweep_all(s, &sweep_config()).await.requeued,
        vec![(app("acme"), t.id)],
        "the silent claim goes back to the queue"
    );
    let current = claim(s, t.id, w).await;
    assert_eq!((stale.attempt, current.attempt), (1, 2), "claims 1 and 2");
    let (stale, current) = (
        stale.lease().expect("claimed"),
        current.lease().expect("claimed"),
    );
    assert_eq!((&stale.worker, &current.worker), (w, w), "the same worker");
    (t, stale, current)
}

/// What a stale write must leave as it was: the task row and its attempts.
async fn snapshot(s: &dyn Store, t: &Task) -> (Task, Vec<tollgate_core::Attempt>, SpendWindow) {
    let got = get(s, &app("acme"), t.id).await;
    let attempts = s.task_attempts(&app("acme"), t.id).await.expect("attempts");
    (got, attempts, spend(s).await)
}

/// The heartbeat of a stale lease keeps nothing alive: asked about both claims in one
/// call, the current one is alive and the stale one told to stop; asked about the stale
/// one alone, the task's liveness does not move.
pub async fn a_stale_lease_keeps_nothing_alive(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("pool");
    let (t, stale, current) = claimed_again(b, &*s, &w, "a").await;
    b.clock().advance(secs(5));
    let before = get(&*s, &app("acme"), t.id).await.heartbeat_at;
    let report = s
        .heartbeat(&w, &[(t.id, stale.claim)])
        .await
        .expect("heartbeat");
    assert_eq!(
        (report.alive, report.stop),
        (vec![], vec![(t.id, stale.claim)]),
        "the stale execution is told to stop"
    );
    assert_eq!(
        get(&*s, &app("acme"), t.id).await.heartbeat_at,
        before,
        "and its heartbeat changed nothing"
    );
    let report = s
        .heartbeat(&w, &[(t.id, stale.claim), (t.id, current.claim)])
        .await
        .expect("heartbeat");
    assert_eq!(report.alive, vec![(t.id, current.claim)]);
    assert_eq!(report.stop, vec![(t.id, stale.claim)]);
    assert_eq!(
        get(&*s, &app("acme"), t.id).await.heartbeat_at,
        Some(b.clock().now()),
        "the current claim's heartbeat keeps the task alive"
    );
}

/// A stale lease fails nothing: the task stays running under the current claim, nothing
/// is settled; the current lease fails it.
pub async fn a_stale_lease_fails_nothing(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("pool");
    let (t, stale, current) = claimed_again(b, &*s, &w, "a").await;
    let before = snapshot(&*s, &t).await;
    let fail = |held: Lease| {
        let s = s.clone();
        async move {
            s.fail_task(
                t.id,
                Some(&held),
                ErrorCode::ProviderError,
                "late",
                Some(&tokens(10, 5)),
            )
            .await
        }
    };
    assert_refused(fail(stale).await, "the stale execution's failure");
    assert_eq!(snapshot(&*s, &t).await, before, "changed nothing");
    assert!(fail(current).await.expect("fail").applied);
    assert_eq!(
        get(&*s, &app("acme"), t.id).await.status,
        TaskStatus::Failed
    );
}

/// A stale lease completes nothing through `complete_task` either (no claimed copy: the
/// lease alone fences it).
pub async fn a_stale_lease_completes_nothing(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("pool");
    let (t, stale, current) = claimed_again(b, &*s, &w, "a").await;
    let before = snapshot(&*s, &t).await;
    assert_refused(
        s.complete_task(t.id, &stale, spam(), tokens(10, 5)).await,
        "the stale execution's completion",
    );
    assert_eq!(snapshot(&*s, &t).await, before, "changed nothing");
    let done = s
        .complete_task(t.id, &current, spam(), tokens(10, 5))
        .await
        .expect("complete");
    assert!(done.applied, "the current claim completes it");
}

/// A stale lease reserves nothing: `None`, and the scope's spend and the task's
/// reservation are as they were; the current lease reserves.
pub async fn a_stale_lease_reserves_nothing(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("pool");
    let (t, stale, current) = claimed_again(b, &*s, &w, "a").await;
    let before = snapshot(&*s, &t).await;
    assert_eq!(
        s.reserve_attempt(t.id, &stale, &reserve(100, 50))
            .await
            .expect("reserve_attempt"),
        None,
        "the stale execution's re-ask is not reserved"
    );
    assert_eq!(snapshot(&*s, &t).await, before, "changed nothing");
    s.reserve_attempt(t.id, &current, &reserve(100, 50))
        .await
        .expect("reserve_attempt")
        .expect("the current claim's re-ask fits");
    assert!(spend(&*s).await.reserved_nano > before.2.reserved_nano);
}

/// A stale lease begins no attempt and moves none: the current claim's open attempt
/// stays on its deployment, and once it ended only the current lease begins the next.
pub async fn a_stale_lease_begins_and_redirects_no_attempt(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("pool");
    let (t, stale, current) = claimed_again(b, &*s, &w, "a").await;
    let before = snapshot(&*s, &t).await;
    assert!(
        !s.redirect_attempt(t.id, &stale, current.claim, DEPLOYMENT)
            .await
            .expect("redirect_attempt"),
        "the stale execution cannot move the current claim's attempt"
    );
    assert_eq!(snapshot(&*s, &t).await, before, "changed nothing");
    let unavailable = AttemptEnd {
        outcome: AttemptOutcome::Unavailable,
        usage: None,
        prices: None,
        error: Some(TaskError::new(ErrorCode::ProviderError, "HTTP 503")),
    };
    assert!(
        s.end_attempt(t.id, current.claim, &unavailable)
            .await
            .expect("end_attempt")
    );
    let before = snapshot(&*s, &t).await;
    assert_eq!(
        s.begin_attempt(t.id, &stale, DEPLOYMENT)
            .await
            .expect("begin_attempt"),
        None,
        "the stale execution begins no attempt"
    );
    assert_eq!(snapshot(&*s, &t).await, before, "changed nothing");
    assert_eq!(
        s.begin_attempt(t.id, &current, DEPLOYMENT)
            .await
            .expect("begin_attempt"),
        Some(3),
        "the current claim begins its next attempt"
    );
    assert!(
        s.redirect_attempt(t.id, &current, 3, "openai/gpt-other")
            .await
            .expect("redirect_attempt"),
        "and moves it"
    );
}

/// A stale lease hands nothing back: the task stays running under the current claim
/// (a stale hand-back would have put the current execution's task back in the queue
/// behind its back); the current lease hands it back.
pub async fn a_stale_lease_hands_nothing_back(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("pool");
    let (t, stale, current) = claimed_again(b, &*s, &w, "a").await;
    let before = snapshot(&*s, &t).await;
    assert!(
        !s.requeue_task(t.id, &stale, "shutting down")
            .await
            .expect("requeue_task"),
        "the stale execution's hand-back is refused"
    );
    assert_eq!(snapshot(&*s, &t).await, before, "changed nothing");
    assert!(
        s.requeue_task(t.id, &current, "shutting down")
            .await
            .expect("requeue_task")
    );
    let got = get(&*s, &app("acme"), t.id).await;
    assert_eq!((got.status, got.worker), (TaskStatus::Queued, None));
}

/// Stale and current executions of the same worker race on every task, from several
/// store instances at once: the stale one re-asks, fails, hands back and completes, the
/// current one completes. Every task ends succeeded with the current execution's output
/// and usage, its attempts `[interrupted, succeeded]`, nothing left reserved, and the
/// settled spend exactly the interrupted attempts' reservations plus the current
/// executions' usage — whatever order the writes landed in.
pub async fn racing_stale_and_current_executions_end_each_task_by_the_current_one(b: &dyn Backend) {
    const TASKS: usize = 12;
    let s = b.open().await;
    let w = worker("pool");
    let mut leased = Vec::with_capacity(TASKS);
    for i in 0..TASKS {
        let t = create_new(&*s, three_tries(&format!("k{i}"), &format!("doc-{i}"))).await;
        let stale = claim(&*s, t.id, &w).await;
        leased.push((t, stale));
    }
    b.clock().advance(secs(31));
    assert_eq!(sweep_all(&*s, &sweep_config()).await.requeued.len(), TASKS);
    let mut tasks = Vec::with_capacity(TASKS);
    for (t, stale) in leased {
        let current = claim(&*s, t.id, &w).await;
        tasks.push((
            t.id,
            stale.lease().expect("claimed"),
            current.lease().expect("claimed"),
        ));
    }
    let stores: Vec<Arc<dyn Store>> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(b.open().await);
        }
        v
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(TASKS * 2));
    let mut handles = Vec::new();
    for (i, (id, stale, current)) in tasks.iter().cloned().enumerate() {
        let (a, c) = (stores[i % 4].clone(), stores[(i + 1) % 4].clone());
        let start = barrier.clone();
        handles.push(tokio::spawn(async move {
            start.wait().await;
            let reserved = a
                .reserve_attempt(id, &stale, &reserve(100, 50))
                .await
                .expect("reserve_attempt");
            let failed = a
                .fail_task(id, Some(&stale), ErrorCode::ProviderError, "stale", None)
                .await
                .expect("fail_task");
            let handed = a
                .requeue_task(id, &stale, "stale")
                .await
                .expect("requeue_task");
            let completed = a
                .complete_task(id, &stale, spam(), tokens(1, 1))
                .await
                .expect("complete_task");
            assert_eq!(reserved, None, "a stale re-ask of {id} was reserved");
            assert!(!failed.applied, "a stale failure of {id} applied");
            assert!(!handed, "a stale hand-back of {id} applied");
            assert!(!completed.applied, "a stale completion of {id} applied");
        }));
        let start = barrier.clone();
        handles.push(tokio::spawn(async move {
            start.wait().await;
            let done = c
                .complete_task(id, &current, spam(), tokens(10, 5))
                .await
                .expect("complete_task");
            assert!(done.applied, "the current completion of {id} was refused");
        }));
    }
    for h in handles {
        h.await.expect("racer panicked");
    }
    for (id, _, current) in &tasks {
        let got = get(&*s, &app("acme"), *id).await;
        assert_eq!(got.status, TaskStatus::Succeeded);
        assert_eq!(
            got.usage,
            Some(tokens(10, 5)),
            "the current execution's usage"
        );
        assert_eq!(got.attempt, current.claim);
        let attempts = s.task_attempts(&app("acme"), *id).await.expect("attempts");
        assert_eq!(
            attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
            vec![AttemptOutcome::Interrupted, AttemptOutcome::Succeeded]
        );
    }
    let spent = spend(&*s).await;
    // Each task: its interrupted attempt's reservation (200,000 n$) and its current
    // attempt's usage of 10 + 5 tokens (20,000 n$ at the test prices).
    assert_eq!(
        (spent.reserved_nano, spent.settled_nano),
        (0, TASKS as i64 * (200_000 + 20_000))
    );
}
