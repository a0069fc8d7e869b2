//! Live streams read on another replica (docs/api.md, "Streaming a task"; docs/engine.md,
//! "Live streams across replicas"), on both backends: engines on one database, one
//! running the tasks (the `dev` provider streaming its answer word by word), another with
//! no worker reading them through the stream log. Their notifiers are separate, so the
//! reader follows by polling alone.
//!
//! - a reader on the other replica gets the pieces while the task runs (the first while
//!   it is still running, several before its end), from the stream's start, and they join
//!   to the stored output; the log holds the execution's chunks, the last marked
//!   answered; a task whose whole answer comes before the first flush writes nothing;
//! - an execution interrupted mid-stream and run again by another replica is seen as a
//!   `Restart` before the new execution's pieces, which alone join to the output.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;
use tollgate_core::{TaskId, TaskKind, TaskStatus};
use tollgate_engine::{EngineConfig, StreamEvent, Submission, TaskEvent, TaskEvents, Tollgate};
use tollgate_store::StreamPosition;

on_both_backends!(
    a_reader_on_another_replica_follows_the_log_as_it_is_written,
    a_restart_on_the_executing_replica_is_seen_on_another,
);

/// [`fast_config`] with `workers` executions; the `default` model streams word by word,
/// `delay_ms` apart; the `instant` model answers in one piece.
fn config(workers: u32, delay_ms: u64) -> EngineConfig {
    let mut c = fast_config();
    c.workers.concurrency = workers;
    let default = c.models.get_mut("default").expect("the default model");
    let mut instant = default.clone();
    default
        .params
        .insert("stream_delay_ms".into(), json!(delay_ms));
    instant.params.remove("stream_delay_ms");
    c.models.insert("instant".into(), instant);
    c
}

const PROMPT: &str = "one two three four five six seven eight nine ten";

fn generate(key_name: &str, model: &str) -> Submission {
    Submission::application(
        app(),
        scope(),
        key(key_name),
        TaskKind::GenerateText,
        json!({"prompt": PROMPT}),
    )
    .with_model(tollgate_core::ModelId::new(model).unwrap())
}

/// The next event, within 20 s.
async fn next(events: &mut TaskEvents) -> TaskEvent {
    tokio::time::timeout(Duration::from_secs(20), events.next())
        .await
        .expect("an event within 20 s")
        .expect("an event before the end")
}

/// Reads up to the end: the events, and the task it ended as.
async fn rest(events: &mut TaskEvents) -> (Vec<StreamEvent>, tollgate_core::Task) {
    let mut seen = Vec::new();
    loop {
        match next(events).await {
            TaskEvent::Stream(event) => seen.push(event),
            TaskEvent::End(task) => return (seen, *task),
        }
    }
}

/// The text of the pieces after the last restart.
fn text_after_last_restart(events: &[StreamEvent]) -> String {
    let from = events
        .iter()
        .rposition(|e| matches!(e, StreamEvent::Restart { .. }))
        .map_or(0, |i| i + 1);
    events[from..]
        .iter()
        .map(|e| match e {
            StreamEvent::Text(t) => t.as_str(),
            other => panic!("only text pieces: {other:?}"),
        })
        .collect()
}

async fn chunks(db: &TestDb, id: TaskId) -> Vec<tollgate_store::StreamChunk> {
    db.store()
        .await
        .stream_chunks(&app(), id, StreamPosition::default(), 1000)
        .await
        .expect("stream_chunks")
}

async fn a_reader_on_another_replica_follows_the_log_as_it_is_written(db: TestDb) {
    let runner = db.engine(config(4, 60)).await;
    let _handle = runner.start().await.expect("start");
    let reader: Tollgate = db.engine(config(0, 60)).await;
    let id = reader
        .submit(generate("streamed", "default"))
        .await
        .expect("submit")
        .task
        .id;
    let mut events = reader
        .events(&app(), id)
        .await
        .expect("events")
        .expect("the task");
    // The first piece comes while the task still runs on the other replica.
    let first = next(&mut events).await;
    assert!(
        matches!(&first, TaskEvent::Stream(StreamEvent::Text(_))),
        "{first:?}"
    );
    let now = runner.get(&app(), id).await.unwrap().expect("the task");
    assert_eq!(
        now.status,
        TaskStatus::Running,
        "a piece came before the end"
    );
    let (mut seen, task) = rest(&mut events).await;
    let TaskEvent::Stream(first) = first else {
        unreachable!()
    };
    seen.insert(0, first);
    assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
    let output = task.output.as_ref().unwrap()["text"].as_str().unwrap();
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, StreamEvent::Restart { .. })),
        "{seen:?}"
    );
    assert_eq!(text_after_last_restart(&seen), output);
    assert!(
        seen.len() >= 4,
        "followed piece by piece, not given whole at the end: {seen:?}"
    );

    // The log holds the execution's chunks, its last marked answered.
    let logged = chunks(&db, id).await;
    assert!(logged.len() >= 2, "{logged:?}");
    assert!(logged.iter().all(|c| c.position.claim == task.attempt));
    assert!(logged.last().unwrap().answered, "{logged:?}");
    assert!(logged[..logged.len() - 1].iter().all(|c| !c.answered));

    // A task whose whole answer comes before the first flush writes nothing.
    let quick = reader
        .submit(generate("instant", "instant"))
        .await
        .expect("submit")
        .task
        .id;
    let mut events = reader.events(&app(), quick).await.unwrap().unwrap();
    let (seen, task) = rest(&mut events).await;
    assert_eq!(task.status, TaskStatus::Succeeded);
    assert_eq!(
        text_after_last_restart(&seen),
        task.output.as_ref().unwrap()["text"].as_str().unwrap()
    );
    assert!(chunks(&db, quick).await.is_empty(), "nothing was logged");
}

async fn a_restart_on_the_executing_replica_is_seen_on_another(db: TestDb) {
    let first_runner = db.engine(config(4, 150)).await;
    let first_handle = first_runner.start().await.expect("start");
    let reader = db.engine(config(0, 150)).await;
    let id = reader
        .submit(generate("interrupted", "default"))
        .await
        .expect("submit")
        .task
        .id;
    let mut events = reader.events(&app(), id).await.unwrap().unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        match next(&mut events).await {
            TaskEvent::Stream(event) => seen.push(event),
            end => panic!("the task ended early: {end:?}"),
        }
    }
    // The first replica stops mid-stream: the task goes back to the queue and another
    // replica runs it from the start.
    let report = first_handle.shutdown(Duration::ZERO).await;
    assert_eq!(report.interrupted, 1, "{report:?}");
    let second_runner = db.engine(config(4, 20)).await;
    let _handle = second_runner.start().await.expect("start");
    let (more, task) = rest(&mut events).await;
    seen.extend(more);
    assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
    let restarts = seen
        .iter()
        .filter(|e| matches!(e, StreamEvent::Restart { .. }))
        .count();
    assert_eq!(restarts, 1, "one restart, before the new pieces: {seen:?}");
    assert!(matches!(seen[0], StreamEvent::Text(_)));
    assert_eq!(
        text_after_last_restart(&seen),
        task.output.as_ref().unwrap()["text"].as_str().unwrap()
    );
    let claims: std::collections::BTreeSet<u32> = chunks(&db, id)
        .await
        .iter()
        .map(|c| c.position.claim)
        .collect();
    assert_eq!(claims.len(), 2, "both executions were logged: {claims:?}");
}
