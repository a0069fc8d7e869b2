//! docs/conformance.md#lifecycle complete (and docs/conformance.md#task-kinds: only a contract-valid output is stored as success).

use crate::Backend;
use crate::fixtures::*;
use serde_json::json;
use tollgate_core::{
    Clock, DEFAULT_MAX_REQUEST_BYTES, ErrorCode, NewTask, Task, TaskId, TaskKind, TaskStatus,
    ValidatedRequest,
};
use tollgate_store::StoreError;

/// docs/conformance.md#lifecycle complete and docs/conformance.md#task-kinds: `running → succeeded` with the output and the usage.
pub async fn complete_records_output_and_usage(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let t = create_new(&*s, new_app_task("acme", "s", "k")).await;
    let w = worker("w");
    claim(&*s, t.id, &w).await;
    b.clock().advance(secs(5));
    let tr = complete(&*s, t.id, &w, spam()).await;
    assert!(tr.applied);
    assert!(tr.woken_runs.is_empty());
    let done = tr.task.expect("the completed task is returned");
    assert_eq!(done.status, TaskStatus::Succeeded);
    assert_eq!(done.output, Some(spam()));
    assert_eq!(
        done.usage,
        Some(usage()),
        "usage is recorded with the result"
    );
    assert_eq!(done.error, None);
    assert_eq!(done.completed_at, Some(b.clock().now()));
    assert_eq!(get(&*s, &acme, t.id).await, done);
}

/// docs/conformance.md#lifecycle complete: a late completion of a task that was canceled, failed, or expired
/// (queue timeout or interruption) is refused and changes nothing.
pub async fn complete_refuses_canceled_failed_and_expired_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    let canceled = create_new(&*s, new_app_task("acme", "s", "canceled")).await;
    claim(&*s, canceled.id, &w).await;
    cancel(&*s, &acme, canceled.id).await;
    let failed = create_new(&*s, new_app_task("acme", "s", "failed")).await;
    claim(&*s, failed.id, &w).await;
    fail(&*s, failed.id, "provider down").await;
    let interrupted = create_new(&*s, new_app_task("acme", "s", "interrupted")).await;
    claim(&*s, interrupted.id, &w).await;
    b.clock().advance(secs(31));
    let timed_out = create_new(&*s, new_app_task("acme", "s", "timed-out")).await;
    b.clock().advance(secs(601));
    sweep_all(&*s, &sweep_config()).await;

    for (what, id, code) in [
        ("canceled", canceled.id, ErrorCode::Canceled),
        ("failed", failed.id, ErrorCode::ProviderError),
        ("interrupted", interrupted.id, ErrorCode::Interrupted),
        ("queue-timed-out", timed_out.id, ErrorCode::QueueTimeout),
    ] {
        let before = get(&*s, &acme, id).await;
        assert_eq!(before.error.as_ref().map(|e| e.code), Some(code), "{what}");
        assert_refused(
            s.complete_task(id, &lease(&w, 1), spam(), usage()).await,
            &format!("completing a {what} task"),
        );
        assert_eq!(
            get(&*s, &acme, id).await,
            before,
            "a refused completion of a {what} task changes nothing"
        );
    }
}

/// docs/conformance.md#lifecycle: only the worker holding a running task completes it; a queued task cannot be
/// completed.
pub async fn complete_refuses_a_task_not_held_by_the_worker(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let queued = create_new(&*s, new_app_task("acme", "s", "queued")).await;
    assert_refused(
        s.complete_task(queued.id, &lease(&worker("w1"), 1), spam(), usage())
            .await,
        "completing a queued task",
    );
    assert_eq!(get(&*s, &acme, queued.id).await, queued);
    let running = claim(&*s, queued.id, &worker("w1")).await;
    assert_refused(
        s.complete_task(queued.id, &lease(&worker("w2"), 1), spam(), usage())
            .await,
        "completing another worker's task",
    );
    assert_eq!(get(&*s, &acme, queued.id).await, running);
    assert_refused(
        s.complete_task(
            TaskId::generate(),
            &lease(&worker("w1"), 1),
            spam(),
            usage(),
        )
        .await,
        "completing a missing task",
    );
}

/// docs/conformance.md#lifecycle, batched: `complete_tasks` answers each item exactly as `complete_task` would
/// (applied, refused for another worker's or a missing task, `InvalidOutput` for a bad
/// output), in order, and only the applied items change.
pub async fn complete_tasks_answers_each_item_like_complete_task(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w1");
    let a = create_new(&*s, new_app_task("acme", "s", "a")).await;
    let other = create_new(&*s, new_app_task("acme", "s", "other")).await;
    let bad = create_new(&*s, new_app_task("acme", "s", "bad")).await;
    let d = create_new(&*s, new_app_task("acme", "s", "d")).await;
    let claimed_a = claim(&*s, a.id, &w).await;
    let held_elsewhere = claim(&*s, other.id, &worker("w2")).await;
    let running_bad = claim(&*s, bad.id, &w).await;
    claim(&*s, d.id, &w).await;
    // The worker's claimed copy stands in for reading the row (`a`, `bad`, and `other`'s
    // copy as another worker claimed it); a copy of another task is ignored (`d`).
    let item = |id, output, claimed: Option<&Task>| tollgate_store::Completion {
        id,
        lease: lease(&w, 1),
        output,
        usage: usage(),
        claimed: claimed.map(|t| std::sync::Arc::new(t.clone())),
        attempt: None,
    };
    // `a`'s last attempt used less than the task (an earlier attempt used the rest).
    let last_attempt = tollgate_core::Usage {
        input_tokens: 1,
        output_tokens: 1,
        ..usage()
    };
    let answers = s
        .complete_tasks(vec![
            tollgate_store::Completion {
                attempt: Some(tollgate_store::AttemptUsage {
                    usage: last_attempt,
                    prices: None,
                }),
                ..item(a.id, spam(), Some(&claimed_a))
            },
            item(other.id, spam(), Some(&held_elsewhere)),
            item(bad.id, json!({"label": "maybe"}), Some(&running_bad)),
            item(TaskId::generate(), spam(), None),
            item(d.id, spam(), Some(&claimed_a)),
        ])
        .await
        .expect("complete_tasks");
    assert_eq!(answers.len(), 5, "one answer per item");
    for (i, id) in [(0, a.id), (4, d.id)] {
        match &answers[i] {
            Ok(t) => {
                assert!(t.applied, "item {i} applies");
                let task = t.task.as_ref().expect("the task as it is now");
                assert_eq!(task.status, TaskStatus::Succeeded, "item {i}");
                assert_eq!(
                    task,
                    &get(&*s, &acme, id).await,
                    "item {i}: the row as stored"
                );
            }
            other => panic!("item {i} should apply, got {other:?}"),
        }
    }
    // Each applied completion ended its claim's attempt `succeeded`, with what that
    // attempt used (the task's usage when the item does not say).
    for (id, used) in [(a.id, last_attempt), (d.id, usage())] {
        let attempts = s.task_attempts(&acme, id).await.expect("attempts");
        assert_eq!(
            attempts
                .iter()
                .map(|a| (a.n, a.outcome, a.usage))
                .collect::<Vec<_>>(),
            vec![(1, tollgate_core::AttemptOutcome::Succeeded, Some(used))],
            "the attempt ends with its completion"
        );
    }
    assert_refused(
        answers[1]
            .as_ref()
            .map(Clone::clone)
            .map_err(|e| StoreError::Database(e.to_string())),
        "completing another worker's task in a batch",
    );
    assert_eq!(get(&*s, &acme, other.id).await, held_elsewhere);
    match &answers[2] {
        Err(StoreError::InvalidOutput(_)) => {}
        other => panic!("a bad output in a batch should be InvalidOutput, got {other:?}"),
    }
    assert_eq!(get(&*s, &acme, bad.id).await, running_bad);
    match &answers[3] {
        Ok(t) => assert!(!t.applied && t.task.is_none(), "a missing task is refused"),
        other => panic!("a missing task should be refused, got {other:?}"),
    }
}

/// docs/conformance.md#task-kinds, docs/conformance.md#lifecycle: an output that violates the kind's contract is never stored as success:
/// `StoreError::InvalidOutput`, and the task is unchanged (still running, so the worker may
/// ask again).
pub async fn complete_refuses_invalid_output_and_changes_nothing(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    let t = create_new(&*s, new_app_task("acme", "s", "classify")).await;
    let running = claim(&*s, t.id, &w).await;
    for bad in [
        json!({"label": "maybe"}),
        json!({"text": "spam"}),
        json!("spam"),
    ] {
        match s
            .complete_task(t.id, &lease(&w, 1), bad.clone(), usage())
            .await
        {
            Err(StoreError::InvalidOutput(_)) => {}
            other => panic!("output {bad} should be refused with InvalidOutput, got {other:?}"),
        }
        assert_eq!(
            get(&*s, &acme, t.id).await,
            running,
            "a refused output changes nothing"
        );
    }
    assert!(
        complete(&*s, t.id, &w, ham()).await.applied,
        "a valid output is accepted afterwards"
    );

    let many = ValidatedRequest::new(
        TaskKind::ClassifyMany,
        &json!({"items": [{"id": "a", "input": "Win!"}, {"id": "b", "input": "Lunch?"}], "labels": ["spam", "ham"]}),
        DEFAULT_MAX_REQUEST_BYTES,
    )
    .expect("valid classify_many request");
    let t = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            request: many,
            ..new_app_task("acme", "s", "many")
        },
    )
    .await;
    let running = claim(&*s, t.id, &w).await;
    let missing_id = json!({"results": [{"id": "a", "label": "spam"}]});
    match s
        .complete_task(t.id, &lease(&w, 1), missing_id, usage())
        .await
    {
        Err(StoreError::InvalidOutput(_)) => {}
        other => panic!("a classify_many output missing an id should be refused, got {other:?}"),
    }
    assert_eq!(get(&*s, &acme, t.id).await, running);
}
