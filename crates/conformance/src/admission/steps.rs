//! docs/conformance.md#admission logical steps: the same step counts once; a succeeded task keeps its step,
//! every other ending frees it while its source stays seen.

use crate::Backend;
use crate::fixtures::*;
use tollgate_core::{ErrorCode, TaskStatus};
use tollgate_store::SweepConfig;

/// docs/conformance.md#admission: the logical key is the cache key, so asking again for the same logical step
/// (another effect key, same source and request) does not count as another step.
pub async fn same_logical_step_counts_once(b: &dyn Backend) {
    let s = b.open().await;
    let one = budget(1, 100, 100, 100, 100, 100);
    create_new(&*s, new_scoped_task("acme", "s", "a", "doc", one)).await;
    let again = create_new(&*s, new_scoped_task("acme", "s", "b", "doc", one)).await;
    assert_eq!(
        again.status,
        TaskStatus::Queued,
        "the same step is admitted again while the first is unfinished"
    );
    create_new(&*s, new_scoped_task("acme", "s", "c", "doc", one)).await;
    let r = rejection(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "d", "doc", one),
            "another step",
        ),
    )
    .await;
    assert_eq!(r.code(), ErrorCode::SourceBudget);
}

/// docs/conformance.md#admission: a succeeded task keeps its logical key: its step still counts.
pub async fn succeeded_task_keeps_its_step(b: &dyn Backend) {
    let s = b.open().await;
    let one = budget(1, 100, 100, 100, 100, 100);
    let t = create_new(&*s, new_scoped_task("acme", "s", "a", "doc", one)).await;
    succeed(&*s, t.id).await;
    let r = rejection(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "b", "doc", one),
            "another step",
        ),
    )
    .await;
    assert_eq!(r.code(), ErrorCode::SourceBudget);
}

#[derive(Clone, Copy, Debug)]
enum Ending {
    Failed,
    Canceled,
    QueueTimeout,
    Interrupted,
}

/// Admits a task with one step and one source, ends it as `ending`, then checks that its
/// step is free (another step of its source is admitted) while its source still counts
/// (a new source is refused).
async fn ended_task_frees_its_step(b: &dyn Backend, ending: Ending) {
    let s = b.open().await;
    let acme = app("acme");
    let one = budget(1, 1, 100, 100, 100, 100);
    let t = create_new(&*s, new_scoped_task("acme", "s", "a", "doc", one)).await;
    let config = SweepConfig {
        queue_timeout: secs(600),
        ..sweep_config()
    };
    let (status, code) = match ending {
        Ending::Failed => {
            fail(&*s, t.id, "boom").await;
            (TaskStatus::Failed, ErrorCode::ProviderError)
        }
        Ending::Canceled => {
            cancel(&*s, &acme, t.id).await;
            (TaskStatus::Canceled, ErrorCode::Canceled)
        }
        Ending::QueueTimeout => {
            b.clock().advance(secs(601));
            sweep_all(&*s, &config).await;
            (TaskStatus::Failed, ErrorCode::QueueTimeout)
        }
        Ending::Interrupted => {
            claim(&*s, t.id, &worker("w")).await;
            b.clock().advance(secs(31));
            sweep_all(&*s, &config).await;
            (TaskStatus::Failed, ErrorCode::Interrupted)
        }
    };
    let ended = get(&*s, &acme, t.id).await;
    assert_eq!(ended.status, status, "{ending:?}");
    assert_eq!(ended.error.map(|e| e.code), Some(code), "{ending:?}");
    create_new(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "b", "doc", one),
            "another step",
        ),
    )
    .await;
    let r = rejection(&*s, new_scoped_task("acme", "s", "c", "new-doc", one)).await;
    assert_eq!(
        r.code(),
        ErrorCode::DailyBudget,
        "after {ending:?} the source still counts as seen"
    );
}

/// docs/conformance.md#admission, docs/conformance.md#lifecycle: a failed task frees its step; its source stays seen.
pub async fn failed_task_frees_its_step_but_source_stays_seen(b: &dyn Backend) {
    ended_task_frees_its_step(b, Ending::Failed).await;
}

/// docs/conformance.md#admission, docs/conformance.md#lifecycle: a canceled task frees its step; its source stays seen.
pub async fn canceled_task_frees_its_step_but_source_stays_seen(b: &dyn Backend) {
    ended_task_frees_its_step(b, Ending::Canceled).await;
}

/// docs/conformance.md#admission, docs/conformance.md#sweep-queue-timeout: a task expired by the queue timeout frees its step; its source stays seen.
pub async fn queue_timed_out_task_frees_its_step_but_source_stays_seen(b: &dyn Backend) {
    ended_task_frees_its_step(b, Ending::QueueTimeout).await;
}

/// docs/conformance.md#admission, docs/conformance.md#sweep-liveness: an interrupted task frees its step; its source stays seen.
pub async fn interrupted_task_frees_its_step_but_source_stays_seen(b: &dyn Backend) {
    ended_task_frees_its_step(b, Ending::Interrupted).await;
}
