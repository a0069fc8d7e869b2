//! SPEC §5: claim, heartbeat, complete, fail, cancel; SPEC §6.7: recovery listing.

use super::Backend;
use super::fixtures::*;
use serde_json::json;
use tollgate_core::{
    Clock, DEFAULT_MAX_REQUEST_BYTES, ErrorCode, MAX_ERROR_MESSAGE_CHARS, NewTask, Task, TaskId,
    TaskKind, TaskStatus, ValidatedRequest,
};
use tollgate_store::StoreError;

/// SPEC §5 claim: `queued → running`, recorded with the worker and the time; a task is
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

/// SPEC §5 claim: a canceled task is never claimed, nor a failed or succeeded one.
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

/// SPEC §5 claim: a task of a canceled run is never claimed.
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

/// SPEC §5/§6.7: `claim_next` claims claimable queued tasks of every app, oldest first,
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

/// SPEC §5 heartbeat and §12: one call covers many tasks; it keeps the worker's running
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
    let report = s.heartbeat(&w1, &ids).await.expect("heartbeat");
    let mut alive = report.alive.clone();
    alive.sort();
    let mut expected_alive = mine.clone();
    expected_alive.sort();
    assert_eq!(
        alive, expected_alive,
        "the worker's running tasks are alive"
    );
    let mut stop = report.stop.clone();
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

/// SPEC §5 complete and §2: `running → succeeded` with the output and the usage.
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

/// SPEC §5 complete: a late completion of a task that was canceled, failed, or expired
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
            s.complete_task(id, &w, spam(), usage()).await,
            &format!("completing a {what} task"),
        );
        assert_eq!(
            get(&*s, &acme, id).await,
            before,
            "a refused completion of a {what} task changes nothing"
        );
    }
}

/// SPEC §5: only the worker holding a running task completes it; a queued task cannot be
/// completed.
pub async fn complete_refuses_a_task_not_held_by_the_worker(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let queued = create_new(&*s, new_app_task("acme", "s", "queued")).await;
    assert_refused(
        s.complete_task(queued.id, &worker("w1"), spam(), usage())
            .await,
        "completing a queued task",
    );
    assert_eq!(get(&*s, &acme, queued.id).await, queued);
    let running = claim(&*s, queued.id, &worker("w1")).await;
    assert_refused(
        s.complete_task(queued.id, &worker("w2"), spam(), usage())
            .await,
        "completing another worker's task",
    );
    assert_eq!(get(&*s, &acme, queued.id).await, running);
    assert_refused(
        s.complete_task(TaskId::generate(), &worker("w1"), spam(), usage())
            .await,
        "completing a missing task",
    );
}

/// SPEC §5, batched: `complete_tasks` answers each item exactly as `complete_task` would
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
        worker: w.clone(),
        output,
        usage: usage(),
        claimed: claimed.map(|t| std::sync::Arc::new(t.clone())),
    };
    let answers = s
        .complete_tasks(vec![
            item(a.id, spam(), Some(&claimed_a)),
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

/// SPEC §2/§5: an output that violates the kind's contract is never stored as success:
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
        match s.complete_task(t.id, &w, bad.clone(), usage()).await {
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
    match s.complete_task(t.id, &w, missing_id, usage()).await {
        Err(StoreError::InvalidOutput(_)) => {}
        other => panic!("a classify_many output missing an id should be refused, got {other:?}"),
    }
    assert_eq!(get(&*s, &acme, t.id).await, running);
}

/// SPEC §5 fail: `queued/running → failed` with the code and a message cut to 2,000
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

/// SPEC §5: `fail` of a task that is already terminal is refused and changes nothing.
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
            s.fail_task(id, ErrorCode::ProviderError, "late", None)
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

/// SPEC §5 request cancel: a queued or a running task becomes `canceled` at once with
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

/// SPEC §5: terminal states are final: cancel, fail, complete and claim change nothing
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
            .fail_task(id, ErrorCode::ProviderError, "late", None)
            .await;
        let _ = s.complete_task(id, &w, spam(), usage()).await;
        let _ = s.mark_canceled(id).await;
        assert_eq!(
            terminal_facts(&get(&*s, &acme, id).await),
            before,
            "a {what} task stays as it was"
        );
    }
}

/// SPEC §5 is cancellation requested: false for a live task, true once it is canceled,
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

/// SPEC §6.7 recovery: `first_queued` is the oldest queued task (creation time, then
/// id) of any app — not a running or terminal one — and none once nothing is queued.
pub async fn first_queued_is_the_oldest_queued_task(b: &dyn Backend) {
    let s = b.open().await;
    assert_eq!(s.first_queued().await.expect("first_queued"), None);
    let mut tasks = Vec::new();
    for i in 0..7 {
        let app_name = if i % 2 == 0 { "acme" } else { "globex" };
        tasks.push(create_new(&*s, new_app_task(app_name, "s", &format!("k{i}"))).await);
        if i % 3 == 0 {
            b.clock().advance(secs(1));
        }
    }
    tasks.sort_by_key(|t| (t.created_at, t.id));
    let oldest = |tasks: &[Task]| tasks.first().map(|t| t.id);
    assert_eq!(
        s.first_queued().await.expect("first_queued"),
        oldest(&tasks)
    );
    let running = tasks.remove(0);
    claim(&*s, running.id, &worker("w")).await;
    let failed = tasks.remove(0);
    fail(&*s, failed.id, "boom").await;
    let canceled = tasks.remove(0);
    cancel(&*s, &canceled.app, canceled.id).await;
    assert_eq!(
        s.first_queued().await.expect("first_queued"),
        oldest(&tasks),
        "running and terminal tasks are not recovered"
    );
    for t in &tasks {
        claim(&*s, t.id, &worker("w")).await;
    }
    assert_eq!(s.first_queued().await.expect("first_queued"), None);
}

/// A kept setting: the first value written wins, every instance (replica) reads it, and
/// racing first writes agree on one value.
pub async fn kept_settings_keep_the_first_value_across_instances(b: &dyn Backend) {
    let s = b.open().await;
    assert_eq!(s.keep_setting("dev_key", "one").await.expect("keep"), "one");
    assert_eq!(
        s.keep_setting("dev_key", "two").await.expect("keep"),
        "one",
        "the first value stays"
    );
    let other = b.open().await;
    assert_eq!(
        other.keep_setting("dev_key", "three").await.expect("keep"),
        "one"
    );
    assert_eq!(other.keep_setting("other", "x").await.expect("keep"), "x");
    let mut racers = Vec::new();
    for i in 0..8 {
        let s = b.open().await;
        racers.push(tokio::spawn(async move {
            s.keep_setting("raced", &format!("v{i}"))
                .await
                .expect("keep")
        }));
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in racers {
        seen.insert(r.await.expect("racer"));
    }
    assert_eq!(seen.len(), 1, "racing first writes agree: {seen:?}");
}
