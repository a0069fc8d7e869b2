//! docs/conformance.md#create-owner-check (owner check) and docs/conformance.md#workflow-runs: workflow runs, waiting and waking.

use super::Backend;
use super::fixtures::*;
use serde_json::json;
use tollgate_core::{
    Clock, Dependency, ErrorCode, NewRun, NewTask, RunId, RunState, TaskError, TaskOwner,
    TaskStatus,
};
use tollgate_store::{RunResult, StoreError, WaitOutcome};

/// docs/conformance.md#workflow-runs: a run is created `running` in its app and scope, and finishes with its result;
/// another app can neither see nor finish it.
pub async fn runs_are_created_running_and_finish_with_their_result(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(
        &*s,
        NewRun {
            trace_parent: None,
            subject: Some(user("u1")),
            ..new_run("acme", "s")
        },
    )
    .await;
    assert_eq!(run.app, acme);
    assert_eq!(run.scope, scope("s"));
    assert_eq!(run.subject, Some(user("u1")));
    assert_eq!(run.state, RunState::Running);
    assert!(!run.cancel_requested);
    assert_eq!(run.input, json!({"workflow": "triage"}));
    assert_eq!(run.waiting_on, None);
    assert_eq!(run.created_at, b.clock().now());
    assert_eq!(get_run(&*s, &acme, run.id).await, run);
    assert_eq!(
        s.get_run(&app("globex"), run.id).await.expect("get_run"),
        None
    );
    assert_eq!(
        s.finish_run(&app("globex"), run.id, RunResult::Succeeded(json!(1)))
            .await
            .expect("finish_run"),
        None
    );

    let done = s
        .finish_run(&acme, run.id, RunResult::Succeeded(json!({"ok": true})))
        .await
        .expect("finish_run")
        .expect("run exists");
    assert_eq!(done.state, RunState::Succeeded);
    assert_eq!(done.output, Some(json!({"ok": true})));
    let other = create_run(&*s, new_run("acme", "s")).await;
    let error = TaskError::new(ErrorCode::ProviderError, "gave up");
    let failed = s
        .finish_run(&acme, other.id, RunResult::Failed(error.clone()))
        .await
        .expect("finish_run")
        .expect("run exists");
    assert_eq!(
        (failed.state, failed.error),
        (RunState::Failed, Some(error))
    );
}

/// docs/conformance.md#create-owner-check: a run-owned task needs its run to exist in the caller's app
/// (`RunNotFound`); nothing is written.
pub async fn run_task_needs_an_existing_run_of_the_app(b: &dyn Backend) {
    let s = b.open().await;
    let missing = RunId::generate();
    match create_err(&*s, new_run_task("acme", missing, "k")).await {
        StoreError::RunNotFound(_) => {}
        other => panic!("expected RunNotFound for a missing run, got {other:?}"),
    }
    let foreign = create_run(&*s, new_run("globex", "s")).await;
    let err = create_err(&*s, new_run_task("acme", foreign.id, "k")).await;
    assert!(
        matches!(err, StoreError::RunNotFound(_)),
        "another app's run is not found: {err:?}"
    );
    assert_eq!(err.code(), Some(ErrorCode::RunNotFound));
    assert_eq!(
        get_by_key(&*s, &app("acme"), "k").await,
        None,
        "nothing was written"
    );
}

/// docs/conformance.md#create-owner-check: a run-owned task of a canceled run is refused (`RunCanceled`);
/// nothing is written.
pub async fn run_task_is_refused_for_a_canceled_run(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(&*s, new_run("acme", "s")).await;
    s.request_run_cancel(&acme, run.id)
        .await
        .expect("request_run_cancel")
        .expect("run exists");
    let err = create_err(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            scope: scoped("doc", unlimited()),
            ..new_run_task("acme", run.id, "k")
        },
    )
    .await;
    assert!(
        matches!(err, StoreError::RunCanceled(_)),
        "expected RunCanceled, got {err:?}"
    );
    assert_eq!(err.code(), Some(ErrorCode::RunCanceled));
    assert_eq!(
        get_by_key(&*s, &acme, "k").await,
        None,
        "nothing was written"
    );
}

/// docs/conformance.md#concepts, docs/conformance.md#creating-a-task: a run-owned task takes its run's app, scope and subject, and is admitted
/// against that scope's budget.
pub async fn run_scope_and_subject_apply_to_its_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let run = create_run(
        &*s,
        NewRun {
            trace_parent: None,
            subject: Some(user("u1")),
            ..new_run("acme", "run-scope")
        },
    )
    .await;
    let one = budget(100, 100, 1, 100, 100, 100);
    let t = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            scope: scoped("doc", one),
            ..new_run_task("acme", run.id, "k")
        },
    )
    .await;
    assert_eq!(t.owner, TaskOwner::Run { run_id: run.id });
    assert_eq!(t.run_id(), Some(run.id));
    assert_eq!(t.scope, scope("run-scope"));
    assert_eq!(t.subject, Some(user("u1")));
    let r = rejection(
        &*s,
        new_scoped_task("acme", "run-scope", "app-task", "doc-2", one),
    )
    .await;
    assert_eq!(
        r.code(),
        ErrorCode::Capacity,
        "the run's task counts in the run's scope"
    );
    create_new(
        &*s,
        new_scoped_task("acme", "elsewhere", "app-task", "doc-2", one),
    )
    .await;
}

/// docs/conformance.md#create-idempotency: idempotency (step 2) comes before the owner check (step 3): replaying a
/// run-owned task's key after its run was canceled returns the task.
pub async fn idempotency_precedes_the_owner_check(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(&*s, new_run("acme", "s")).await;
    let t = create_new(&*s, new_run_task("acme", run.id, "k")).await;
    s.request_run_cancel(&acme, run.id)
        .await
        .expect("request_run_cancel")
        .expect("run exists");
    let again = create(&*s, new_run_task("acme", run.id, "k")).await;
    assert_eq!((again.created, again.task.id), (false, t.id));
    assert_eq!(again.task.status, TaskStatus::Canceled);
}

/// docs/conformance.md#lifecycle, docs/conformance.md#workflow-runs: every move of a task to a terminal state (complete, fail, cancel) wakes
/// the run waiting on it: the answer names the run, and the run is runnable again.
pub async fn waiting_run_is_woken_by_every_terminal_move(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    for how in ["complete", "fail", "cancel"] {
        let run = create_run(&*s, new_run("acme", "s")).await;
        let t = create_new(&*s, new_run_task("acme", run.id, &format!("{how}-task"))).await;
        claim(&*s, t.id, &w).await;
        match s
            .wait_on_task(&acme, run.id, t.id)
            .await
            .expect("wait_on_task")
        {
            WaitOutcome::Waiting(r) => {
                assert_eq!(r.state, RunState::Waiting);
                assert_eq!(r.waiting_on, Some(Dependency::on_task(t.id)));
                assert_eq!(
                    r.waiting_on.as_ref().map(|d| d.kind.as_str()),
                    Some("ai.workflow-task")
                );
            }
            other => panic!("a run waiting on a running task waits, got {other:?}"),
        }
        assert_eq!(get_run(&*s, &acme, run.id).await.state, RunState::Waiting);
        b.clock().advance(secs(1));
        let tr = match how {
            "complete" => complete(&*s, t.id, &w, spam()).await,
            "fail" => fail(&*s, t.id, "boom").await,
            _ => cancel(&*s, &acme, t.id).await,
        };
        assert!(tr.applied);
        assert_eq!(tr.woken_runs, vec![run.id], "{how} wakes the waiting run");
        let woken = get_run(&*s, &acme, run.id).await;
        assert_eq!(
            woken.state,
            RunState::Running,
            "after {how} the run is runnable"
        );
        assert_eq!(woken.woken_at, Some(b.clock().now()));
    }
}

/// docs/conformance.md#workflow-runs: waiting on a task that is already terminal answers `Ready` with the task, and
/// the run stays runnable.
pub async fn wait_on_a_terminal_task_is_ready_at_once(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(&*s, new_run("acme", "s")).await;
    let t = create_new(&*s, new_run_task("acme", run.id, "k")).await;
    let done = succeed(&*s, t.id).await;
    match s
        .wait_on_task(&acme, run.id, t.id)
        .await
        .expect("wait_on_task")
    {
        WaitOutcome::Ready(task) => assert_eq!(*task, done),
        other => panic!("waiting on a succeeded task is Ready, got {other:?}"),
    }
    assert_eq!(get_run(&*s, &acme, run.id).await.state, RunState::Running);
}

/// docs/conformance.md#workflow-runs: a run's step waits only on a task of the same run (not another run's, not an
/// application task, not another app's); a refused wait leaves the run as it was.
pub async fn wait_is_refused_for_a_task_of_another_owner(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let run = create_run(&*s, new_run("acme", "s")).await;
    let other_run = create_run(&*s, new_run("acme", "s")).await;
    let other_task = create_new(&*s, new_run_task("acme", other_run.id, "other")).await;
    let app_task = create_new(&*s, new_app_task("acme", "s", "app")).await;
    let foreign_run = create_run(&*s, new_run("globex", "s")).await;
    let foreign_task = create_new(&*s, new_run_task("globex", foreign_run.id, "foreign")).await;
    for (what, id) in [
        ("another run's", other_task.id),
        ("an application", app_task.id),
        ("another app's", foreign_task.id),
    ] {
        let r = s.wait_on_task(&acme, run.id, id).await;
        assert!(r.is_err(), "waiting on {what} task is refused, got {r:?}");
        assert_eq!(
            get_run(&*s, &acme, run.id).await,
            run,
            "a refused wait changes nothing"
        );
    }
    let r = s.wait_on_task(&acme, foreign_run.id, foreign_task.id).await;
    assert!(r.is_err(), "another app's run cannot wait, got {r:?}");
    assert_eq!(
        get_run(&*s, &app("globex"), foreign_run.id).await,
        foreign_run
    );
}

/// docs/conformance.md#lifecycle: application-owned tasks wake nobody, and a task's terminal move wakes only
/// the run waiting on it.
pub async fn application_tasks_wake_nobody(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let w = worker("w");
    let run = create_run(&*s, new_run("acme", "s")).await;
    let waited = create_new(&*s, new_run_task("acme", run.id, "waited")).await;
    s.wait_on_task(&acme, run.id, waited.id)
        .await
        .expect("wait_on_task");
    let sibling = create_new(&*s, new_run_task("acme", run.id, "sibling")).await;
    let app_task = create_new(&*s, new_app_task("acme", "s", "app")).await;
    claim(&*s, app_task.id, &w).await;
    assert!(
        complete(&*s, app_task.id, &w, spam())
            .await
            .woken_runs
            .is_empty()
    );
    let other = create_new(&*s, new_app_task("acme", "s", "app-2")).await;
    assert!(fail(&*s, other.id, "boom").await.woken_runs.is_empty());
    assert!(
        cancel(&*s, &acme, sibling.id).await.woken_runs.is_empty(),
        "the run waits on another task"
    );
    assert_eq!(get_run(&*s, &acme, run.id).await.state, RunState::Waiting);
}

/// docs/conformance.md#workflow-runs: canceling a run marks it and cancels its queued and running tasks (with
/// `WORKFLOW_AI_CANCELED`, freeing their steps); finished tasks and other runs' tasks are
/// untouched; another app cannot cancel it.
pub async fn run_cancel_cascades_to_queued_and_running_tasks(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    let one_step = budget(1, 100, 100, 100, 100, 100);
    let run = create_run(&*s, new_run("acme", "s")).await;
    let queued = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            scope: scoped("doc", one_step),
            ..new_run_task("acme", run.id, "queued")
        },
    )
    .await;
    let running = create_new(&*s, new_run_task("acme", run.id, "running")).await;
    claim(&*s, running.id, &worker("w")).await;
    let done = create_new(&*s, new_run_task("acme", run.id, "done")).await;
    let done = succeed(&*s, done.id).await;
    let bystander_run = create_run(&*s, new_run("acme", "s")).await;
    let bystander = create_new(&*s, new_run_task("acme", bystander_run.id, "bystander")).await;

    assert_eq!(
        s.request_run_cancel(&app("globex"), run.id)
            .await
            .expect("request_run_cancel"),
        None,
        "another app cannot cancel"
    );
    assert_eq!(get(&*s, &acme, queued.id).await.status, TaskStatus::Queued);

    let answer = s
        .request_run_cancel(&acme, run.id)
        .await
        .expect("request_run_cancel")
        .expect("run exists");
    assert!(answer.run.cancel_requested, "the run is marked");
    assert_eq!(answer.run.id, run.id);
    let mut canceled = answer.canceled_tasks.clone();
    canceled.sort();
    let mut expected = vec![queued.id, running.id];
    expected.sort();
    assert_eq!(
        canceled, expected,
        "its queued and running tasks are canceled"
    );
    for id in expected {
        let t = get(&*s, &acme, id).await;
        assert_eq!(t.status, TaskStatus::Canceled);
        assert_eq!(t.error.map(|e| e.code), Some(ErrorCode::Canceled));
    }
    assert_eq!(
        get(&*s, &acme, done.id).await,
        done,
        "a finished task is untouched"
    );
    assert_eq!(
        get(&*s, &acme, bystander.id).await.status,
        TaskStatus::Queued,
        "other runs' tasks are untouched"
    );
    assert!(get_run(&*s, &acme, run.id).await.cancel_requested);
    // The canceled scoped task freed its step.
    create_new(
        &*s,
        with_input(
            new_scoped_task("acme", "s", "next", "doc", one_step),
            "another step",
        ),
    )
    .await;
}
