//! The facade end to end with the dev provider, on SQLite and PostgreSQL.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::{
    BudgetName, ErrorCode, ModelId, NewRun, RunState, SourceId, SourceRevision, TaskKind,
    TaskStatus, validate_output,
};
use tollgate_engine::config::{AppConfig, BudgetPolicy, Limit, ModelConfig};
use tollgate_engine::{EngineError, Event, Notifier, Submission, Tollgate};
use tollgate_store::{RunResult, UnreleasedQuery, WaitOutcome};

on_both_backends!(
    dev_provider_runs_every_kind,
    submit_is_idempotent_per_effect_key,
    a_replay_that_differs_is_a_conflict_through_the_rust_api,
    unknown_models_budgets_and_bad_requests_write_nothing,
    submit_many_answers_each_item_in_order,
    cache_hits_skip_the_provider_until_the_model_changes,
    wait_times_out_with_the_task_as_it_is,
    lost_notifications_cost_latency_only,
    cancel_stops_a_running_task_within_one_heartbeat,
    deleting_the_owner_stops_its_running_task,
    runs_are_woken_when_their_task_finishes,
    release_and_unreleased_sources,
    the_sweeper_expires_queued_tasks_and_wakes_waiters,
    a_caller_bound_to_a_subject_sees_only_its_subject,
    callers_cannot_write_the_engine_key_namespaces,
    one_app_filling_global_capacity_cannot_lock_another_out,
);

fn source(id: &str) -> (SourceId, SourceRevision) {
    (
        SourceId::new(id).unwrap(),
        SourceRevision::new("v1").unwrap(),
    )
}

async fn dev_provider_runs_every_kind(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let handle = engine.start().await.unwrap();
    let requests = [
        (
            TaskKind::GenerateText,
            json!({"prompt": "Write a haiku about tolls"}),
        ),
        (
            TaskKind::Classify,
            json!({"input": "Win a free cruise!", "labels": ["spam", "ham"]}),
        ),
        (
            TaskKind::ClassifyMany,
            json!({"items": [{"id": "a", "input": "hi"}, {"id": "b", "input": "buy now"}], "labels": ["spam", "ham"]}),
        ),
        (
            TaskKind::ExtractData,
            json!({"input": "Ada, 36", "schema": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}}, "required": ["name", "age"]}}),
        ),
    ];
    let mut ids = Vec::new();
    for (i, (kind, request)) in requests.iter().enumerate() {
        let s = Submission::application(
            app(),
            scope(),
            key(&format!("k{i}")),
            *kind,
            request.clone(),
        );
        let submitted = engine.submit(s).await.unwrap();
        assert!(submitted.created);
        assert_eq!(
            submitted.task.step.as_str(),
            kind.as_str(),
            "step defaults to the kind"
        );
        assert_eq!(submitted.task.model.as_str(), "default");
        ids.push(submitted.task.id);
    }
    for id in ids {
        let task = finished(&engine, id).await;
        assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
        let output = task.output.clone().unwrap();
        let request = task.parsed_request().unwrap();
        validate_output(request.request(), &output).unwrap();
        let usage = task.usage.unwrap();
        assert!(usage.input_tokens > 0 && usage.output_tokens > 0);
        assert_eq!(task.attempt, 1);
    }
    let report = handle.shutdown(Duration::from_secs(5)).await;
    assert!(report.drained);
}

async fn submit_is_idempotent_per_effect_key(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let first = engine.submit(classify("same", "hello")).await.unwrap();
    // Same key, same request: the same task, nothing new written (a different request
    // is a conflict: `a_replay_that_differs_is_a_conflict_through_the_rust_api`).
    let again = engine.submit(classify("same", "hello")).await.unwrap();
    assert!(first.created);
    assert!(!again.created);
    assert_eq!(first.task.id, again.task.id);
    let by_key = engine
        .get_by_effect_key(&app(), &key("same"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(by_key.id, first.task.id);
    // Another app never sees it.
    let other = tollgate_core::AppId::new("other").unwrap();
    assert!(engine.get(&other, first.task.id).await.unwrap().is_none());
}

/// Issue 28: the 409 rule lives in `Tollgate::submit`, so the Rust API answers a replay
/// that differs as HTTP does — `TaskConflict` naming the key's task and the first field
/// that differs, alone, in a batch and through a `CallerView` alike — and writes nothing;
/// the same submission still answers its task.
async fn a_replay_that_differs_is_a_conflict_through_the_rust_api(db: TestDb) {
    use tollgate_core::Visibility;
    use tollgate_engine::{ConflictField, Submitted};
    let engine = db.engine(fast_config()).await;
    let first = engine.submit(classify("same", "hello")).await.unwrap();
    assert!(first.created);
    let conflict = |answer: &Result<Submitted, EngineError>, field: ConflictField| match answer {
        Err(EngineError::TaskConflict {
            effect_key,
            task,
            field: differs,
        }) => {
            assert_eq!(effect_key, &key("same"));
            assert_eq!(*task, first.task.id);
            assert_eq!(*differs, field);
            assert_eq!(
                answer.as_ref().unwrap_err().to_string(),
                format!(
                    "effect key \"same\" already names task {} with a different {field}",
                    first.task.id
                )
            );
        }
        other => panic!("expected a conflict on {field}, got {other:?}"),
    };
    let other_request = engine.submit(classify("same", "something else")).await;
    conflict(&other_request, ConflictField::Request);
    let other_kind = Submission::application(
        app(),
        scope(),
        key("same"),
        TaskKind::GenerateText,
        json!({"prompt": "hello"}),
    );
    conflict(&engine.submit(other_kind).await, ConflictField::Kind);
    let (id, rev) = source("doc-1");
    let with_source = classify("same", "hello").with_source(id, rev);
    conflict(&engine.submit(with_source).await, ConflictField::Source);
    // In a batch: a replay that differs, and a key repeated with another request.
    let answers = engine
        .submit_many(vec![
            classify("same", "something else"),
            classify("fresh", "a"),
            classify("fresh", "b"),
        ])
        .await
        .unwrap();
    conflict(&answers[0], ConflictField::Request);
    let fresh = answers[1].as_ref().unwrap();
    assert!(fresh.created);
    match &answers[2] {
        Err(EngineError::TaskConflict { task, field, .. }) => {
            assert_eq!((*task, *field), (fresh.task.id, ConflictField::Request));
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
    // The same answer as a caller of the whole app (what the HTTP API calls) gets.
    let view = engine.as_caller(app(), Visibility::App);
    conflict(
        &view.submit(classify("same", "something else")).await,
        ConflictField::Request,
    );
    // Nothing was written: the key still names the first task, as it was.
    let by_key = engine
        .get_by_effect_key(&app(), &key("same"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (by_key.id, by_key.input_hash, by_key.kind, by_key.source),
        (
            first.task.id,
            first.task.input_hash.clone(),
            TaskKind::Classify,
            None
        )
    );
    let again = engine.submit(classify("same", "hello")).await.unwrap();
    assert!(!again.created);
    assert_eq!(again.task.id, first.task.id);
}

/// docs/api.md "Effect keys": the Rust API refuses a caller's key in the engine's own
/// namespaces (`run:` pipeline steps, `openai-` door calls), alone and in a batch, and
/// stores nothing; any other key is the caller's.
async fn callers_cannot_write_the_engine_key_namespaces(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    for reserved in ["run:0193a1b2-0000-7000-8000-000000000000:b", "openai-X"] {
        match engine.submit(classify(reserved, "hello")).await {
            Err(EngineError::ReservedEffectKey(e)) => {
                let text = e.to_string();
                assert!(text.contains("reserved for the engine"), "{text}");
            }
            other => panic!("{reserved}: {other:?}"),
        }
        let batch = engine
            .submit_many(vec![classify(reserved, "hello"), classify("fine", "hello")])
            .await
            .unwrap();
        assert!(
            matches!(&batch[0], Err(EngineError::ReservedEffectKey(_))),
            "{:?}",
            batch[0]
        );
        assert!(batch[1].is_ok(), "{:?}", batch[1]);
        assert!(
            engine
                .get_by_effect_key(&app(), &key(reserved))
                .await
                .unwrap()
                .is_none()
        );
    }
    for callers in ["Run:x", "my-openai-x", "openai_x"] {
        engine.submit(classify(callers, "hello")).await.unwrap();
    }
}

async fn unknown_models_budgets_and_bad_requests_write_nothing(db: TestDb) {
    let mut config = fast_config();
    config
        .budgets
        .insert("premium".into(), BudgetPolicy::default());
    let engine = db.engine(config).await;

    let err = engine
        .submit(classify("m", "x").with_model(ModelId::new("gpt-9").unwrap()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownModel));
    assert!(err.to_string().contains("gpt-9"), "{err}");

    let (id, rev) = source("doc-1");
    let err = engine
        .submit(
            classify("b", "x")
                .with_source(id, rev)
                .with_budget(BudgetName::new("premium").unwrap()),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, EngineError::BudgetNotAllowed { .. }),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(ErrorCode::BudgetNotAllowed));

    let bad = Submission::application(
        app(),
        scope(),
        key("bad"),
        TaskKind::Classify,
        json!({"input": "x", "labels": []}),
    );
    let err = engine.submit(bad).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidRequest));
    assert!(err.to_string().contains("request.labels"), "{err}");

    let huge = classify("huge", &"x".repeat(300 * 1024));
    let err = engine.submit(huge).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::RequestTooLarge));

    for k in ["m", "b", "bad", "huge"] {
        assert!(
            engine
                .get_by_effect_key(&app(), &key(k))
                .await
                .unwrap()
                .is_none(),
            "{k} was written"
        );
    }
}

async fn submit_many_answers_each_item_in_order(db: TestDb) {
    let mut config = fast_config();
    // Two scoped tasks per burst, refilled slowly: the third scoped item is rate limited.
    config.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            weight: Limit::Integer(1),
            burst: Limit::Integer(2),
            tasks_per_minute: Limit::Integer(1),
            ..BudgetPolicy::default()
        },
    );
    let engine = db.engine(config).await;
    let scoped = |k: &str, doc: &str| {
        let (id, rev) = source(doc);
        classify(k, &format!("input {k}")).with_source(id, rev)
    };
    let batch = vec![
        scoped("s1", "doc-1"),
        classify("plain", "unscoped"),
        scoped("s2", "doc-2"),
        Submission::application(
            app(),
            scope(),
            key("invalid"),
            TaskKind::Classify,
            json!({"input": 1, "labels": ["a"]}),
        ),
        scoped("s3", "doc-3"),
        classify("plain", "unscoped"),
    ];
    let answers = engine.submit_many(batch).await.unwrap();
    assert_eq!(answers.len(), 6);
    let ok = |i: usize| {
        answers[i]
            .as_ref()
            .unwrap_or_else(|e| panic!("item {i}: {e}"))
    };
    assert!(ok(0).created && ok(1).created && ok(2).created);
    assert_eq!(
        answers[3].as_ref().unwrap_err().code(),
        Some(ErrorCode::InvalidRequest)
    );
    let rejected = answers[4].as_ref().unwrap_err();
    assert_eq!(rejected.code(), Some(ErrorCode::RateLimit));
    assert!(rejected.retry_after().is_some());
    // The repeated key (the same submission) is answered after its first occurrence: the
    // same task, not created.
    assert!(!ok(5).created);
    assert_eq!(ok(5).task.id, ok(1).task.id);

    let too_many: Vec<Submission> = (0..1001).map(|i| classify(&format!("n{i}"), "x")).collect();
    let err = engine.submit_many(too_many).await.unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidRequest));
    assert!(
        engine
            .get_by_effect_key(&app(), &key("n0"))
            .await
            .unwrap()
            .is_none()
    );
}

async fn cache_hits_skip_the_provider_until_the_model_changes(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let handle = engine.start().await.unwrap();
    let (id, rev) = source("doc-1");
    let first = engine
        .submit(classify("c1", "Win!").with_source(id.clone(), rev.clone()))
        .await
        .unwrap();
    let done = finished(&engine, first.task.id).await;
    assert_eq!(done.status, TaskStatus::Succeeded);

    let hit = engine
        .submit(classify("c2", "Win!").with_source(id.clone(), rev.clone()))
        .await
        .unwrap();
    assert!(hit.created);
    assert_eq!(
        hit.task.status,
        TaskStatus::Succeeded,
        "served from the cache at once"
    );
    assert_eq!(hit.task.cached_from, Some(first.task.id));
    assert_eq!(hit.task.output, done.output);
    handle.shutdown(Duration::from_secs(5)).await;

    // The same model id with other parameters has another config hash: no hit.
    let mut changed = fast_config();
    changed.models.insert(
        "default".into(),
        ModelConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            provider: "dev".into(),
            model: "dev-1".into(),
            params: serde_json::from_value(json!({"temperature": 0.7})).unwrap(),
            prices: None,
            max_output_tokens: None,
            ..ModelConfig::default()
        },
    );
    let engine2 = db.engine(changed).await;
    let miss = engine2
        .submit(classify("c3", "Win!").with_source(id, rev))
        .await
        .unwrap();
    assert!(miss.created);
    assert_eq!(miss.task.status, TaskStatus::Queued);
    assert!(miss.task.cached_from.is_none());
    assert_ne!(miss.task.model_config_hash, done.model_config_hash);
}

async fn wait_times_out_with_the_task_as_it_is(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let submitted = engine.submit(classify("w", "x")).await.unwrap();
    let started = Instant::now();
    let task = engine
        .wait(&app(), submitted.task.id, Duration::from_millis(300))
        .await
        .unwrap()
        .unwrap();
    let waited = started.elapsed();
    assert_eq!(task.status, TaskStatus::Queued);
    assert!(waited >= Duration::from_millis(300), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    let missing = engine
        .wait(
            &app(),
            tollgate_core::TaskId::generate(),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert!(missing.is_none());
}

async fn lost_notifications_cost_latency_only(db: TestDb) {
    // A notifier that drops everything: workers find tasks and waiters see them finish
    // by polling alone.
    let engine = Tollgate::builder(db.store().await, fast_config())
        .notifier(Notifier::none())
        .build()
        .unwrap();
    let mut events = engine.notifier().subscribe();
    let handle = engine.start().await.unwrap();
    let started = Instant::now();
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            engine
                .submit(classify(&format!("q{i}"), &format!("input {i}")))
                .await
                .unwrap()
                .task
                .id,
        );
    }
    for id in ids {
        assert_eq!(finished(&engine, id).await.status, TaskStatus::Succeeded);
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "polling every 100 ms took {took:?}"
    );
    assert!(events.try_recv().is_err(), "nothing was notified");
    handle.shutdown(Duration::from_secs(5)).await;
}

/// A `slow` model whose dev answers take a minute.
fn with_slow_model(mut config: tollgate_engine::EngineConfig) -> tollgate_engine::EngineConfig {
    config.models.insert(
        "slow".into(),
        ModelConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            provider: "dev".into(),
            model: "dev-slow".into(),
            params: serde_json::from_value(json!({"latency_ms": 60_000})).unwrap(),
            prices: None,
            max_output_tokens: None,
            ..ModelConfig::default()
        },
    );
    config
}

async fn cancel_stops_a_running_task_within_one_heartbeat(db: TestDb) {
    let mut config = with_slow_model(fast_config());
    config.workers.heartbeat_interval = Duration::from_millis(200);
    config.sweeper.liveness_timeout = Duration::from_secs(5);
    let worker_engine = db.engine(config.clone()).await;
    let handle = worker_engine.start().await.unwrap();
    // The cancel comes from another replica whose notifications this one never hears:
    // only the heartbeat can tell the worker.
    let other = Tollgate::builder(db.store().await, config)
        .notifier(Notifier::local())
        .build()
        .unwrap();
    let slow = ModelId::new("slow").unwrap();
    let submitted = other
        .submit(classify("slow", "x").with_model(slow))
        .await
        .unwrap();
    until_status(&worker_engine, submitted.task.id, TaskStatus::Running).await;
    while handle.in_flight().is_empty() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let canceled_at = Instant::now();
    let task = other
        .cancel(&app(), submitted.task.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(task.status, TaskStatus::Canceled);
    assert_eq!(task.error.unwrap().code, ErrorCode::Canceled);
    while !handle.in_flight().is_empty() {
        assert!(
            canceled_at.elapsed() < Duration::from_secs(5),
            "the execution never stopped"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let stopped_after = canceled_at.elapsed();
    assert!(
        stopped_after <= Duration::from_millis(200 + 400),
        "stopped {stopped_after:?} after the cancel, heartbeat interval 200 ms"
    );
    // Canceled stays canceled: the late completion path never ran.
    let after = worker_engine
        .get(&app(), submitted.task.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(after.status, TaskStatus::Canceled);
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn deleting_the_owner_stops_its_running_task(db: TestDb) {
    let engine = db.engine(with_slow_model(fast_config())).await;
    let handle = engine.start().await.unwrap();
    let slow = ModelId::new("slow").unwrap();
    let submitted = engine
        .submit(classify("doomed", "x").with_model(slow))
        .await
        .unwrap();
    until_status(&engine, submitted.task.id, TaskStatus::Running).await;
    let deleted = engine
        .delete_owner_data(&app(), &scope(), None)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !handle.in_flight().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the deleted task's execution never stopped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        engine
            .get(&app(), submitted.task.id)
            .await
            .unwrap()
            .is_none()
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn runs_are_woken_when_their_task_finishes(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let run = engine
        .create_run(NewRun {
            trace_parent: None,
            app: app(),
            scope: scope(),
            subject: None,
            input: json!({"mail": 981}),
        })
        .await
        .unwrap();
    let s = Submission::for_run(
        app(),
        run.id,
        key("run-step"),
        TaskKind::Classify,
        json!({"input": "hi", "labels": ["a", "b"]}),
    );
    let task = engine.submit(s).await.unwrap().task;
    assert_eq!(task.run_id(), Some(run.id));
    assert_eq!(task.scope, scope(), "the run's scope applies");
    match engine.wait_on_task(&app(), run.id, task.id).await.unwrap() {
        WaitOutcome::Waiting(r) => assert_eq!(r.state, RunState::Waiting),
        WaitOutcome::Ready(_) => panic!("the task cannot be terminal yet"),
    }
    let mut events = engine.notifier().subscribe();
    let handle = engine.start().await.unwrap();
    let woken = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Ok(Event::RunWoken { id, app: event_app }) = events.recv().await {
                return (id, event_app);
            }
        }
    })
    .await
    .expect("the run was woken");
    assert_eq!(woken.0, run.id);
    assert_eq!(woken.1, Some(app()));
    let run_now = engine.get_run(&app(), run.id).await.unwrap().unwrap();
    assert_eq!(run_now.state, RunState::Running);
    assert!(run_now.woken_at.is_some());
    engine
        .finish_run(&app(), run.id, RunResult::Succeeded(json!({"ok": true})))
        .await
        .unwrap();

    // Canceling a run cancels its queued tasks.
    let run2 = engine
        .create_run(NewRun {
            trace_parent: None,
            app: app(),
            scope: scope(),
            subject: None,
            input: json!({}),
        })
        .await
        .unwrap();
    handle.shutdown(Duration::from_secs(5)).await;
    let queued = engine
        .submit(Submission::for_run(
            app(),
            run2.id,
            key("run2-step"),
            TaskKind::Classify,
            json!({"input": "x", "labels": ["a"]}),
        ))
        .await
        .unwrap()
        .task;
    let canceled = engine.cancel_run(&app(), run2.id).await.unwrap().unwrap();
    assert_eq!(canceled.canceled_tasks, vec![queued.id]);
    let after = engine.get(&app(), queued.id).await.unwrap().unwrap();
    assert_eq!(after.status, TaskStatus::Canceled);
    let err = engine
        .submit(Submission::for_run(
            app(),
            run2.id,
            key("run2-late"),
            TaskKind::Classify,
            json!({"input": "x", "labels": ["a"]}),
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::RunCanceled));
}

async fn release_and_unreleased_sources(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    for (k, doc) in [("r1", "doc-a"), ("r2", "doc-b")] {
        let (id, rev) = source(doc);
        engine
            .submit(classify(k, k).with_source(id, rev))
            .await
            .unwrap();
    }
    let page = engine
        .list_unreleased_sources(&app(), &UnreleasedQuery::default())
        .await
        .unwrap();
    let docs: Vec<&str> = page.sources.iter().map(|s| s.source.as_str()).collect();
    assert_eq!(docs, ["doc-a", "doc-b"]);
    assert!(engine.release(&app(), &scope(), &key("r1")).await.unwrap());
    assert!(
        !engine
            .release(&app(), &scope(), &key("nope"))
            .await
            .unwrap()
    );
    let page = engine
        .list_unreleased_sources(&app(), &UnreleasedQuery::default())
        .await
        .unwrap();
    assert_eq!(page.sources.len(), 1);
    assert_eq!(page.sources[0].source.as_str(), "doc-b");
    let deleted = engine
        .delete_owner_data(&app(), &scope(), Some(&SourceId::new("doc-b").unwrap()))
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(
        engine
            .get_by_effect_key(&app(), &key("r2"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        engine
            .get_by_effect_key(&app(), &key("r1"))
            .await
            .unwrap()
            .is_some()
    );
}

async fn the_sweeper_expires_queued_tasks_and_wakes_waiters(db: TestDb) {
    let mut config = with_slow_model(fast_config());
    config.workers.concurrency = 1;
    config.sweeper.queue_timeout = Duration::from_millis(300);
    let engine = db.engine(config).await;
    let handle = engine.start().await.unwrap();
    // The one slot is busy for a minute, so the second task waits in the queue.
    let slow = ModelId::new("slow").unwrap();
    let busy = engine
        .submit(classify("busy", "x").with_model(slow))
        .await
        .unwrap()
        .task;
    until_status(&engine, busy.id, TaskStatus::Running).await;
    let queued = engine.submit(classify("waiting", "y")).await.unwrap().task;
    let started = Instant::now();
    let task = finished(&engine, queued.id).await;
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.error.unwrap().code, ErrorCode::QueueTimeout);
    assert!(started.elapsed() < Duration::from_secs(5));
    engine.cancel(&app(), busy.id).await.unwrap();
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn apps_may_use_only_their_allowed_policies() {
    let db = TestDb::sqlite("policies");
    let mut config = fast_config();
    config.budgets.insert(
        "premium".into(),
        BudgetPolicy {
            weight: Limit::Integer(1),
            scope_concurrent: Limit::Integer(1),
            ..BudgetPolicy::default()
        },
    );
    config.apps.insert(
        "acme".into(),
        AppConfig {
            default_budget: Some("standard".into()),
            allowed_budgets: Some(vec!["standard".into(), "premium".into()]),
            api_keys: None,
            usd_per_24_hours: None,
            global_concurrent_share: None,
            trace_content: false,
            max_attempts: None,
        },
    );
    let engine = db.engine(config).await;
    let premium = BudgetName::new("premium").unwrap();
    let (id, rev) = source("doc-1");
    engine
        .submit(
            classify("p1", "a")
                .with_source(id.clone(), rev.clone())
                .with_budget(premium.clone()),
        )
        .await
        .unwrap();
    // premium allows one concurrent scoped task: the second is refused with CAPACITY.
    let err = engine
        .submit(
            classify("p2", "b")
                .with_source(id, rev)
                .with_budget(premium),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Capacity));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_picks_the_backend_from_the_url() {
    let dir = tempfile::tempdir().unwrap();
    for url in [
        dir.path().join("plain.db").display().to_string(),
        format!("sqlite://{}", dir.path().join("prefixed.db").display()),
    ] {
        let engine = Tollgate::open(&url, fast_config()).await.unwrap();
        assert_eq!(engine.backend(), "sqlite", "{url}");
        assert_eq!(engine.notifier().transport(), "local");
        let handle = engine.start().await.unwrap();
        let id = engine.submit(classify("open", "x")).await.unwrap().task.id;
        assert_eq!(finished(&engine, id).await.status, TaskStatus::Succeeded);
        handle.shutdown(Duration::from_secs(5)).await;
    }
    let mut config = fast_config();
    config.notifications.transport = tollgate_engine::config::TransportKind::Postgres;
    let err = Tollgate::open(&dir.path().join("x.db").display().to_string(), config)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("notifications.transport"), "{err}");

    // PostgreSQL, in a schema of its own (created by the store, then named in the URL).
    let Some(db) = TestDb::postgres("open_postgres") else {
        return;
    };
    let TestDb::Postgres { url, schema } = &db else {
        unreachable!()
    };
    db.postgres_store().await.close().await;
    let separator = if url.contains('?') { '&' } else { '?' };
    let url = format!("{url}{separator}options=-c%20search_path%3D{schema}");
    let mut config = fast_config();
    config.notifications.transport = tollgate_engine::config::TransportKind::Postgres;
    let engine = Tollgate::open(&url, config).await.unwrap();
    assert_eq!(engine.backend(), "postgres");
    assert_eq!(engine.notifier().transport(), "postgres");
    let handle = engine.start().await.unwrap();
    let id = engine
        .submit(classify("open-pg", "x"))
        .await
        .unwrap()
        .task
        .id;
    assert_eq!(finished(&engine, id).await.status, TaskStatus::Succeeded);
    handle.shutdown(Duration::from_secs(5)).await;
}

/// docs/api.md "Subjects": through a [`CallerView`] bound to a subject, another subject's
/// task and run do not exist (get, effect key, wait, cancel, release, listing, run reads,
/// a task into the run), a replayed effect key shows nothing of the other task, and
/// deleting a scope is refused; an app-wide view sees everything.
async fn a_caller_bound_to_a_subject_sees_only_its_subject(db: TestDb) {
    use tollgate_core::{Subject, Visibility};
    let engine = db.engine(fast_config()).await;
    let alice = Subject::parse("user:alice").unwrap();
    let bob = Subject::parse("user:bob").unwrap();
    let as_alice = engine.as_caller(app(), Visibility::Subject(alice.clone()));
    let as_bob = engine.as_caller(app(), Visibility::Subject(bob.clone()));
    let as_app = engine.as_caller(app(), Visibility::App);
    let (id, rev) = source("doc-a");
    let sub = classify("alice-1", "x")
        .with_source(id, rev)
        .with_subject(alice.clone());
    let task = as_alice.submit(sub.clone()).await.unwrap().task;
    assert_eq!(task.subject.as_ref(), Some(&alice));
    let run = engine
        .create_run(NewRun {
            trace_parent: None,
            app: app(),
            scope: scope(),
            subject: Some(alice.clone()),
            input: json!({}),
        })
        .await
        .unwrap();

    assert_eq!(as_bob.get(task.id).await.unwrap(), None);
    assert_eq!(
        as_bob.get_by_effect_key(&key("alice-1")).await.unwrap(),
        None
    );
    assert_eq!(
        as_bob
            .wait(task.id, Duration::from_millis(50))
            .await
            .unwrap(),
        None
    );
    assert_eq!(as_bob.cancel(task.id).await.unwrap(), None);
    assert!(!as_bob.release(&scope(), &key("alice-1")).await.unwrap());
    let page = as_bob
        .list_unreleased_sources(&UnreleasedQuery::default())
        .await
        .unwrap();
    assert!(page.sources.is_empty(), "{page:?}");
    assert_eq!(as_bob.get_run(run.id).await.unwrap(), None);
    assert!(as_bob.cancel_run(run.id).await.unwrap().is_none());
    let replay = as_bob
        .submit(sub.clone().with_subject(bob.clone()))
        .await
        .unwrap_err();
    assert!(matches!(replay, EngineError::EffectKeyTaken), "{replay:?}");
    assert!(!replay.to_string().contains(&task.id.to_string()));
    let into_run = Submission::for_run(
        app(),
        run.id,
        key("bob-in-run"),
        TaskKind::GenerateText,
        json!({"prompt": "p"}),
    );
    let e = as_bob.submit(into_run.clone()).await.unwrap_err();
    assert!(matches!(e, EngineError::RunNotFound(_)), "{e:?}");
    let answers = as_bob
        .submit_many(vec![sub.clone(), into_run.clone()])
        .await
        .unwrap();
    assert!(matches!(answers[0], Err(EngineError::EffectKeyTaken)));
    assert!(matches!(answers[1], Err(EngineError::RunNotFound(_))));
    let e = as_bob.delete_owner_data(&scope(), None).await.unwrap_err();
    assert!(matches!(e, EngineError::SubjectNotAllowed(_)), "{e:?}");
    assert_eq!(
        engine.get(&app(), task.id).await.unwrap().unwrap().status,
        TaskStatus::Queued,
        "bob changed nothing"
    );

    for view in [&as_alice, &as_app] {
        assert_eq!(
            view.get(task.id).await.unwrap().map(|t| t.id),
            Some(task.id)
        );
        assert!(view.get_run(run.id).await.unwrap().is_some());
        assert_eq!(view.submit(sub.clone()).await.unwrap().task.id, task.id);
    }
    assert_eq!(
        as_alice
            .list_unreleased_sources(&UnreleasedQuery::default())
            .await
            .unwrap()
            .sources
            .len(),
        1
    );
    assert!(as_alice.submit(into_run).await.unwrap().created);
    assert_eq!(as_app.delete_owner_data(&scope(), None).await.unwrap(), 1);
}

/// docs/budgets.md, "Each app's share of the global capacity" (issue: one tenant filled
/// `global_concurrent` and every other app got `WORKFLOW_AI_CAPACITY` for up to the queue
/// timeout). Two apps with the default shares of `global_concurrent = 10` (2 each, 6
/// lent): `acme` floods scoped tasks in 20 scopes with nothing claiming them, and is
/// refused after 8 with a message about its own share; `globex` is still admitted.
async fn one_app_filling_global_capacity_cannot_lock_another_out(db: TestDb) {
    let mut config = fast_config();
    config.admission.global_concurrent = Limit::Integer(10);
    for name in ["acme", "globex"] {
        config.apps.insert(name.into(), AppConfig::default());
    }
    let engine = db.engine(config).await;
    let scoped = |app: &str, i: usize| {
        let (id, rev) = source(&format!("doc-{app}-{i}"));
        Submission::application(
            tollgate_core::AppId::new(app).unwrap(),
            tollgate_core::ScopeId::new(format!("s{}", i % 20)).unwrap(),
            key(&format!("{app}-{i}")),
            TaskKind::Classify,
            json!({"input": "x", "labels": ["spam", "ham"]}),
        )
        .with_source(id, rev)
    };
    let mut admitted = 0;
    let mut refusal = None;
    for i in 0..40 {
        match engine.submit(scoped("acme", i)).await {
            Ok(_) => admitted += 1,
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::Capacity), "{e}");
                refusal.get_or_insert(e.to_string());
            }
        }
    }
    assert_eq!(admitted, 8, "acme's 2 and the 6 lent");
    let refusal = refusal.expect("acme is refused beyond its share");
    assert!(
        refusal.contains("global_concurrent_share") && !refusal.contains("the service"),
        "the refusal names the app's limit, not the service's: {refusal}"
    );
    for i in 0..2 {
        engine
            .submit(scoped("globex", i))
            .await
            .expect("globex keeps its share while acme floods");
    }
}
