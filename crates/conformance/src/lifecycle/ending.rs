//! docs/conformance.md#lifecycle fail, request cancel and mark canceled: the other endings, and that every
//! terminal state is final.

use crate::Backend;
use crate::fixtures::*;
use tollgate_core::{Clock, ErrorCode, MAX_ERROR_MESSAGE_CHARS, TaskId, TaskStatus};

/// docs/conformance.md#lifecycle fail: `queued/running → failed` with the code and a message cut to 2,000
/// characters (characters, not bytes).
pub async fn fail_cuts_message_to_2000_characters(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let queued = create_new(&*s, new_app_task("acme", "s", "queued")).await;
    let long = "é".repeat(2_500);
    b.clock().advance(secs(2));
    let tr = fail(&*s, queued.id, &long).await;
    assert!(tr.applied);
    let failed = get(&*s, &acme, queued.id).await;
    assert_eq!(tr.task.as_ref(), Some(&failed));
    assert_eq!(failed.status, TaskStatus::Failed);
    let error = failed.error.clone().expect("a failed task has an error");
    assert_eq!(error.code, ErrorCode::ProviderError);
    assert_eq!(error.message.chars().count(), MAX_ERROR_MESSAGE_CHARS);
    assert_eq!(error.message, "é".repeat(2_000));
    assert_eq!(failed.completed_at, Some(b.clock().now()));

    let running = create_new(&*s, new_app_task("acme", "s", "running")).await;
    claim(&*s, running.id, &worker("w")).await;
    let tr = s
        .fail_task(
            running.id,
            None,
            ErrorCode::InvalidModelOutput,
            "label \"maybe\" is not one of the labels",
            None,
        )
        .await
        .expect("fail_task");
    assert!(tr.applied);
    let failed = get(&*s, &acme, running.id).await;
    assert_eq!(failed.status, TaskStatus::Failed);
    assert_eq!(
        failed.error.map(|e| (e.code, e.message)),
        Some((
            ErrorCode::InvalidModelOutput,
            "label \"maybe\" is not one of the labels".to_string()
        ))
    );
}

/// docs/conformance.md#lifecycle: `fail` of a task that is already terminal is refused and changes nothing.
pub async fn fail_refuses_terminal_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let done = create_new(&*s, new_app_task("acme", "s", "done")).await;
    succeed(&*s, done.id).await;
    let failed = create_new(&*s, new_app_task("acme", "s", "failed")).await;
    fail(&*s, failed.id, "first").await;
    let canceled = create_new(&*s, new_app_task("acme", "s", "canceled")).await;
    cancel(&*s, &acme, canceled.id).await;
    for (what, id) in [
        ("succeeded", done.id),
        ("failed", failed.id),
        ("canceled", canceled.id),
    ] {
        let before = get(&*s, &acme, id).await;
        assert_refused(
            s.fail_task(id, None, ErrorCode::ProviderError, "late", None)
                .await,
            &format!("failing a {what} task"),
        );
        assert_eq!(
            get(&*s, &acme, id).await,
            before,
            "failing a {what} task changes nothing"
        );
    }
}

/// docs/conformance.md#lifecycle request cancel: a queued or a running task becomes `canceled` at once with
/// `WORKFLOW_AI_CANCELED`, and its worker sees cancellation.
pub async fn request_cancel_cancels_queued_and_running_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let queued = create_new(&*s, new_app_task("acme", "s", "queued")).await;
    let running = create_new(&*s, new_app_task("acme", "s", "running")).await;
    claim(&*s, running.id, &worker("w")).await;
    b.clock().advance(secs(1));
    for (what, id) in [("queued", queued.id), ("running", running.id)] {
        let tr = cancel(&*s, &acme, id).await;
        assert!(tr.applied, "canceling a {what} task applies");
        let t = get(&*s, &acme, id).await;
        assert_eq!(tr.task.as_ref(), Some(&t));
        assert_eq!(
            t.status,
            TaskStatus::Canceled,
            "a {what} task becomes canceled at once"
        );
        assert!(t.cancel_requested);
        assert_eq!(t.error.as_ref().map(|e| e.code), Some(ErrorCode::Canceled));
        assert_eq!(t.completed_at, Some(b.clock().now()));
        assert!(
            cancel_requested(&*s, id).await,
            "the worker of a {what} task sees cancellation"
        );
    }
    assert_eq!(
        s.request_cancel(&acme, TaskId::generate())
            .await
            .expect("request_cancel"),
        None,
        "a missing task is None"
    );
}

/// docs/conformance.md#lifecycle: terminal states are final: cancel, fail, complete and claim change nothing
/// once a task succeeded, failed or was canceled.
pub async fn terminal_states_are_final(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("finisher");
    let done = create_new(&*s, new_app_task("acme", "s", "done")).await;
    succeed(&*s, done.id).await;
    let failed = create_new(&*s, new_app_task("acme", "s", "failed")).await;
    claim(&*s, failed.id, &w).await;
    fail(&*s, failed.id, "boom").await;
    let canceled = create_new(&*s, new_app_task("acme", "s", "canceled")).await;
    claim(&*s, canceled.id, &w).await;
    cancel(&*s, &acme, canceled.id).await;
    b.clock().advance(secs(5));
    for (what, id) in [
        ("succeeded", done.id),
        ("failed", failed.id),
        ("canceled", canceled.id),
    ] {
        let before = terminal_facts(&get(&*s, &acme, id).await);
        let tr = s
            .request_cancel(&acme, id)
            .await
            .expect("request_cancel")
            .expect("task exists");
        assert!(!tr.applied, "canceling a {what} task changes nothing");
        assert_eq!(try_claim(&*s, id, &w).await, None);
        let _ = s
            .fail_task(id, None, ErrorCode::ProviderError, "late", None)
            .await;
        let _ = s.complete_task(id, &lease(&w, 1), spam(), usage()).await;
        let _ = s.mark_canceled(id).await;
        assert_eq!(
            terminal_facts(&get(&*s, &acme, id).await),
            before,
            "a {what} task stays as it was"
        );
    }
}

/// docs/conformance.md#cancellation-requested is cancellation requested: false for a live task, true once it is canceled,
/// true when its run is canceled, and true when the task no longer exists (deleted owner,
/// or an id that never existed).
pub async fn is_cancellation_requested_for_canceled_run_canceled_and_missing_tasks(
    b: &dyn Backend,
) {
    let s = b.open().await;
    let acme = app("acme");
    let live = create_new(&*s, new_app_task("acme", "s", "live")).await;
    assert!(
        !cancel_requested(&*s, live.id).await,
        "a queued task is not canceled"
    );
    claim(&*s, live.id, &worker("w")).await;
    assert!(
        !cancel_requested(&*s, live.id).await,
        "a running task is not canceled"
    );
    let done = create_new(&*s, new_app_task("acme", "s", "done")).await;
    succeed(&*s, done.id).await;
    assert!(
        !cancel_requested(&*s, done.id).await,
        "a succeeded task was not canceled"
    );

    cancel(&*s, &acme, live.id).await;
    assert!(cancel_requested(&*s, live.id).await, "a canceled task");

    let run = create_run(&*s, new_run("acme", "s")).await;
    let run_task = create_new(&*s, new_run_task("acme", run.id, "run-task")).await;
    claim(&*s, run_task.id, &worker("w")).await;
    assert!(!cancel_requested(&*s, run_task.id).await);
    s.request_run_cancel(&acme, run.id)
        .await
        .expect("request_run_cancel")
        .expect("run exists");
    assert!(
        cancel_requested(&*s, run_task.id).await,
        "a task of a canceled run"
    );

    let doomed = create_new(&*s, new_app_task("acme", "doomed", "doomed")).await;
    claim(&*s, doomed.id, &worker("w")).await;
    s.delete_owner_data(&acme, &scope("doomed"), None)
        .await
        .expect("delete_owner_data");
    assert!(
        cancel_requested(&*s, doomed.id).await,
        "a task whose owner was deleted"
    );
    assert!(
        cancel_requested(&*s, TaskId::generate()).await,
        "a task that never existed"
    );
}

/// `mark_canceled`: a worker's acknowledgement moves a task to `canceled` only when
/// cancellation was requested; a live task is left running, a canceled one stays canceled,
/// a missing one is reported as such.
pub async fn mark_canceled_acknowledges_requested_cancellation_only(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let t = create_new(&*s, new_app_task("acme", "s", "k")).await;
    let running = claim(&*s, t.id, &worker("w")).await;
    assert_refused(
        s.mark_canceled(t.id).await,
        "mark_canceled without a cancellation request",
    );
    assert_eq!(get(&*s, &acme, t.id).await, running);

    cancel(&*s, &acme, t.id).await;
    let canceled = get(&*s, &acme, t.id).await;
    let tr = s.mark_canceled(t.id).await.expect("mark_canceled");
    let now = get(&*s, &acme, t.id).await;
    assert_eq!(now.status, TaskStatus::Canceled);
    assert_eq!(
        now.error.as_ref().map(|e| e.code),
        Some(ErrorCode::Canceled)
    );
    assert_eq!(
        terminal_facts(&now),
        terminal_facts(&canceled),
        "acknowledging twice changes nothing"
    );
    assert!(tr.woken_runs.is_empty());

    let tr = s
        .mark_canceled(TaskId::generate())
        .await
        .expect("mark_canceled");
    assert!(
        !tr.applied && tr.task.is_none(),
        "a missing task: not applied, no task"
    );
}
