//! docs/conformance.md#stream-log: the stream log — chunks of a running task's live
//! output, written only under the claim that runs it, read in order from any position by
//! the task's app only, and gone with the task (owner deletion) or swept a while after
//! it ended.

use crate::Backend;
use crate::fixtures::*;
use tollgate_core::{Lease, MaxAttempts, TaskId};
use tollgate_store::{STREAM_LOG_GRACE, Store, StreamChunk, StreamPosition, SweepConfig};

fn chunk(task: TaskId, claim: u32, seq: u32, text: &str, answered: bool) -> StreamChunk {
    StreamChunk {
        task,
        position: StreamPosition { claim, seq },
        events: format!(r#"[{{"text":"{text}"}}]"#),
        answered,
    }
}

async fn append(s: &dyn Store, chunks: &[StreamChunk]) -> Vec<bool> {
    s.append_stream_chunks(chunks)
        .await
        .expect("append_stream_chunks")
}

async fn read(s: &dyn Store, app_name: &str, task: TaskId, claim: u32, seq: u32) -> Vec<String> {
    s.stream_chunks(&app(app_name), task, StreamPosition { claim, seq }, 100)
        .await
        .expect("stream_chunks")
        .into_iter()
        .map(|c| {
            format!(
                "{}.{} {}{}",
                c.position.claim,
                c.position.seq,
                c.events,
                if c.answered { " answered" } else { "" }
            )
        })
        .collect()
}

/// docs/conformance.md#stream-log: a chunk is written only while its claim runs the
/// task (not before the claim, not under an older claim, not after the end); appending
/// is idempotent; chunks read back in (claim, number) order from any position, by the
/// task's app only, `limit` at a time.
pub async fn stream_chunks_are_written_by_the_running_claim_and_read_in_order(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let task = create_new(
        &*s,
        tollgate_core::NewTask {
            max_attempts: MaxAttempts::new(3).unwrap(),
            ..new_app_task("acme", "s", "streamed")
        },
    )
    .await;
    assert_eq!(
        append(&*s, &[chunk(task.id, 0, 0, "early", false)]).await,
        vec![false],
        "a queued task has no live output"
    );
    let first = claim(&*s, task.id, &w).await;
    let c1 = first.attempt;
    assert_eq!(
        append(
            &*s,
            &[
                chunk(task.id, c1, 0, "Hel", false),
                chunk(task.id, c1, 1, "lo", false),
                chunk(task.id, c1 + 1, 0, "not this claim", false),
            ]
        )
        .await,
        vec![true, true, false]
    );
    assert_eq!(
        append(&*s, &[chunk(task.id, c1, 1, "again", false)]).await,
        vec![true],
        "a retried append is idempotent"
    );
    assert_eq!(
        read(&*s, "acme", task.id, 0, 0).await,
        vec![
            format!(r#"{c1}.0 [{{"text":"Hel"}}]"#),
            format!(r#"{c1}.1 [{{"text":"lo"}}]"#),
        ],
        "the first append of a chunk stays"
    );
    assert_eq!(read(&*s, "acme", task.id, c1, 1).await.len(), 1);
    assert!(read(&*s, "acme", task.id, c1, 2).await.is_empty());
    assert!(
        read(&*s, "globex", task.id, 0, 0).await.is_empty(),
        "another app sees nothing"
    );
    let one = s
        .stream_chunks(&app("acme"), task.id, StreamPosition::default(), 1)
        .await
        .unwrap();
    assert_eq!(one.len(), 1, "at most `limit` chunks");

    // Handed back to the queue and claimed again: the new claim writes, the old one no
    // longer can; a reader from the old claim's position reads on into the new one.
    assert!(
        s.requeue_task(task.id, &Lease::new(w.clone(), c1), "shutting down")
            .await
            .unwrap(),
        "requeued"
    );
    assert_eq!(
        append(&*s, &[chunk(task.id, c1, 2, "stale", false)]).await,
        vec![false]
    );
    let second = claim(&*s, task.id, &w).await;
    let c2 = second.attempt;
    assert!(c2 > c1, "a later claim has a larger number");
    assert_eq!(
        append(
            &*s,
            &[
                chunk(task.id, c1, 2, "stale", false),
                chunk(task.id, c2, 0, "Hi", true),
            ]
        )
        .await,
        vec![false, true]
    );
    assert_eq!(
        read(&*s, "acme", task.id, c1, 1).await,
        vec![
            format!(r#"{c1}.1 [{{"text":"lo"}}]"#),
            format!(r#"{c2}.0 [{{"text":"Hi"}}] answered"#),
        ]
    );
    let t = s
        .complete_task(task.id, &Lease::new(w.clone(), c2), spam(), usage())
        .await
        .unwrap();
    assert!(t.applied);
    assert_eq!(
        append(&*s, &[chunk(task.id, c2, 1, "late", false)]).await,
        vec![false],
        "an ended task takes no more chunks"
    );
}

/// docs/conformance.md#stream-log: a task's chunks go with it when its owner's data is
/// deleted, and are swept [`STREAM_LOG_GRACE`] after it ended, never while it runs.
pub async fn stream_chunks_go_with_owner_deletion_and_are_swept_after_the_end(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let config = SweepConfig {
        queue_timeout: hours(24 * 365),
        liveness_timeout: hours(24 * 365),
        retention: hours(24 * 365),
        batch_size: 100,
    };
    let ended = create_new(&*s, new_app_task("acme", "s", "ended")).await;
    let running = create_new(&*s, new_app_task("acme", "s", "running")).await;
    let deleted = create_new(&*s, new_app_task("acme", "other", "deleted")).await;
    for t in [&ended, &running, &deleted] {
        let c = claim(&*s, t.id, &w).await.attempt;
        assert_eq!(
            append(
                &*s,
                &[chunk(t.id, c, 0, "a", false), chunk(t.id, c, 1, "b", false)]
            )
            .await,
            vec![true, true]
        );
    }
    s.delete_owner_data(&app("acme"), &scope("other"), None)
        .await
        .expect("delete_owner_data");
    assert!(
        read(&*s, "acme", deleted.id, 0, 0).await.is_empty(),
        "a deleted task's chunks went with it"
    );
    assert!(complete(&*s, ended.id, &w, spam()).await.applied);
    assert_eq!(
        sweep_all(&*s, &config).await.stream_chunks_deleted,
        0,
        "within the grace, an ended task's chunks stay for its readers"
    );
    assert_eq!(read(&*s, "acme", ended.id, 0, 0).await.len(), 2);
    b.clock()
        .advance(STREAM_LOG_GRACE + std::time::Duration::from_secs(1));
    assert_eq!(sweep_all(&*s, &config).await.stream_chunks_deleted, 2);
    assert!(read(&*s, "acme", ended.id, 0, 0).await.is_empty());
    assert_eq!(
        read(&*s, "acme", running.id, 0, 0).await.len(),
        2,
        "a running task's chunks are never swept"
    );
}
