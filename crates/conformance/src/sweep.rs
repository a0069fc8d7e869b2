//! docs/conformance.md#sweeps: background sweeps.

use super::Backend;
use super::fixtures::*;
use tollgate_core::{ErrorCode, RunState, TaskStatus};
use tollgate_store::{SweepConfig, WaitOutcome};

/// docs/conformance.md#sweep-queue-timeout: a task queued longer than the queue timeout fails with
/// `WORKFLOW_AI_QUEUE_TIMEOUT`; one queued for less is untouched.
pub async fn sweep_fails_tasks_queued_too_long_with_queue_timeout(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let config = sweep_config();
    let old = create_new(&*s, new_app_task("acme", "s", "old")).await;
    b.clock().advance(secs(300));
    let young = create_new(&*s, new_app_task("acme", "s", "young")).await;
    b.clock().advance(secs(301));
    let report = sweep_all(&*s, &config).await;
    assert_eq!(report.queue_timed_out, 1);
    assert_eq!(report.finished, vec![old.id]);
    let t = get(&*s, &acme, old.id).await;
    assert_eq!(t.status, TaskStatus::Failed);
    assert_eq!(t.error.map(|e| e.code), Some(ErrorCode::QueueTimeout));
    assert_eq!(t.completed_at, Some(tollgate_core::Clock::now(b.clock())));
    assert_eq!(
        get(&*s, &acme, young.id).await.status,
        TaskStatus::Queued,
        "a younger task waits on"
    );
    // Running tasks are not subject to the queue timeout.
    claim(&*s, young.id, &worker("w")).await;
    for _ in 0..16 {
        b.clock().advance(secs(20));
        s.heartbeat(&worker("w"), &[(young.id, 1)])
            .await
            .expect("heartbeat");
    }
    // Created 621 s ago, running with a fresh heartbeat.
    let report = sweep_all(&*s, &config).await;
    assert_eq!((report.queue_timed_out, report.interrupted), (0, 0));
    assert_eq!(get(&*s, &acme, young.id).await.status, TaskStatus::Running);
}

/// docs/conformance.md#sweep-liveness: a running task without a heartbeat for the liveness timeout fails with
/// `WORKFLOW_AI_INTERRUPTED` (liveness lives in the database).
pub async fn sweep_interrupts_running_tasks_without_heartbeat(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let t = create_new(&*s, new_app_task("acme", "s", "k")).await;
    claim(&*s, t.id, &worker("w")).await;
    b.clock().advance(secs(29));
    let report = sweep_all(&*s, &sweep_config()).await;
    assert_eq!(
        report.interrupted, 0,
        "29 s without heartbeat is within the 30 s liveness timeout"
    );
    b.clock().advance(secs(2));
    let report = sweep_all(&*s, &sweep_config()).await;
    assert_eq!(report.interrupted, 1);
    assert_eq!(report.finished, vec![t.id]);
    let t = get(&*s, &acme, t.id).await;
    assert_eq!(t.status, TaskStatus::Failed);
    assert_eq!(t.error.map(|e| e.code), Some(ErrorCode::Interrupted));
}

/// docs/conformance.md#heartbeat heartbeat / docs/conformance.md#sweep-liveness: heartbeats keep a running task alive past the liveness
/// timeout; once they stop, the sweep interrupts it.
pub async fn heartbeat_keeps_a_running_task_alive(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    let t = create_new(&*s, new_app_task("acme", "s", "k")).await;
    claim(&*s, t.id, &w).await;
    for _ in 0..6 {
        b.clock().advance(secs(20));
        let report = s.heartbeat(&w, &[(t.id, 1)]).await.expect("heartbeat");
        assert_eq!(report.alive, vec![(t.id, 1)]);
        assert!(report.stop.is_empty());
        b.clock().advance(secs(20));
        let swept = sweep_all(&*s, &sweep_config()).await;
        assert_eq!(
            swept.interrupted, 0,
            "20 s after a heartbeat the task is alive"
        );
    }
    assert_eq!(
        get(&*s, &acme, t.id).await.status,
        TaskStatus::Running,
        "alive after 4 minutes of heartbeats"
    );
    b.clock().advance(secs(11));
    assert_eq!(sweep_all(&*s, &sweep_config()).await.interrupted, 1);
}

/// docs/conformance.md#sweep-cancellation: when cancellation was requested (here: the run was canceled), an expired
/// task ends `canceled` with `WORKFLOW_AI_CANCELED`, never with a timeout code.
pub async fn sweep_keeps_cancellation_over_timeouts(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(&*s, new_run("acme", "s")).await;
    let queued = create_new(&*s, new_run_task("acme", run.id, "queued")).await;
    let running = create_new(&*s, new_run_task("acme", run.id, "running")).await;
    claim(&*s, running.id, &worker("w")).await;
    s.request_run_cancel(&acme, run.id)
        .await
        .expect("request_run_cancel")
        .expect("run exists");
    b.clock().advance(secs(3600));
    let report = sweep_all(&*s, &sweep_config()).await;
    assert_eq!(
        (report.queue_timed_out, report.interrupted),
        (0, 0),
        "canceled tasks do not time out"
    );
    for id in [queued.id, running.id] {
        let t = get(&*s, &acme, id).await;
        assert_eq!(t.status, TaskStatus::Canceled);
        assert_eq!(t.error.map(|e| e.code), Some(ErrorCode::Canceled));
    }
}

/// docs/conformance.md#sweeps: each sweep item works in bounded batches (`batch_size`), and `more` says to
/// sweep again while work remains.
pub async fn sweep_batches_are_bounded(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            create_new(&*s, new_app_task("acme", "s", &format!("k{i}")))
                .await
                .id,
        );
    }
    b.clock().advance(secs(601));
    let config = SweepConfig {
        batch_size: 2,
        ..sweep_config()
    };
    let mut counts = Vec::new();
    let mut finished = Vec::new();
    for _ in 0..10 {
        let r = sweep(&*s, &config).await;
        assert!(
            r.queue_timed_out <= 2,
            "a sweep handles at most batch_size rows: {r:?}"
        );
        counts.push(r.queue_timed_out);
        finished.extend(r.finished);
        if !r.more {
            break;
        }
        assert_eq!(r.queue_timed_out, 2, "`more` only when a batch was filled");
    }
    assert_eq!(
        counts.iter().sum::<u64>(),
        5,
        "batches {counts:?} cover every task"
    );
    assert_eq!(&counts[..2], &[2, 2]);
    finished.sort();
    ids.sort();
    assert_eq!(finished, ids);
    for id in ids {
        assert_eq!(get(&*s, &acme, id).await.status, TaskStatus::Failed);
    }
}

/// docs/conformance.md#admission, docs/conformance.md#sweep-prune: admission records older than 24 h are pruned (one per admitted task;
/// cache hits leave none).
pub async fn sweep_prunes_admission_records_older_than_24_hours(b: &dyn Backend) {
    let s = b.open().await;
    for i in 0..3 {
        let t = create_new(
            &*s,
            with_input(
                new_scoped_task("acme", "s", &format!("k{i}"), "doc", unlimited()),
                &format!("step {i}"),
            ),
        )
        .await;
        succeed(&*s, t.id).await;
    }
    let hit = create_new(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "hit", "doc", unlimited()),
            "step 0",
        ),
    )
    .await;
    assert!(hit.cached(), "same request is served from the cache");
    b.clock().advance(hours(23));
    assert_eq!(
        sweep_all(&*s, &sweep_config()).await.admissions_pruned,
        0,
        "records inside the window stay"
    );
    b.clock().advance(hours(1) + secs(1));
    let config = SweepConfig {
        batch_size: 2,
        ..sweep_config()
    };
    assert_eq!(
        sweep_all(&*s, &config).await.admissions_pruned,
        3,
        "every admitted task's record is pruned"
    );
}

/// docs/conformance.md#sweep-retention retention: an application-owned task is deleted only when it is terminal,
/// released, and both released and completed more than the retention ago; never an
/// unreleased, an unfinished, or a run-owned task.
pub async fn retention_deletes_released_terminal_application_tasks_only(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let sc = scope("s");
    let config = SweepConfig {
        queue_timeout: hours(24 * 365),
        liveness_timeout: hours(24 * 365),
        retention: hours(1),
        batch_size: 100,
    };
    let released = create_new(&*s, new_app_task("acme", "s", "released")).await;
    let unreleased = create_new(&*s, new_app_task("acme", "s", "unreleased")).await;
    let unfinished = create_new(&*s, new_app_task("acme", "s", "unfinished")).await;
    let late_release = create_new(&*s, new_app_task("acme", "s", "late-release")).await;
    let early_release = create_new(&*s, new_app_task("acme", "s", "early-release")).await;
    let run = create_run(&*s, new_run("acme", "s")).await;
    let run_task = create_new(&*s, new_run_task("acme", run.id, "run-task")).await;
    for t in [&released, &unreleased, &late_release, &run_task] {
        succeed(&*s, t.id).await;
    }
    for k in ["released", "unfinished", "early-release"] {
        assert!(
            s.release(&acme, &sc, &key(k)).await.expect("release"),
            "{k} is released"
        );
    }
    assert!(
        !s.release(&acme, &sc, &key("run-task"))
            .await
            .expect("release"),
        "run-owned tasks are not released"
    );

    b.clock().advance(secs(1800));
    assert_eq!(
        sweep_all(&*s, &config).await.tasks_deleted,
        0,
        "nothing is older than the retention yet"
    );

    b.clock().advance(secs(1801));
    assert!(
        s.release(&acme, &sc, &key("late-release"))
            .await
            .expect("release")
    );
    let w = worker("w");
    claim(&*s, early_release.id, &w).await;
    assert!(complete(&*s, early_release.id, &w, spam()).await.applied);
    let report = sweep_all(&*s, &config).await;
    assert_eq!(
        report.tasks_deleted, 1,
        "only the task released and completed an hour ago goes"
    );
    assert_eq!(try_get(&*s, &acme, released.id).await, None);
    assert_eq!(get_by_key(&*s, &acme, "released").await, None);

    b.clock().advance(secs(3601));
    let report = sweep_all(&*s, &config).await;
    assert_eq!(
        report.tasks_deleted, 2,
        "late-release and early-release go once both times passed"
    );
    assert_eq!(try_get(&*s, &acme, late_release.id).await, None);
    assert_eq!(try_get(&*s, &acme, early_release.id).await, None);

    b.clock().advance(hours(48));
    sweep_all(&*s, &config).await;
    assert_eq!(
        get(&*s, &acme, unreleased.id).await.status,
        TaskStatus::Succeeded,
        "unreleased tasks are kept"
    );
    assert_eq!(
        get(&*s, &acme, unfinished.id).await.status,
        TaskStatus::Queued,
        "unfinished tasks are kept"
    );
    assert_eq!(
        get(&*s, &acme, run_task.id).await.status,
        TaskStatus::Succeeded,
        "run-owned tasks are kept"
    );
}

/// docs/conformance.md#sweep-queue-timeout, docs/conformance.md#sweep-liveness, docs/conformance.md#sweep-cancellation, docs/conformance.md#workflow-runs: a task the sweep finishes wakes the run waiting on it.
pub async fn sweep_wakes_runs_of_tasks_it_finishes(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(&*s, new_run("acme", "s")).await;
    let t = create_new(&*s, new_run_task("acme", run.id, "k")).await;
    let waited = s
        .wait_on_task(&acme, run.id, t.id)
        .await
        .expect("wait_on_task");
    assert!(matches!(waited, WaitOutcome::Waiting(_)), "{waited:?}");
    let other = create_run(&*s, new_run("acme", "s")).await;
    let u = create_new(&*s, new_run_task("acme", other.id, "u")).await;
    claim(&*s, u.id, &worker("w")).await;
    s.wait_on_task(&acme, other.id, u.id)
        .await
        .expect("wait_on_task");

    b.clock().advance(secs(601));
    let report = sweep_all(&*s, &sweep_config()).await;
    let mut woken = report.woken_runs.clone();
    woken.sort();
    let mut expected = vec![run.id, other.id];
    expected.sort();
    assert_eq!(woken, expected, "both waiting runs are woken");
    assert_eq!(
        report.runs_repaired, 0,
        "waking on the move is not a repair"
    );
    for id in [run.id, other.id] {
        assert_eq!(get_run(&*s, &acme, id).await.state, RunState::Running);
    }
}

/// docs/conformance.md#sweep-lost-wakes repair of lost wakes: the trait offers no way to lose a wake (the store
/// wakes in the same transaction), so this checks the invariant the repair protects:
/// after many terminal moves of every kind, no run waits on a terminal task and the sweep
/// finds nothing to repair.
pub async fn no_waiting_run_has_a_terminal_task(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    let mut pairs = Vec::new();
    for i in 0..10 {
        let run = create_run(&*s, new_run("acme", "s")).await;
        let t = create_new(&*s, new_run_task("acme", run.id, &format!("k{i}"))).await;
        if i % 5 != 0 {
            claim(&*s, t.id, &w).await;
        }
        s.wait_on_task(&acme, run.id, t.id)
            .await
            .expect("wait_on_task");
        pairs.push((run.id, t.id));
    }
    complete(&*s, pairs[1].1, &w, spam()).await;
    fail(&*s, pairs[2].1, "boom").await;
    cancel(&*s, &acme, pairs[3].1).await;
    s.request_run_cancel(&acme, pairs[4].0)
        .await
        .expect("request_run_cancel");
    cancel(&*s, &acme, pairs[5].1).await;
    b.clock().advance(secs(40));
    for i in [6, 7] {
        s.heartbeat(&w, &[(pairs[i].1, 1)])
            .await
            .expect("heartbeat");
    }
    let swept = sweep_all(&*s, &sweep_config()).await; // 8, 9 interrupted
    assert_eq!(swept.interrupted, 2);
    b.clock().advance(secs(600));
    sweep_all(&*s, &sweep_config()).await; // 0 queue-timed-out, 6, 7 interrupted
    let report = sweep_all(&*s, &sweep_config()).await;
    assert_eq!(report.runs_repaired, 0, "no wake was lost");
    for (run_id, task_id) in pairs {
        let run = get_run(&*s, &acme, run_id).await;
        let task = get(&*s, &acme, task_id).await;
        assert!(task.status.is_terminal(), "every task ended: {task:?}");
        assert_ne!(
            run.state,
            RunState::Waiting,
            "run {run_id} waits on terminal task {task_id}"
        );
    }
}
