//! docs/conformance.md#heartbeat claim and heartbeat: who holds a running task.

use crate::Backend;
use crate::fixtures::*;
use tollgate_core::{Budget, Clock, NewTask, TaskId, TaskStatus, WorkerId};

/// docs/conformance.md#lifecycle claim: `queued → running`, recorded with the worker and the time; a task is
/// claimed at most once (a second claim, by anyone, gets nothing).
pub async fn claim_moves_queued_to_running_once(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let t = create_new(&*s, new_app_task("acme", "s", "k")).await;
    b.clock().advance(secs(3));
    let claimed = claim(&*s, t.id, &worker("w1")).await;
    assert_eq!(claimed.status, TaskStatus::Running);
    assert_eq!(claimed.worker, Some(worker("w1")));
    assert_eq!(claimed.attempt, 1);
    assert_eq!(claimed.claimed_at, Some(b.clock().now()));
    assert_eq!(get(&*s, &acme, t.id).await, claimed);
    assert_eq!(
        try_claim(&*s, t.id, &worker("w1")).await,
        None,
        "a running task is not claimed again"
    );
    assert_eq!(
        try_claim(&*s, t.id, &worker("w2")).await,
        None,
        "a running task is not claimed by another worker"
    );
    assert_eq!(get(&*s, &acme, t.id).await.worker, Some(worker("w1")));
    assert_eq!(
        try_claim(&*s, TaskId::generate(), &worker("w1")).await,
        None,
        "a missing task is not claimable"
    );
}

/// docs/conformance.md#lifecycle claim: a canceled task is never claimed, nor a failed or succeeded one.
pub async fn claim_refuses_canceled_and_finished_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let canceled = create_new(&*s, new_app_task("acme", "s", "c")).await;
    cancel(&*s, &acme, canceled.id).await;
    let failed = create_new(&*s, new_app_task("acme", "s", "f")).await;
    fail(&*s, failed.id, "boom").await;
    let done = create_new(&*s, new_app_task("acme", "s", "d")).await;
    succeed(&*s, done.id).await;
    for (what, id) in [
        ("canceled", canceled.id),
        ("failed", failed.id),
        ("succeeded", done.id),
    ] {
        assert_eq!(
            try_claim(&*s, id, &worker("w")).await,
            None,
            "a {what} task is not claimable"
        );
    }
    assert_eq!(
        get(&*s, &acme, canceled.id).await.status,
        TaskStatus::Canceled
    );
}

/// docs/conformance.md#lifecycle claim: a task of a canceled run is never claimed.
pub async fn claim_refuses_tasks_of_a_canceled_run(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(&*s, new_run("acme", "s")).await;
    let t = create_new(&*s, new_run_task("acme", run.id, "k")).await;
    s.request_run_cancel(&acme, run.id)
        .await
        .expect("request_run_cancel")
        .expect("run exists");
    assert_eq!(try_claim(&*s, t.id, &worker("w")).await, None);
    let claimed = s.claim_next(&worker("w"), 10).await.expect("claim_next");
    assert!(
        claimed.is_empty(),
        "claim_next skips tasks of a canceled run: {claimed:?}"
    );
}

/// docs/conformance.md#lifecycle, docs/conformance.md#sweep-recovery: `claim_next` claims claimable queued tasks of every app, oldest first,
/// at most `limit` at a time, skipping canceled ones.
pub async fn claim_next_claims_oldest_claimable_first(b: &dyn Backend) {
    let s = b.open().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let app_name = if i == 2 { "globex" } else { "acme" };
        ids.push(
            create_new(&*s, new_app_task(app_name, "s", &format!("k{i}")))
                .await
                .id,
        );
        b.clock().advance(secs(1));
    }
    cancel(&*s, &app("acme"), ids[1]).await;
    let w = worker("w");
    let first: Vec<TaskId> = s
        .claim_next(&w, 2)
        .await
        .expect("claim_next")
        .iter()
        .map(|t| t.id)
        .collect();
    assert_eq!(
        first,
        vec![ids[0], ids[2]],
        "oldest claimable first, limit honoured"
    );
    let rest = s.claim_next(&w, 10).await.expect("claim_next");
    assert_eq!(
        rest.iter().map(|t| t.id).collect::<Vec<_>>(),
        vec![ids[3], ids[4]]
    );
    assert!(
        rest.iter()
            .all(|t| t.status == TaskStatus::Running && t.worker == Some(w.clone()))
    );
    assert!(s.claim_next(&w, 10).await.expect("claim_next").is_empty());
}

/// docs/conformance.md#heartbeat heartbeat and docs/conformance.md#batched-heartbeats: one call covers many tasks; it keeps the worker's running
/// tasks alive and reports in `stop` every task the worker must stop: canceled, held by
/// another worker, not running, deleted or never existing.
pub async fn heartbeat_reports_alive_and_stop_in_one_call(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let (w1, w2) = (worker("w1"), worker("w2"));
    let mut mine = Vec::new();
    for i in 0..20 {
        let t = create_new(&*s, new_app_task("acme", "s", &format!("mine-{i}"))).await;
        claim(&*s, t.id, &w1).await;
        mine.push(t.id);
    }
    let canceled = create_new(&*s, new_app_task("acme", "s", "canceled")).await;
    claim(&*s, canceled.id, &w1).await;
    cancel(&*s, &acme, canceled.id).await;
    let foreign = create_new(&*s, new_app_task("acme", "s", "foreign")).await;
    claim(&*s, foreign.id, &w2).await;
    let queued = create_new(&*s, new_app_task("acme", "s", "queued")).await;
    let deleted = create_new(&*s, new_app_task("acme", "gone", "deleted")).await;
    claim(&*s, deleted.id, &w1).await;
    s.delete_owner_data(&acme, &scope("gone"), None)
        .await
        .expect("delete_owner_data");
    let missing = TaskId::generate();

    b.clock().advance(secs(10));
    let mut ids = mine.clone();
    ids.extend([canceled.id, foreign.id, queued.id, deleted.id, missing]);
    let held: Vec<(TaskId, u32)> = ids.iter().map(|id| (*id, 1)).collect();
    let report = s.heartbeat(&w1, &held).await.expect("heartbeat");
    let mut alive: Vec<TaskId> = report.alive.iter().map(|(id, _)| *id).collect();
    alive.sort();
    let mut expected_alive = mine.clone();
    expected_alive.sort();
    assert_eq!(
        alive, expected_alive,
        "the worker's running tasks are alive"
    );
    let mut stop: Vec<TaskId> = report.stop.iter().map(|(id, _)| *id).collect();
    stop.sort();
    let mut expected_stop = vec![canceled.id, foreign.id, queued.id, deleted.id, missing];
    expected_stop.sort();
    assert_eq!(
        stop, expected_stop,
        "canceled, foreign, queued, deleted and missing tasks must stop"
    );
    let now = b.clock().now();
    for id in &mine {
        assert_eq!(
            get(&*s, &acme, *id).await.heartbeat_at,
            Some(now),
            "heartbeat_at moved to now"
        );
    }
    assert_eq!(
        get(&*s, &acme, foreign.id).await.status,
        TaskStatus::Running,
        "another worker's task is untouched"
    );
}

/// docs/conformance.md#lifecycle claim, for a task created claimed (`NewTask::claim_by`,
/// the OpenAI door's on a replica with a free slot): its creating transaction claims it,
/// so it is running by that worker with its first attempt open, as a claim would leave
/// it, and never claimable; its lease works as a claim's; a replay of its key claims
/// nothing; a cache hit is created succeeded, not claimed. Every creation path: no cost,
/// a cost under USD and token limits, a scoped (admitted) task.
pub async fn a_task_created_claimed_is_running_and_never_claimable(b: &dyn Backend) {
    use crate::cost::{cost_budget, reserve};
    use crate::unsourced::unsourced_task;
    use tollgate_core::AttemptOutcome;

    let s = b.open().await;
    let acme = app("acme");
    let (w1, w2) = (worker("w1"), worker("w2"));
    let claimed_by = |mut new: NewTask, w: &WorkerId| {
        new.claim_by = Some(w.clone());
        new
    };
    let limits = Budget {
        cost: cost_budget(Some(10_000_000), Some((600, 4_000)), None).cost,
        ..unlimited()
    };
    b.clock().advance(secs(2));
    let news = [
        ("no cost", new_app_task("acme", "s", "plain")),
        (
            "cost under limits",
            unsourced_task("acme", "s", "limited", limits, reserve(100, 50)),
        ),
        (
            "scoped",
            new_scoped_task("acme", "s", "admitted", "src", unlimited()),
        ),
    ];
    for (what, new) in news {
        let created = s
            .create_task(claimed_by(new.clone(), &w1))
            .await
            .expect(what);
        assert!(created.created, "{what}");
        let t = created.task;
        assert_eq!(t.status, TaskStatus::Running, "{what}");
        assert_eq!(t.worker, Some(w1.clone()), "{what}");
        assert_eq!(t.attempt, 1, "{what}");
        assert_eq!(t.claimed_at, Some(b.clock().now()), "{what}");
        assert_eq!(get(&*s, &acme, t.id).await, t, "{what}: as committed");
        let attempts = s.task_attempts(&acme, t.id).await.expect("task_attempts");
        assert_eq!(attempts.len(), 1, "{what}: its first attempt is open");
        assert_eq!(attempts[0].outcome, AttemptOutcome::Running, "{what}");
        assert_eq!(
            try_claim(&*s, t.id, &w2).await,
            None,
            "{what}: not claimable"
        );
        let replay = s.create_task(claimed_by(new, &w2)).await.expect(what);
        assert!(!replay.created, "{what}: a replay");
        assert_eq!(replay.task, t, "{what}: a replay claims nothing");
        let beat = s.heartbeat(&w1, &[(t.id, 1)]).await.expect("heartbeat");
        assert_eq!(
            beat.alive,
            vec![(t.id, 1)],
            "{what}: its lease is the claim's"
        );
        let done = complete(&*s, t.id, &w1, spam()).await;
        assert!(done.applied, "{what}: completed under its lease: {done:?}");
    }
    assert!(
        s.claim_next(&w2, 10).await.expect("claim_next").is_empty(),
        "no task created claimed was ever queued"
    );

    // A cache hit: created succeeded from the cache, not claimed.
    let first = create_new(&*s, new_scoped_task("acme", "s", "c1", "doc", unlimited())).await;
    succeed(&*s, first.id).await;
    let hit = s
        .create_task(claimed_by(
            new_scoped_task("acme", "s", "c2", "doc", unlimited()),
            &w1,
        ))
        .await
        .expect("cache hit");
    assert!(hit.created && hit.task.cached(), "{hit:?}");
    assert_eq!(hit.task.status, TaskStatus::Succeeded);
    assert_eq!(hit.task.worker, None);
}

/// docs/conformance.md#lifecycle, recovery: a task created claimed whose worker went
/// silent is put back in the queue by the sweep like any claimed task, and claimed by
/// the next `claim_next` — also in a scope where no task was ever queued (tasks created
/// claimed join no queue, so the requeue makes the scope's queue).
pub async fn a_silent_task_created_claimed_is_requeued_and_claimable(b: &dyn Backend) {
    let s = b.open().await;
    let (w1, w2) = (worker("w1"), worker("w2"));
    let mut new = new_app_task("acme", "never-queued", "silent");
    new.claim_by = Some(w1.clone());
    new.max_attempts = tollgate_core::MaxAttempts::new(2).expect("1..=20");
    let t = s.create_task(new).await.expect("create").task;
    assert_eq!(t.status, TaskStatus::Running, "created claimed");
    b.clock().advance(secs(31));
    assert_eq!(
        sweep_all(&*s, &sweep_config()).await.requeued,
        vec![(app("acme"), t.id)],
        "the silent claim goes back to the queue"
    );
    let claimed = s.claim_next(&w2, 10).await.expect("claim_next");
    assert_eq!(
        claimed
            .iter()
            .map(|c| (c.id, c.attempt))
            .collect::<Vec<_>>(),
        vec![(t.id, 2)],
        "the requeued task is claimable: its scope's queue is active"
    );
}
