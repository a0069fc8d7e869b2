//! docs/conformance.md#concepts, docs/conformance.md#tenant-isolation: tenants never see or touch each other's rows, even with the same
//! effect key.

use super::Backend;
use super::fixtures::*;
use serde_json::json;
use tollgate_core::TaskStatus;
use tollgate_store::{RunResult, StoreError};

/// docs/conformance.md#concepts, docs/conformance.md#per-app-effect-keys: another app cannot see a task, by id or by effect key.
pub async fn another_app_cannot_see_a_task_even_with_its_effect_key(b: &dyn Backend) {
    let s = b.open().await;
    let t = create_new(
        &*s,
        new_scoped_task("acme", "s", "shared-key", "doc", unlimited()),
    )
    .await;
    let globex = app("globex");
    assert_eq!(try_get(&*s, &globex, t.id).await, None, "by id");
    assert_eq!(
        get_by_key(&*s, &globex, "shared-key").await,
        None,
        "by effect key"
    );
    assert_eq!(get(&*s, &app("acme"), t.id).await, t);
}

/// docs/conformance.md#concepts, docs/conformance.md#application-tasks: another app can neither cancel, release nor delete a task (nor its run).
pub async fn another_app_cannot_cancel_release_or_delete_a_task(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let globex = app("globex");
    let t = create_new(&*s, new_scoped_task("acme", "s", "k", "doc", unlimited())).await;
    assert_eq!(
        s.request_cancel(&globex, t.id)
            .await
            .expect("request_cancel"),
        None,
        "cancel"
    );
    assert!(
        !s.release(&globex, &scope("s"), &key("k"))
            .await
            .expect("release"),
        "release"
    );
    assert_eq!(
        s.delete_owner_data(&globex, &scope("s"), None)
            .await
            .expect("delete_owner_data"),
        0,
        "delete"
    );
    assert_eq!(
        s.delete_owner_data(&globex, &scope("s"), Some(&source("doc")))
            .await
            .expect("delete_owner_data"),
        0
    );
    let after = get(&*s, &acme, t.id).await;
    assert_eq!(after, t, "the task is untouched");
    assert!(!cancel_requested(&*s, t.id).await);

    let run = create_run(&*s, new_run("acme", "s")).await;
    let run_task = create_new(&*s, new_run_task("acme", run.id, "run-task")).await;
    assert_eq!(
        s.request_run_cancel(&globex, run.id)
            .await
            .expect("request_run_cancel"),
        None
    );
    assert_eq!(s.get_run(&globex, run.id).await.expect("get_run"), None);
    assert_eq!(
        s.finish_run(&globex, run.id, RunResult::Succeeded(json!(null)))
            .await
            .expect("finish_run"),
        None
    );
    assert!(
        s.wait_on_task(&globex, run.id, run_task.id).await.is_err(),
        "another app's run cannot wait"
    );
    assert_eq!(
        get_run(&*s, &acme, run.id).await,
        run,
        "the run is untouched"
    );
    assert_eq!(
        get(&*s, &acme, run_task.id).await.status,
        TaskStatus::Queued
    );
}

/// docs/conformance.md#concepts, docs/conformance.md#per-app-effect-keys: two apps use the same effect key independently: each gets its own task,
/// replays return each app's own, and ending one leaves the other as it was.
pub async fn apps_use_the_same_effect_key_independently(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let globex = app("globex");
    let a = create_new(
        &*s,
        new_scoped_task("acme", "s", "same", "doc", unlimited()),
    )
    .await;
    let g = create(
        &*s,
        new_scoped_task("globex", "s", "same", "doc", unlimited()),
    )
    .await;
    assert!(
        g.created,
        "another app's key is a new task, never a replay of a foreign task"
    );
    assert_ne!(g.task.id, a.id);
    assert_eq!(g.task.app, globex);
    assert_eq!(
        create(
            &*s,
            new_scoped_task("acme", "s", "same", "doc", unlimited())
        )
        .await
        .task
        .id,
        a.id
    );
    assert_eq!(
        create(
            &*s,
            new_scoped_task("globex", "s", "same", "doc", unlimited())
        )
        .await
        .task
        .id,
        g.task.id
    );
    assert_eq!(
        get_by_key(&*s, &acme, "same").await.map(|t| t.id),
        Some(a.id)
    );
    assert_eq!(
        get_by_key(&*s, &globex, "same").await.map(|t| t.id),
        Some(g.task.id)
    );

    succeed(&*s, a.id).await;
    assert_eq!(
        get(&*s, &globex, g.task.id).await.status,
        TaskStatus::Queued
    );
    assert!(
        s.release(&acme, &scope("s"), &key("same"))
            .await
            .expect("release")
    );
    assert_eq!(get(&*s, &globex, g.task.id).await.released_at, None);
    assert_eq!(
        s.delete_owner_data(&acme, &scope("s"), None)
            .await
            .expect("delete_owner_data"),
        1
    );
    assert_eq!(
        get(&*s, &globex, g.task.id).await.status,
        TaskStatus::Queued,
        "deleting one app's data keeps the other's"
    );
}

/// docs/conformance.md#create-owner-check, docs/conformance.md#concepts: a task cannot be attached to another app's run.
pub async fn another_app_cannot_use_a_run(b: &dyn Backend) {
    let s = b.open().await;
    let run = create_run(&*s, new_run("acme", "s")).await;
    let err = create_err(&*s, new_run_task("globex", run.id, "k")).await;
    assert!(
        matches!(err, StoreError::RunNotFound(_)),
        "expected RunNotFound, got {err:?}"
    );
}
