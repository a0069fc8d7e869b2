//! docs/conformance.md#admission-order's table: each limit, its refusal, the order of the checks, and that a refusal
//! writes nothing.

use crate::Backend;
use crate::fixtures::*;
use std::time::Duration;
use tollgate_core::{AdmissionRejection, Budget, ErrorCode, NewTask, TaskStatus};

/// docs/conformance.md#admission `max_steps_per_source`: distinct logical steps of one source in 24 h;
/// `WORKFLOW_AI_SOURCE_BUDGET`. Other sources are not affected.
pub async fn source_budget_limits_distinct_steps_per_source(b: &dyn Backend) {
    let s = b.open().await;
    let two = budget(2, 100, 100, 100, 100, 100);
    create_new(
        &*s,
        with_input(new_scoped_task("acme", "s", "a1", "doc", two), "step 1"),
    )
    .await;
    create_new(
        &*s,
        with_input(new_scoped_task("acme", "s", "a2", "doc", two), "step 2"),
    )
    .await;
    let r = rejection(
        &*s,
        with_input(new_scoped_task("acme", "s", "a3", "doc", two), "step 3"),
    )
    .await;
    assert_eq!(r, AdmissionRejection::SourceBudget { limit: 2 });
    assert_eq!(r.code(), ErrorCode::SourceBudget);
    assert_eq!(r.code().as_str(), "WORKFLOW_AI_SOURCE_BUDGET");
    // Another source has its own steps.
    create_new(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "b1", "other-doc", two),
            "step 3",
        ),
    )
    .await;
}

/// docs/conformance.md#admission `sources_per_24_hours`: distinct sources of the scope in 24 h;
/// `WORKFLOW_AI_DAILY_BUDGET`. A source already seen in the window is always allowed.
pub async fn daily_budget_limits_distinct_sources_and_allows_seen_ones(b: &dyn Backend) {
    let s = b.open().await;
    let two = budget(100, 2, 100, 100, 100, 100);
    create_new(&*s, new_scoped_task("acme", "s", "a", "doc-a", two)).await;
    create_new(&*s, new_scoped_task("acme", "s", "b", "doc-b", two)).await;
    let r = rejection(&*s, new_scoped_task("acme", "s", "c", "doc-c", two)).await;
    assert_eq!(r, AdmissionRejection::DailyBudget { limit: 2 });
    assert_eq!(r.code().as_str(), "WORKFLOW_AI_DAILY_BUDGET");
    // A seen source is always allowed, with new steps.
    create_new(
        &*s,
        with_input(new_scoped_task("acme", "s", "a2", "doc-a", two), "more"),
    )
    .await;
    // Another scope (and another app) has its own sources.
    create_new(&*s, new_scoped_task("acme", "s2", "c2", "doc-c", two)).await;
    create_new(&*s, new_scoped_task("globex", "s", "c3", "doc-c", two)).await;
}

/// docs/conformance.md#admission `scope_concurrent`: scoped tasks of the scope that are queued or running;
/// `WORKFLOW_AI_CAPACITY`. A task that ends frees its slot; other scopes are not affected.
pub async fn scope_capacity_counts_queued_and_running_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let two = budget(100, 100, 2, 100, 100, 100);
    let a = create_new(&*s, new_scoped_task("acme", "s", "a", "doc-a", two)).await;
    create_new(&*s, new_scoped_task("acme", "s", "b", "doc-b", two)).await;
    claim(&*s, a.id, &worker("w")).await;
    let r = rejection(&*s, new_scoped_task("acme", "s", "c", "doc-c", two)).await;
    assert_eq!(
        r,
        AdmissionRejection::ScopeCapacity { limit: 2 },
        "queued and running tasks both count"
    );
    assert_eq!(r.code().as_str(), "WORKFLOW_AI_CAPACITY");
    create_new(
        &*s,
        new_scoped_task("acme", "other-scope", "c", "doc-c", two),
    )
    .await;
    let w = worker("w");
    assert!(complete(&*s, a.id, &w, spam()).await.applied);
    create_new(&*s, new_scoped_task("acme", "s", "d", "doc-d", two)).await;
}

/// docs/conformance.md#admission `global_concurrent`: scoped tasks of all apps and scopes that are queued or
/// running; `WORKFLOW_AI_CAPACITY`.
pub async fn global_capacity_counts_scoped_tasks_of_every_app_and_scope(b: &dyn Backend) {
    let s = b.open().await;
    let two = budget(100, 100, 100, 2, 100, 100);
    let a = create_new(&*s, new_scoped_task("acme", "s1", "a", "doc", two)).await;
    create_new(&*s, new_scoped_task("globex", "s2", "b", "doc", two)).await;
    // Unscoped tasks are not admitted and do not count.
    create_new(&*s, new_app_task("acme", "s3", "unscoped")).await;
    let r = rejection(&*s, new_scoped_task("initech", "s3", "c", "doc", two)).await;
    assert_eq!(r, AdmissionRejection::GlobalCapacity { limit: 2 });
    assert_eq!(r.code().as_str(), "WORKFLOW_AI_CAPACITY");
    fail(&*s, a.id, "boom").await;
    create_new(&*s, new_scoped_task("initech", "s3", "c", "doc", two)).await;
}

/// docs/conformance.md#admission token bucket: `burst` tasks at once, then one every `60 / tasks_per_minute`
/// seconds; `WORKFLOW_AI_RATE_LIMIT` carries the exact time until the next token, and
/// advancing the clock by exactly that much admits again.
pub async fn rate_limit_admits_burst_then_reports_time_until_next_token(b: &dyn Backend) {
    let s = b.open().await;
    // 60 a minute: one token a second.
    let bucket = budget(1000, 1000, 1000, 1000, 2, 60);
    let task = |k: &str| with_input(new_scoped_task("acme", "s", k, "doc", bucket), k);
    create_new(&*s, task("t1")).await;
    create_new(&*s, task("t2")).await;
    let r = rejection(&*s, task("t3")).await;
    assert_eq!(
        r,
        AdmissionRejection::RateLimit {
            retry_after: Duration::from_secs(1)
        }
    );
    assert_eq!(r.code().as_str(), "WORKFLOW_AI_RATE_LIMIT");
    assert_eq!(r.retry_after(), Some(Duration::from_secs(1)));

    b.clock().advance(Duration::from_millis(400));
    let r = rejection(&*s, task("t3")).await;
    assert_eq!(
        r.retry_after(),
        Some(Duration::from_millis(600)),
        "the bucket refills continuously"
    );
    b.clock().advance(Duration::from_millis(599));
    let r = rejection(&*s, task("t3")).await;
    assert_eq!(r.retry_after(), Some(Duration::from_millis(1)));
    b.clock().advance(Duration::from_millis(1));
    create_new(&*s, task("t3")).await;
    let r = rejection(&*s, task("t4")).await;
    assert_eq!(r.retry_after(), Some(Duration::from_secs(1)));

    // Never more than burst, however long the bucket rests.
    b.clock().advance(hours(1));
    create_new(&*s, task("t5")).await;
    create_new(&*s, task("t6")).await;
    assert_eq!(
        rejection(&*s, task("t7")).await.code(),
        ErrorCode::RateLimit
    );
    // Another scope has its own bucket.
    create_new(
        &*s,
        with_input(new_scoped_task("acme", "s2", "t8", "doc", bucket), "t8"),
    )
    .await;
}

/// docs/conformance.md#admission `scope_concurrent`/`global_concurrent`: a scoped task stops counting as soon
/// as it leaves queued/running, whichever way (complete, fail, cancel while queued or
/// running, run cancel, queue timeout, interruption, deletion of its owner's data), and it
/// stops counting exactly once.
pub async fn every_ending_frees_the_concurrency_slot(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    let one = budget(100, 100, 1, 1, 1000, 1000);
    let endings = [
        "complete",
        "fail",
        "cancel-queued",
        "cancel-running",
        "run-cancel",
        "queue-timeout",
        "interrupt",
        "delete-queued",
        "delete-running",
    ];
    for ending in endings {
        let sc = format!("scope-{ending}");
        let (first, run) = if ending == "run-cancel" {
            let run = create_run(&*s, new_run("acme", &sc)).await;
            let t = NewTask {
                dispatch: tollgate_core::Dispatch::default(),
                scope: scoped("doc", one),
                ..new_run_task("acme", run.id, &format!("{ending}-1"))
            };
            (create_new(&*s, t).await, Some(run.id))
        } else {
            (
                create_new(
                    &*s,
                    new_scoped_task("acme", &sc, &format!("{ending}-1"), "doc", one),
                )
                .await,
                None,
            )
        };
        let second = || new_scoped_task("acme", &sc, &format!("{ending}-2"), "doc-2", one);
        let r = rejection(&*s, second()).await;
        assert_eq!(
            r,
            AdmissionRejection::ScopeCapacity { limit: 1 },
            "{ending}: the first task holds the slot"
        );
        match ending {
            "complete" => {
                succeed(&*s, first.id).await;
            }
            "fail" => {
                fail(&*s, first.id, "boom").await;
            }
            "cancel-queued" => {
                cancel(&*s, &acme, first.id).await;
            }
            "cancel-running" => {
                claim(&*s, first.id, &w).await;
                cancel(&*s, &acme, first.id).await;
            }
            "run-cancel" => {
                claim(&*s, first.id, &w).await;
                let run = run.expect("a run");
                s.request_run_cancel(&acme, run)
                    .await
                    .expect("request_run_cancel")
                    .expect("run exists");
            }
            "queue-timeout" => {
                b.clock().advance(secs(601));
                assert_eq!(sweep_all(&*s, &sweep_config()).await.queue_timed_out, 1);
            }
            "interrupt" => {
                claim(&*s, first.id, &w).await;
                b.clock().advance(secs(31));
                assert_eq!(sweep_all(&*s, &sweep_config()).await.interrupted, 1);
            }
            "delete-queued" => {
                assert_eq!(
                    s.delete_owner_data(&acme, &scope(&sc), None)
                        .await
                        .expect("delete_owner_data"),
                    1
                );
            }
            "delete-running" => {
                claim(&*s, first.id, &w).await;
                assert_eq!(
                    s.delete_owner_data(&acme, &scope(&sc), None)
                        .await
                        .expect("delete_owner_data"),
                    1
                );
            }
            other => unreachable!("{other}"),
        }
        let second = create_new(&*s, second()).await;
        // The service-wide slot is taken again by the second task: it was freed exactly once.
        let r = rejection(
            &*s,
            new_scoped_task("acme", "elsewhere", &format!("{ending}-3"), "doc", one),
        )
        .await;
        assert_eq!(
            r,
            AdmissionRejection::GlobalCapacity { limit: 1 },
            "{ending}: the slot was freed once, not twice"
        );
        cancel(&*s, &acme, second.id).await;
    }
}

/// docs/conformance.md#admission-order: checks run in the order of the table; when several limits fail, the earliest
/// decides. Each case leaves two or more limits failing.
pub async fn admission_checks_run_in_spec_order(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    // (scope, budget, second task's source and input, expected); the first task is `doc`.
    let cases: Vec<(&str, Budget, &str, &str, AdmissionRejection)> = vec![
        // steps, scope capacity, global capacity and rate all fail.
        (
            "order-1",
            budget(1, 100, 1, 1, 1, 1),
            "doc",
            "other step",
            AdmissionRejection::SourceBudget { limit: 1 },
        ),
        // sources, scope capacity, global capacity and rate fail.
        (
            "order-2",
            budget(100, 1, 1, 1, 1, 1),
            "doc-2",
            "x",
            AdmissionRejection::DailyBudget { limit: 1 },
        ),
        // scope capacity, global capacity and rate fail.
        (
            "order-3",
            budget(100, 100, 1, 1, 1, 1),
            "doc",
            "other step",
            AdmissionRejection::ScopeCapacity { limit: 1 },
        ),
        // global capacity and rate fail.
        (
            "order-4",
            budget(100, 100, 100, 1, 1, 1),
            "doc",
            "other step",
            AdmissionRejection::GlobalCapacity { limit: 1 },
        ),
    ];
    for (scope_name, limits, second_source, second_input, expected) in cases {
        let first = create_new(
            &*s,
            new_scoped_task(
                "acme",
                scope_name,
                &format!("{scope_name}-1"),
                "doc",
                limits,
            ),
        )
        .await;
        let second = with_input(
            new_scoped_task(
                "acme",
                scope_name,
                &format!("{scope_name}-2"),
                second_source,
                limits,
            ),
            second_input,
        );
        let r = rejection(&*s, second).await;
        assert_eq!(
            r, expected,
            "in {scope_name} the earliest failing check decides"
        );
        // Free the global slot for the next case.
        cancel(&*s, &acme, first.id).await;
    }
}

/// docs/conformance.md#create-admission, docs/conformance.md#admission: a rejection writes nothing: no task exists under its effect key,
/// no token is taken, and a later create with the same key is admitted normally.
pub async fn rejections_write_nothing(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let limits = budget(100, 100, 1, 100, 2, 1);
    let first = create_new(&*s, new_scoped_task("acme", "s", "first", "doc-1", limits)).await;
    for _ in 0..3 {
        let r = rejection(&*s, new_scoped_task("acme", "s", "second", "doc-2", limits)).await;
        assert_eq!(r.code(), ErrorCode::Capacity);
        assert_eq!(
            get_by_key(&*s, &acme, "second").await,
            None,
            "a rejected create leaves no task"
        );
    }
    succeed(&*s, first.id).await;
    // The second token is still there: the rejections took none.
    let second = create(&*s, new_scoped_task("acme", "s", "second", "doc-2", limits)).await;
    assert!(second.created, "the key of a rejected create is free");
    assert_eq!(second.task.status, TaskStatus::Queued);
    succeed(&*s, second.task.id).await;
    let r = rejection(&*s, new_scoped_task("acme", "s", "third", "doc-3", limits)).await;
    assert_eq!(
        r.retry_after(),
        Some(secs(60)),
        "both tokens are spent, one a minute refills"
    );
    assert_eq!(get_by_key(&*s, &acme, "third").await, None);
}
