//! Crashes and restarts: an engine stopped in the middle of a task, a new engine on the
//! same database. Every task ends correctly and none runs twice, let alone twice at once
//! (the fake provider counts concurrent calls per input).

mod common;

use common::*;
use std::collections::HashMap;
use std::time::Duration;
use tollgate_core::{ErrorCode, TaskId, TaskStatus};

on_both_backends!(
    a_crashed_engine_s_tasks_end_correctly_on_a_new_engine,
    graceful_shutdown_drains_then_interrupts_and_leaves_the_queue,
);

fn answer_slowly(fake: &FakeOpenAi, delay: Duration) {
    fake.respond(move |_| Reply::Slow(delay, r#"{"label": "ham", "confidence": null}"#.into()));
}

async fn submit_all(engine: &tollgate_engine::Tollgate, n: usize) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for i in 0..n {
        let s = classify(&format!("task-{i}"), &format!("input-{i}"));
        ids.push(engine.submit(s).await.unwrap().task.id);
    }
    ids
}

async fn a_crashed_engine_s_tasks_end_correctly_on_a_new_engine(db: TestDb) {
    let fake = FakeOpenAi::start().await;
    answer_slowly(&fake, Duration::from_millis(400));
    let mut config = fake_config(&fake);
    config.workers.concurrency = 1;
    // At most once (docs/routes.md, "Attempts"): what this test proves. With tries left
    // the stranded task would go back to the queue (tests/tries.rs).
    if let Some(model) = config.models.get_mut("default") {
        model.max_attempts = Some(tollgate_core::MaxAttempts::ONE);
    }

    let first = db.engine(config.clone()).await;
    let ids = submit_all(&first, 4).await;
    let crashed = first.start().await.unwrap();
    // Stop the first engine in the middle of its first task, as a crash would: nothing
    // is recorded, the task stays `running` with a stale heartbeat.
    fake.until_requests(1).await;
    let in_flight = crashed.in_flight();
    assert_eq!(in_flight.len(), 1);
    crashed.abandon().await;
    let stranded = until_status(&first, in_flight[0], TaskStatus::Running).await;
    assert_eq!(stranded.attempt, 1);

    // A new engine on the same database: its sweeper fails the stranded task after the
    // liveness timeout; recovery and polling run the queued ones.
    let second = db.engine(config).await;
    let handle = second.start().await.unwrap();
    let mut ends: HashMap<TaskId, (TaskStatus, Option<ErrorCode>)> = HashMap::new();
    for id in &ids {
        let task = finished(&second, *id).await;
        ends.insert(*id, (task.status, task.error.map(|e| e.code)));
        assert!(
            task.attempt <= 1,
            "task {id} was claimed {} times",
            task.attempt
        );
    }
    handle.shutdown(Duration::from_secs(5)).await;

    assert_eq!(
        ends[&in_flight[0]],
        (TaskStatus::Failed, Some(ErrorCode::Interrupted)),
        "the task whose worker died ends interrupted, never re-run"
    );
    for id in ids.iter().filter(|id| **id != in_flight[0]) {
        assert_eq!(ends[id], (TaskStatus::Succeeded, None), "task {id}");
    }
    assert_eq!(
        fake.max_concurrent_same_input(),
        1,
        "a task ran twice at once"
    );
    assert!(
        fake.calls_per_input().values().all(|n| *n == 1),
        "a task was executed twice: {:?}",
        fake.calls_per_input()
    );
}

async fn graceful_shutdown_drains_then_interrupts_and_leaves_the_queue(db: TestDb) {
    let fake = FakeOpenAi::start().await;
    answer_slowly(&fake, Duration::from_millis(300));
    let mut config = fake_config(&fake);
    config.workers.concurrency = 2;
    let engine = db.engine(config.clone()).await;
    let ids = submit_all(&engine, 3).await;

    // Two tasks in flight finish within the deadline; the third was never claimed and
    // stays queued for any replica.
    let handle = engine.start().await.unwrap();
    fake.until_requests(2).await;
    let report = handle.shutdown(Duration::from_secs(5)).await;
    assert!(report.drained);
    assert_eq!(report.interrupted, 0);
    let statuses: Vec<TaskStatus> = {
        let mut s = Vec::new();
        for id in &ids {
            s.push(engine.get(&app(), *id).await.unwrap().unwrap().status);
        }
        s
    };
    assert_eq!(
        statuses,
        [
            TaskStatus::Succeeded,
            TaskStatus::Succeeded,
            TaskStatus::Queued
        ]
    );

    // A deadline shorter than the call: the execution is dropped and its attempt
    // recorded as interrupted at once (no waiting for the liveness timeout); the task
    // has tries left, so it is back in the queue for any replica (docs/routes.md,
    // "Attempts"; `tries.rs` has the rest of the story).
    answer_slowly(&fake, Duration::from_secs(30));
    let handle = engine.start().await.unwrap();
    fake.until_requests(3).await;
    let report = handle.shutdown(Duration::from_millis(100)).await;
    assert!(!report.drained);
    assert_eq!(report.interrupted, 1);
    let task = engine.get(&app(), ids[2]).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued, "{:?}", task.error);
    assert_eq!(task.worker, None);
    let attempts = engine.attempts(&app(), ids[2]).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![tollgate_core::AttemptOutcome::Interrupted]
    );
    assert_eq!(
        attempts[0].error.as_ref().map(|e| e.code),
        Some(ErrorCode::Interrupted)
    );
    assert_eq!(fake.dropped().len(), 1, "the provider call was dropped");
    assert_eq!(fake.max_concurrent_same_input(), 1);
}
