//! docs/conformance.md#listings: listings stay bounded. A filter no index serves (kind, step, a
//! status set with `succeeded`) walks at most [`LIST_WALK`] tasks per page; a page that
//! ends short there still says where to go on, and following `next` finds every match.

use super::Backend;
use super::fixtures::*;
use std::time::Duration;
use tollgate_core::{Clock, ErrorCode, NewTask, TaskStatus};
use tollgate_store::list::{LIST_WALK, ListCursor, TaskListQuery};

/// docs/conformance.md#listings: three matching tasks older than a walk's worth of others are found by
/// following `next` from a first page that holds none of them.
pub async fn walked_filter_pages_go_on_past_the_walk(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let rare = |n: usize| NewTask {
        step: step("rare"),
        ..new_app_task("acme", "s", &format!("rare-{n}"))
    };
    let made = s
        .create_tasks((0..3).map(rare).collect())
        .await
        .expect("create the rare tasks");
    assert!(made.iter().all(|c| c.is_ok()), "{made:?}");
    b.clock().advance(Duration::from_millis(1));
    let others: Vec<NewTask> = (0..LIST_WALK as usize + 2)
        .map(|n| new_app_task("acme", "s", &format!("other-{n}")))
        .collect();
    for chunk in others.chunks(500) {
        let made = s.create_tasks(chunk.to_vec()).await.expect("create others");
        assert!(made.iter().all(|c| c.is_ok()));
    }

    let mut query = TaskListQuery {
        step: Some(step("rare")),
        limit: 10,
        ..Default::default()
    };
    let first = s.list_tasks(&acme, &query).await.expect("first page");
    assert!(
        first.items.is_empty(),
        "the newest {LIST_WALK} tasks hold no match"
    );
    let next = first.next.expect("a short walked page says where to go on");
    assert!(matches!(next, ListCursor::Newest { .. }));
    query.after = Some(next);
    let second = s.list_tasks(&acme, &query).await.expect("second page");
    assert_eq!(second.items.len(), 3, "every match, oldest last");
    assert!(second.items.iter().all(|t| t.step.as_str() == "rare"));
    assert!(second.next.is_none(), "the walk reached the end");
}

/// A subject's listing hands out only positions of that subject's own tasks: with a walk's
/// worth of another subject's newer tasks in the app, the first page still finds the
/// subject's tasks, and no `next` carries another subject's task id or time.
pub async fn a_subjects_cursor_carries_only_its_own_positions(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let mine: Vec<NewTask> = (0..3)
        .map(|n| {
            with_subject(
                new_app_task("acme", "s", &format!("alice-{n}")),
                Some(user("alice")),
            )
        })
        .collect();
    let made = s.create_tasks(mine).await.expect("alice's tasks");
    let mine: Vec<String> = made
        .iter()
        .map(|c| c.as_ref().expect("created").task.id.to_string())
        .collect();
    b.clock().advance(Duration::from_millis(1));
    let others: Vec<NewTask> = (0..LIST_WALK as usize + 2)
        .map(|n| {
            with_subject(
                new_app_task("acme", "s", &format!("bob-{n}")),
                Some(user("bob")),
            )
        })
        .collect();
    for chunk in others.chunks(500) {
        let made = s.create_tasks(chunk.to_vec()).await.expect("bob's tasks");
        assert!(made.iter().all(|c| c.is_ok()));
    }
    for step_filter in [None, Some(step("label-email")), Some(step("nothing"))] {
        let mut query = TaskListQuery {
            subject: Some(user("alice")),
            step: step_filter.clone(),
            limit: 1,
            ..Default::default()
        };
        let mut seen = Vec::new();
        for _ in 0..10 {
            let page = s.list_tasks(&acme, &query).await.expect("a page");
            seen.extend(page.items.iter().map(|t| t.id.to_string()));
            let Some(next) = page.next else { break };
            let ListCursor::Newest { id, .. } = &next else {
                panic!("a task cursor: {next:?}")
            };
            assert!(
                mine.contains(id),
                "{step_filter:?}: the cursor carries another subject's task {id}"
            );
            query.after = Some(next);
        }
        let expected: Vec<String> = if step_filter
            .as_ref()
            .is_some_and(|s| s.as_str() == "nothing")
        {
            Vec::new()
        } else {
            mine.iter().rev().cloned().collect()
        };
        let mut got = seen.clone();
        got.sort();
        let mut want = expected.clone();
        want.sort();
        assert_eq!(
            got, want,
            "{step_filter:?}: every one of alice's tasks, once"
        );
    }
}

/// docs/conformance.md#listings: `error_code` lists the app's tasks that ended with that code (the dashboard's
/// click-through from a failure count), and nothing else: not other codes, not
/// succeeded or queued tasks, not another app's failures.
pub async fn the_error_code_filter_lists_only_tasks_that_ended_with_it(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let failed = create_new(&*s, new_app_task("acme", "s", "failed")).await;
    fail(&*s, failed.id, "boom").await;
    let canceled = create_new(&*s, new_app_task("acme", "s", "canceled")).await;
    cancel(&*s, &acme, canceled.id).await;
    let done = create_new(&*s, new_app_task("acme", "s", "done")).await;
    succeed(&*s, done.id).await;
    create_new(&*s, new_app_task("acme", "s", "queued")).await;
    let theirs = create_new(&*s, new_app_task("beta", "s", "failed")).await;
    fail(&*s, theirs.id, "boom").await;

    let code_of = |t: &tollgate_core::Task| t.error.as_ref().map(|e| e.code.as_str().to_string());
    let canceled_code =
        code_of(&get(&*s, &acme, canceled.id).await).expect("a canceled task has a code");
    for (code, want) in [
        (ErrorCode::ProviderError.as_str(), vec![failed.id]),
        (canceled_code.as_str(), vec![canceled.id]),
        (ErrorCode::QueueTimeout.as_str(), vec![]),
    ] {
        let query = TaskListQuery {
            error_code: Some(code.to_string()),
            limit: 50,
            ..Default::default()
        };
        let page = s.list_tasks(&acme, &query).await.expect("list by code");
        let got: Vec<_> = page.items.iter().map(|t| t.id).collect();
        assert_eq!(got, want, "error_code={code}");
        assert!(page.next.is_none());
    }
    let both = TaskListQuery {
        error_code: Some(ErrorCode::ProviderError.as_str().into()),
        statuses: vec![TaskStatus::Canceled],
        ..Default::default()
    };
    assert!(
        s.list_tasks(&acme, &both)
            .await
            .expect("list")
            .items
            .is_empty(),
        "the code and the status filter both hold"
    );
}

/// docs/conformance.md#listings stats: each finished task the stats read says when it finished (the per-minute
/// series of `GET /v1/stats` is made from it), newest first.
pub async fn stats_samples_say_when_each_task_finished(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let first = create_new(&*s, new_app_task("acme", "s", "first")).await;
    let second = create_new(&*s, new_app_task("acme", "s", "second")).await;
    b.clock().advance(Duration::from_secs(5));
    fail(&*s, first.id, "boom").await;
    let first_at = b.clock().now();
    b.clock().advance(Duration::from_secs(90));
    succeed(&*s, second.id).await;
    let second_at = b.clock().now();
    let raw = s.task_stats(&acme, None).await.expect("stats");
    let seen: Vec<_> = raw
        .finished
        .iter()
        .map(|f| (f.status, f.completed_at))
        .collect();
    assert_eq!(
        seen,
        vec![
            (TaskStatus::Succeeded, second_at),
            (TaskStatus::Failed, first_at)
        ]
    );
}
