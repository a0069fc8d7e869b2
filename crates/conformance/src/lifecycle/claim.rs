//! docs/conformance.md#heartbeat claim and heartbeat: who holds a running task.

use crate::Backend;
use crate::fixtures::*;
use tollgate_core::{Clock, TaskId, TaskStatus};

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
