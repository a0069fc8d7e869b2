//! docs/routes.md, "Attempts": a task makes attempts, each claim beginning one and each
//! later turn of the route another before its call, each ended after it; at most one is
//! open; each is charged its usage or, when
//! unknown, its reservation, and the task's settlement is their sum. A running task that
//! goes silent with tries left goes back to the queue for its next attempt (its open
//! attempt charged its reservation); with none left it fails as before. A later attempt
//! reserves before its call, and a refusal changes nothing.

use super::Backend;
use super::cost::{cost_budget, priced_task, reserve, test_prices, tokens};
use super::fixtures::*;
use tollgate_core::{AttemptOutcome, ErrorCode, MaxAttempts, NewTask, TaskError, TaskStatus};
use tollgate_store::{AttemptEnd, SpendWindow, Store, StoreError};

const DEPLOYMENT: &str = "openai/gpt-test";

fn tries(mut t: NewTask, n: u32) -> NewTask {
    t.max_attempts = MaxAttempts::new(n).expect("1..=20");
    t
}

fn ended(outcome: AttemptOutcome, usage: Option<tollgate_core::Usage>) -> AttemptEnd {
    AttemptEnd {
        outcome,
        usage,
        prices: Some(test_prices()),
        error: (outcome != AttemptOutcome::Succeeded).then(|| {
            TaskError::new(
                ErrorCode::ProviderError,
                "HTTP 503 (gave up after 3 attempts)",
            )
        }),
    }
}

/// A worker's completion of its claimed copy: 40 input and 10 output tokens, 40 × 1,000
/// + 10 × 2,000 = 60,000 n$ at the reservation's prices.
fn completion(copy: tollgate_core::Task) -> tollgate_store::Completion {
    tollgate_store::Completion {
        id: copy.id,
        lease: copy.lease().expect("a claimed copy"),
        output: spam(),
        usage: tokens(40, 10),
        claimed: Some(std::sync::Arc::new(copy)),
        attempt: None,
    }
}

async fn spend(s: &dyn Store, scope_name: &str) -> SpendWindow {
    s.spend(&app("acme"), Some(&scope(scope_name)))
        .await
        .expect("spend")
}

async fn begin(
    s: &dyn Store,
    id: tollgate_core::TaskId,
    held: &tollgate_core::Lease,
) -> Option<u32> {
    s.begin_attempt(id, held, DEPLOYMENT)
        .await
        .expect("begin_attempt")
}

/// Attempts are numbered and recorded with their deployment, times, outcome, usage and
/// charge; one at a time; ended once; settled as their sum (a failed attempt without
/// usage at its reservation); another app sees none.
pub async fn attempts_are_recorded_and_settled_as_their_sum(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let budget = cost_budget(Some(10_000_000), None, None);
    let t = create_new(
        &*s,
        tries(
            priced_task("acme", "s", "a", "doc", budget, reserve(100, 50)),
            3,
        ),
    )
    .await;
    assert_eq!(
        begin(&*s, t.id, &lease(&w, 1)).await,
        None,
        "a queued task begins no attempt"
    );
    let claimed = claim(&*s, t.id, &w).await;
    assert_eq!(claimed.attempt, 1, "the claim begins attempt 1");
    let opened = s.task_attempts(&app("acme"), t.id).await.expect("attempts");
    assert_eq!(
        opened
            .iter()
            .map(|a| (a.n, a.deployment.as_str(), a.outcome))
            .collect::<Vec<_>>(),
        vec![(1, "dev/dev-1", AttemptOutcome::Running)],
        "the claim opens its attempt on the first deployment of the task's model"
    );
    assert!(
        !s.redirect_attempt(t.id, &lease(&worker("other"), 1), 1, DEPLOYMENT)
            .await
            .expect("redirect"),
        "only its worker moves it"
    );
    assert!(
        s.redirect_attempt(t.id, &lease(&w, 1), 1, DEPLOYMENT)
            .await
            .expect("redirect"),
        "its worker moves it to the deployment the route chose"
    );
    assert_eq!(
        begin(&*s, t.id, &lease(&worker("other"), 1)).await,
        None,
        "only its worker begins one"
    );
    assert_eq!(
        begin(&*s, t.id, &lease(&w, 1)).await,
        None,
        "one attempt open at a time"
    );
    b.clock().advance(secs(2));
    let first = ended(AttemptOutcome::Unavailable, None);
    assert!(s.end_attempt(t.id, 1, &first).await.expect("end"));
    assert!(
        !s.end_attempt(t.id, 1, &first).await.expect("end"),
        "ended once"
    );
    assert_eq!(begin(&*s, t.id, &lease(&w, 1)).await, Some(2));
    s.reserve_attempt(t.id, &lease(&w, 1), &reserve(100, 50))
        .await
        .expect("reserve")
        .expect("the later attempt fits");
    let second = ended(AttemptOutcome::Succeeded, Some(tokens(10, 5)));
    assert!(s.end_attempt(t.id, 2, &second).await.expect("end"));
    s.complete_task(t.id, &lease(&w, 1), spam(), tokens(10, 5))
        .await
        .expect("complete");

    let attempts = s.task_attempts(&app("acme"), t.id).await.expect("attempts");
    assert_eq!(attempts.len(), 2);
    let (a1, a2) = (&attempts[0], &attempts[1]);
    assert_eq!((a1.n, a2.n), (1, 2));
    assert_eq!(a1.deployment, DEPLOYMENT);
    assert_eq!(a1.started_at, START);
    assert_eq!(a1.ended_at, Some(START.plus(secs(2))));
    assert_eq!(
        (a1.outcome, a2.outcome),
        (AttemptOutcome::Unavailable, AttemptOutcome::Succeeded)
    );
    assert_eq!(a1.usage, None);
    assert_eq!(
        a1.error.as_ref().map(|e| e.code),
        Some(ErrorCode::ProviderError)
    );
    assert_eq!(
        a1.reserved.nano_usd, 200_000,
        "the first attempt holds the admission's reservation"
    );
    assert_eq!(a1.charged, a1.reserved, "no usage: charged its reservation");
    assert_eq!(
        a2.reserved.nano_usd, 200_000,
        "the later attempt holds what it reserved"
    );
    assert_eq!((a2.charged.nano_usd, a2.charged.tokens), (20_000, 15));
    assert!(a2.error.is_none());
    let spent = spend(&*s, "s").await;
    assert_eq!((spent.reserved_nano, spent.reserved_tokens), (0, 0));
    assert_eq!(
        spent.settled_nano,
        200_000 + 20_000,
        "the task is charged both attempts"
    );
    assert!(
        s.task_attempts(&app("other"), t.id)
            .await
            .expect("attempts")
            .is_empty(),
        "another app sees no attempts"
    );
    assert_eq!(
        begin(&*s, t.id, &lease(&w, 1)).await,
        None,
        "a finished task begins none"
    );
}

/// A running task silent past the liveness timeout with tries left goes back to the
/// queue: its open attempt ends interrupted, charged its reservation; any worker claims
/// it again and its next attempt succeeds; the first worker can no longer end it; the
/// task is charged both attempts.
pub async fn a_lost_lease_with_tries_left_requeues_the_task(b: &dyn Backend) {
    let s = b.open().await;
    let (w1, w2) = (worker("w1"), worker("w2"));
    let budget = cost_budget(Some(10_000_000), None, None);
    let t = create_new(
        &*s,
        tries(
            priced_task("acme", "s", "a", "doc", budget, reserve(100, 50)),
            3,
        ),
    )
    .await;
    claim(&*s, t.id, &w1).await;
    b.clock().advance(secs(31));
    let report = sweep_all(&*s, &sweep_config()).await;
    assert_eq!(report.interrupted, 0);
    assert_eq!(report.requeued, vec![(app("acme"), t.id)]);
    assert!(report.finished.is_empty());
    let got = get(&*s, &app("acme"), t.id).await;
    assert_eq!(got.status, TaskStatus::Queued, "back in the queue");
    assert_eq!(got.worker, None);
    let attempts = s.task_attempts(&app("acme"), t.id).await.expect("attempts");
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].outcome, AttemptOutcome::Interrupted);
    assert_eq!(
        attempts[0].charged.nano_usd, 200_000,
        "charged its reservation"
    );
    assert_eq!(
        spend(&*s, "s").await.reserved_nano,
        200_000,
        "still reserved until the task ends"
    );

    // Any worker claims it again, in dispatch order.
    let claimed = s.claim_next(&w2, 10).await.expect("claim_next");
    assert_eq!(claimed.iter().map(|t| t.id).collect::<Vec<_>>(), vec![t.id]);
    assert_eq!(claimed[0].attempt, 2, "claimed a second time");
    assert_eq!(
        begin(&*s, t.id, &lease(&w1, 1)).await,
        None,
        "the first worker lost it"
    );
    assert_eq!(
        begin(&*s, t.id, &lease(&w2, 2)).await,
        None,
        "the second claim opened attempt 2"
    );
    s.reserve_attempt(t.id, &lease(&w2, 2), &reserve(100, 50))
        .await
        .expect("reserve")
        .expect("fits");
    assert!(
        !s.end_attempt(
            t.id,
            1,
            &ended(AttemptOutcome::Succeeded, Some(tokens(1, 1)))
        )
        .await
        .expect("end"),
        "the interrupted attempt cannot be ended again"
    );
    assert!(
        s.end_attempt(
            t.id,
            2,
            &ended(AttemptOutcome::Succeeded, Some(tokens(10, 5)))
        )
        .await
        .expect("end")
    );
    assert_refused(
        s.complete_task(t.id, &lease(&w1, 1), spam(), tokens(10, 5))
            .await,
        "the first worker's completion",
    );
    let done = s
        .complete_task(t.id, &lease(&w2, 2), spam(), tokens(10, 5))
        .await
        .expect("complete");
    assert!(done.applied);
    let spent = spend(&*s, "s").await;
    assert_eq!(spent.reserved_nano, 0);
    assert_eq!(
        spent.settled_nano,
        200_000 + 20_000,
        "charged both attempts"
    );
}

/// `max_attempts = 1` keeps today's behaviour: a silent task whose one attempt began
/// fails with `WORKFLOW_AI_INTERRUPTED`, charged its reservation; so does a task that
/// made all its attempts.
pub async fn one_attempt_fails_a_lost_lease_as_before(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let budget = cost_budget(Some(10_000_000), None, None);
    let once = create_new(
        &*s,
        tries(
            priced_task("acme", "s", "a", "doc", budget, reserve(100, 50)),
            1,
        ),
    )
    .await;
    let twice = create_new(
        &*s,
        tries(
            priced_task("acme", "s", "b", "doc2", budget, reserve(100, 50)),
            2,
        ),
    )
    .await;
    claim(&*s, once.id, &w).await;
    claim(&*s, twice.id, &w).await;
    assert!(
        s.end_attempt(twice.id, 1, &ended(AttemptOutcome::Unavailable, None))
            .await
            .expect("end")
    );
    assert_eq!(begin(&*s, twice.id, &lease(&w, 1)).await, Some(2));
    assert_eq!(
        s.begin_attempt(twice.id, &lease(&w, 1), DEPLOYMENT)
            .await
            .expect("begin"),
        None
    );
    b.clock().advance(secs(31));
    let report = sweep_all(&*s, &sweep_config()).await;
    assert!(
        report.requeued.is_empty(),
        "no tries left: nothing requeued"
    );
    assert_eq!(report.interrupted, 2);
    for id in [once.id, twice.id] {
        let t = get(&*s, &app("acme"), id).await;
        assert_eq!(t.status, TaskStatus::Failed);
        assert_eq!(t.error.map(|e| e.code), Some(ErrorCode::Interrupted));
        let last = s.task_attempts(&app("acme"), id).await.expect("attempts");
        let last = last.last().expect("an attempt");
        assert_eq!(
            last.outcome,
            AttemptOutcome::Interrupted,
            "its open attempt ends with it"
        );
        assert!(last.ended_at.is_some());
    }
    let spent = spend(&*s, "s").await;
    assert_eq!(spent.reserved_nano, 0);
    // `once`: its reservation; `twice`: two attempts, the second reserved nothing more.
    assert_eq!(spent.settled_nano, 200_000 + 200_000);
}

/// A later attempt reserves before its call like a re-ask: when it does not fit, it is
/// refused, nothing changes, and the task's end settles the attempts it spent.
pub async fn a_later_attempt_refused_by_the_budget_settles_the_spent_attempts(b: &dyn Backend) {
    let s = b.open().await;
    let (w1, w2) = (worker("w1"), worker("w2"));
    // Room for one attempt's 200,000 n$, not two.
    let budget = cost_budget(Some(300_000), None, None);
    let t = create_new(
        &*s,
        tries(
            priced_task("acme", "s", "a", "doc", budget, reserve(100, 50)),
            3,
        ),
    )
    .await;
    claim(&*s, t.id, &w1).await;
    b.clock().advance(secs(31));
    assert_eq!(sweep_all(&*s, &sweep_config()).await.requeued.len(), 1);
    claim(&*s, t.id, &w2).await;
    assert_eq!(
        begin(&*s, t.id, &lease(&w2, 2)).await,
        None,
        "the second claim opened attempt 2"
    );
    match s
        .reserve_attempt(t.id, &lease(&w2, 2), &reserve(100, 50))
        .await
    {
        Err(StoreError::Cost(c)) => assert_eq!(c.code(), ErrorCode::SpendBudget, "{c}"),
        other => panic!("the later attempt must not fit, got {other:?}"),
    }
    assert_eq!(
        spend(&*s, "s").await.reserved_nano,
        200_000,
        "a refusal changes nothing"
    );
    let refused = AttemptEnd {
        outcome: AttemptOutcome::Refused,
        usage: Some(tollgate_core::Usage::default()),
        prices: Some(test_prices()),
        error: Some(TaskError::new(
            ErrorCode::SpendBudget,
            "the next attempt does not fit",
        )),
    };
    assert!(s.end_attempt(t.id, 2, &refused).await.expect("end"));
    s.fail_task(
        t.id,
        None,
        ErrorCode::SpendBudget,
        "the next attempt does not fit",
        None,
    )
    .await
    .expect("fail");
    let attempts = s.task_attempts(&app("acme"), t.id).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.outcome, a.charged.nano_usd))
            .collect::<Vec<_>>(),
        vec![
            (AttemptOutcome::Interrupted, 200_000),
            (AttemptOutcome::Refused, 0)
        ]
    );
    let spent = spend(&*s, "s").await;
    assert_eq!(
        (spent.reserved_nano, spent.settled_nano),
        (0, 200_000),
        "the spent attempt settled"
    );
}

/// A worker fails only the task it holds, as it completes only that one: once its lease
/// was lost (the task went back to the queue, then to another worker) its failure is
/// refused and changes nothing, and the task's new worker finishes it.
pub async fn a_worker_that_lost_its_lease_cannot_fail_the_task(b: &dyn Backend) {
    let s = b.open().await;
    let (w1, w2) = (worker("w1"), worker("w2"));
    let budget = cost_budget(Some(10_000_000), None, None);
    let t = create_new(
        &*s,
        tries(
            priced_task("acme", "s", "a", "doc", budget, reserve(100, 50)),
            3,
        ),
    )
    .await;
    let late = |held: tollgate_core::Lease| {
        let s = s.clone();
        async move {
            s.fail_task(t.id, Some(&held), ErrorCode::ProviderError, "late", None)
                .await
        }
    };
    assert_refused(
        late(lease(&w1, 1)).await,
        "a queued task failed by a worker",
    );
    claim(&*s, t.id, &w1).await;
    assert_refused(
        late(lease(&w2, 1)).await,
        "a failure by a worker that does not hold it",
    );
    b.clock().advance(secs(31));
    assert_eq!(sweep_all(&*s, &sweep_config()).await.requeued.len(), 1);
    assert_refused(
        late(lease(&w1, 1)).await,
        "the failure of a worker whose task was requeued",
    );
    claim(&*s, t.id, &w2).await;
    assert_refused(
        late(lease(&w1, 1)).await,
        "the failure of a worker whose task another claimed",
    );
    assert_refused(
        late(lease(&w2, 1)).await,
        "the failure of the new worker under a claim it never made",
    );
    let got = get(&*s, &app("acme"), t.id).await;
    assert_eq!(
        (got.status, got.worker.as_ref()),
        (TaskStatus::Running, Some(&w2)),
        "the refused failures changed nothing"
    );
    assert_eq!(spend(&*s, "s").await.settled_nano, 0, "nothing settled yet");
    let failed = late(lease(&w2, 2)).await.expect("fail");
    assert!(failed.applied, "its worker fails it");
    assert_eq!(
        get(&*s, &app("acme"), t.id).await.error.map(|e| e.code),
        Some(ErrorCode::ProviderError)
    );
    let spent = spend(&*s, "s").await;
    assert_eq!(
        (spent.reserved_nano, spent.settled_nano),
        (0, 200_000),
        "charged the interrupted attempt's reservation"
    );
}

/// The claim fence: a worker whose task was requeued while its execution still ran (its
/// heartbeats starved past the liveness timeout) and that claimed the task again —
/// the same worker id — completes nothing with the execution of its earlier claim: the
/// completion carries the claimed copy, and only the current claim's applies; the
/// current execution completes it, and its attempt ends with it.
pub async fn a_stale_claim_of_the_same_worker_completes_nothing(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("pool");
    let budget = cost_budget(Some(10_000_000), None, None);
    let t = create_new(
        &*s,
        tries(
            priced_task("acme", "s", "a", "doc", budget, reserve(100, 50)),
            3,
        ),
    )
    .await;
    let stale = std::sync::Arc::new(claim(&*s, t.id, &w).await);
    b.clock().advance(secs(31));
    assert_eq!(sweep_all(&*s, &sweep_config()).await.requeued.len(), 1);
    let current = std::sync::Arc::new(claim(&*s, t.id, &w).await);
    assert_eq!((stale.attempt, current.attempt), (1, 2));
    let completion = |copy: &std::sync::Arc<tollgate_core::Task>| tollgate_store::Completion {
        id: t.id,
        lease: copy.lease().expect("a claimed copy"),
        output: spam(),
        usage: tokens(10, 5),
        claimed: Some(copy.clone()),
        attempt: None,
    };
    let answers = s
        .complete_tasks(vec![completion(&stale)])
        .await
        .expect("complete_tasks");
    let refused = answers[0].as_ref().expect("an answer");
    assert!(
        !refused.applied,
        "the earlier claim's completion is refused"
    );
    let got = get(&*s, &app("acme"), t.id).await;
    assert_eq!(
        (got.status, got.attempt),
        (TaskStatus::Running, 2),
        "and changed nothing"
    );
    let answers = s
        .complete_tasks(vec![completion(&current)])
        .await
        .expect("complete_tasks");
    assert!(
        answers[0].as_ref().expect("an answer").applied,
        "the current claim completes it"
    );
    let attempts = s.task_attempts(&app("acme"), t.id).await.expect("attempts");
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.n, a.outcome))
            .collect::<Vec<_>>(),
        vec![
            (1, AttemptOutcome::Interrupted),
            (2, AttemptOutcome::Succeeded)
        ]
    );
}

/// Creates `new` and claims it twice, requeued by the sweep in between: its first
/// attempt is charged its reservation. Returns the second claim's copy.
async fn requeued_once(
    b: &dyn Backend,
    s: &dyn Store,
    w: &tollgate_core::WorkerId,
    new: NewTask,
) -> tollgate_core::Task {
    let t = create_new(s, new).await;
    claim(s, t.id, w).await;
    b.clock().advance(secs(31));
    assert_eq!(sweep_all(s, &sweep_config()).await.requeued.len(), 1);
    let again = claim(s, t.id, w).await;
    assert_eq!(again.attempt, 2);
    again
}

/// Creates `new` and claims it; its first attempt gives up without usage (charged its
/// reservation) and a second begins in the same claim. Returns the claim's copy.
async fn two_attempts_in_one_claim(
    s: &dyn Store,
    w: &tollgate_core::WorkerId,
    new: NewTask,
) -> tollgate_core::Task {
    let t = create_new(s, new).await;
    let two = claim(s, t.id, w).await;
    let unavailable = ended(AttemptOutcome::Unavailable, None);
    assert!(s.end_attempt(two.id, 1, &unavailable).await.expect("end"));
    assert_eq!(begin(s, two.id, &lease(w, 1)).await, Some(2));
    two
}

/// docs/routes.md, "Attempts", through a batch of completions (as workers complete): each
/// task is charged the sum of its attempts, whether it made one, two within its claim,
/// or one per claim after a requeue, as a single completion charges it. Its scope's spend
/// settles that sum, and a later cache hit of the same request reports it as saved (the
/// charge stored on the task).
pub async fn a_batch_of_completions_charges_each_task_its_attempts(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let budget = cost_budget(Some(10_000_000), None, None);
    let task = |scope_name: &str, key: &str| {
        let mut t = tries(new_scoped_task("acme", scope_name, key, "doc", budget), 3);
        t.scope.as_mut().expect("scoped").reservation = reserve(100, 50);
        t
    };
    let again = requeued_once(b, &*s, &w, task("requeued", "again")).await;
    let one = create_new(&*s, task("one", "one")).await;
    let one = claim(&*s, one.id, &w).await;
    let two = two_attempts_in_one_claim(&*s, &w, task("two", "two")).await;
    let answers = s
        .complete_tasks(vec![completion(again), completion(one), completion(two)])
        .await
        .expect("complete_tasks");
    assert!(
        answers.iter().all(|a| a.as_ref().is_ok_and(|t| t.applied)),
        "{answers:?}"
    );
    for (scope_name, charged) in [
        ("requeued", 200_000 + 60_000),
        ("one", 60_000),
        ("two", 200_000 + 60_000),
    ] {
        let spent = spend(&*s, scope_name).await;
        assert_eq!(
            (spent.reserved_nano, spent.settled_nano),
            (0, charged),
            "{scope_name}: settled its attempts' sum, nothing left reserved"
        );
        let hit = create(&*s, task(scope_name, &format!("hit-{scope_name}"))).await;
        assert!(hit.task.cached(), "{scope_name}: a cache hit");
        assert_eq!(
            i64::try_from(hit.saved_nano).ok(),
            Some(charged),
            "{scope_name}: the hit saved what the task was charged"
        );
    }
}

/// docs/budgets.md, "Settlement", for lone completions of tasks without a source (the
/// workers' path at low load; on PostgreSQL written in one statement when the worker's
/// guess of the settlement holds: docs/locking.md, "Completions in one statement"): each
/// task is charged its attempts' sum whether its attempt was its only one or not, a task
/// canceled meanwhile is not completed (its cancel settled it), and the scopes' and the
/// app's spend say so.
pub async fn lone_unsourced_completions_charge_each_task_its_attempts(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let budget = cost_budget(Some(10_000_000), None, Some(100_000_000));
    let task = |scope_name: &str, key: &str| {
        tries(
            super::unsourced::unsourced_task("acme", scope_name, key, budget, reserve(100, 50)),
            3,
        )
    };
    // Each completion a batch of its own; whether it applied.
    let alone = |copy: tollgate_core::Task| {
        let s = &s;
        let item = completion(copy);
        async move {
            let answers = s.complete_tasks(vec![item]).await.expect("complete_tasks");
            match answers.as_slice() {
                [Ok(t)] => t.applied,
                other => panic!("one answer expected: {other:?}"),
            }
        }
    };
    // Every attempt its task's only one: two tasks of one scope, one of another.
    for (scope_name, key) in [("one", "a"), ("one", "b"), ("other", "c")] {
        let t = create_new(&*s, task(scope_name, key)).await;
        assert!(alone(claim(&*s, t.id, &w).await).await, "{key} completed");
    }
    for (scope_name, charged) in [("one", 120_000), ("other", 60_000)] {
        let spent = spend(&*s, scope_name).await;
        assert_eq!(
            (spent.reserved_nano, spent.settled_nano),
            (0, charged),
            "{scope_name}: each task settled at its one attempt"
        );
        assert_eq!(
            (spent.reserved_tokens, spent.settled_tokens),
            (0, 100 * charged / 120_000)
        );
    }
    // One canceled meanwhile (settled by its cancel), and one that completes.
    let more = create_new(&*s, task("other", "more")).await;
    let more = claim(&*s, more.id, &w).await;
    let gone = create_new(&*s, task("gone", "gone")).await;
    let gone = claim(&*s, gone.id, &w).await;
    s.request_cancel(&app("acme"), gone.id)
        .await
        .expect("cancel");
    assert!(
        !alone(gone).await,
        "a task canceled meanwhile is not completed"
    );
    assert!(alone(more).await);
    let gone_spent = spend(&*s, "gone").await;
    assert_eq!(
        (gone_spent.reserved_nano, gone_spent.settled_nano),
        (0, 200_000),
        "a task canceled while running is charged its reservation, once"
    );
    let app_spent = s.spend(&app("acme"), None).await.expect("spend");
    assert_eq!(
        (app_spent.reserved_nano, app_spent.settled_nano),
        (0, 240_000 + 200_000),
        "the app's window is the scopes' sum"
    );
    let again = requeued_once(b, &*s, &w, task("requeued", "again")).await;
    let two = two_attempts_in_one_claim(&*s, &w, task("two", "two")).await;
    assert!(alone(again).await);
    assert!(alone(two).await);
    for (scope_name, reserved, charged) in [
        ("other", 0, 120_000),
        ("requeued", 0, 200_000 + 60_000),
        ("two", 0, 200_000 + 60_000),
    ] {
        let spent = spend(&*s, scope_name).await;
        assert_eq!(
            (spent.reserved_nano, spent.settled_nano),
            (reserved, charged),
            "{scope_name}: settled its attempts' sum, or still reserved"
        );
    }
}
