//! docs/telemetry.md, "One trace per task": a task keeps the trace position it was
//! submitted with (`trace_parent`), whichever way it was created, so the worker that
//! claims it continues the same trace.

use super::Backend;
use super::fixtures::*;
use tollgate_core::{NewTask, TraceParent};

fn position(n: u8) -> TraceParent {
    TraceParent {
        trace_id: [n; 16],
        parent_id: [n.wrapping_add(1); 8],
        flags: 1,
    }
}

fn traced(mut task: NewTask, n: u8) -> NewTask {
    task.trace_parent = Some(position(n));
    task
}

/// A created task (application or scoped, alone or in a batch) reads back, and is
/// claimed, with its trace position; a task created without one has none.
pub async fn tasks_keep_their_trace_parent(b: &dyn Backend) {
    let s = b.open().await;
    let w = worker("w");
    let acme = app("acme");
    let plain = create_new(&*s, traced(new_app_task("acme", "s", "plain"), 1)).await;
    assert_eq!(plain.trace_parent, Some(position(1)), "create answers it");
    assert_eq!(
        get(&*s, &acme, plain.id).await.trace_parent,
        Some(position(1)),
        "a read answers it"
    );
    assert_eq!(
        claim(&*s, plain.id, &w).await.trace_parent,
        Some(position(1)),
        "the claim hands it to the worker"
    );
    let scoped = create_new(
        &*s,
        traced(
            new_scoped_task("acme", "s", "scoped", "doc", unlimited()),
            2,
        ),
    )
    .await;
    assert_eq!(scoped.trace_parent, Some(position(2)), "an admitted task");
    let untraced = create_new(&*s, new_app_task("acme", "s", "untraced")).await;
    assert_eq!(untraced.trace_parent, None, "no position: none stored");
    let batch = s
        .create_tasks(vec![
            traced(new_app_task("acme", "b", "batch-1"), 3),
            new_app_task("acme", "b", "batch-2"),
            traced(
                new_scoped_task("acme", "b", "batch-3", "doc-b", unlimited()),
                4,
            ),
        ])
        .await
        .expect("create_tasks");
    let positions: Vec<Option<TraceParent>> = batch
        .into_iter()
        .map(|c| c.expect("created").task.trace_parent)
        .collect();
    assert_eq!(
        positions,
        vec![Some(position(3)), None, Some(position(4))],
        "a batch keeps each item's position"
    );
}

/// docs/telemetry.md, "Runs": a run keeps the trace position it was created with, on
/// creation, reads and listings; a run created without one has none.
pub async fn runs_keep_their_trace_parent(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let mut new = new_run("acme", "s");
    new.trace_parent = Some(position(7));
    let traced_run = create_run(&*s, new).await;
    assert_eq!(
        traced_run.trace_parent,
        Some(position(7)),
        "create answers it"
    );
    assert_eq!(
        get_run(&*s, &acme, traced_run.id).await.trace_parent,
        Some(position(7)),
        "a read answers it"
    );
    let plain = create_run(&*s, new_run("acme", "s")).await;
    assert_eq!(plain.trace_parent, None);
    assert_eq!(get_run(&*s, &acme, plain.id).await.trace_parent, None);
}
