//! docs/conformance.md#task-kinds (as the store shows it) and docs/conformance.md#create-idempotency: creating a task, idempotency, effect keys.

use super::Backend;
use super::fixtures::*;
use serde_json::json;
use tollgate_core::canonical::{canonical_json, sha256_hex};
use tollgate_core::{
    Clock, ErrorCode, NewTask, SourceRef, TaskKind, TaskOwner, TaskStatus, ValidatedRequest,
    cache_key,
};
use tollgate_store::StoreError;

/// The store answers its readiness probe and names itself.
pub async fn store_answers_ping(b: &dyn Backend) {
    let s = b.open().await;
    s.ping().await.expect("ping should answer");
    assert!(!s.backend().is_empty(), "backend() should name the backend");
}

/// docs/conformance.md#create-insert: a new task is stored `queued` with everything it was created with, and
/// can be read back by id and by effect key.
pub async fn create_stores_a_queued_task(b: &dyn Backend) {
    let s = b.open().await;
    let new = with_subject(
        new_scoped_task("acme", "customer-42", "k1", "msg-981", unlimited()),
        Some(user("u1")),
    );
    let request = new.request.clone();
    let created = create(&*s, new).await;
    assert!(created.created, "a new effect key creates a task");
    let t = created.task;
    let now = b.clock().now();
    assert_eq!(t.app, app("acme"));
    assert_eq!(t.effect_key, key("k1"));
    assert_eq!(t.kind, TaskKind::Classify);
    assert_eq!(t.step, step("label-email"));
    assert_eq!(t.owner, TaskOwner::Application);
    assert_eq!(t.scope, scope("customer-42"));
    assert_eq!(t.subject, Some(user("u1")));
    assert_eq!(
        t.source,
        Some(SourceRef {
            id: source("msg-981"),
            revision: tollgate_core::SourceRevision::new("v1").unwrap(),
            recompute: false,
        })
    );
    assert_eq!(t.model.as_str(), "default");
    assert_eq!(t.model_ref, model_ref());
    let config_hash = model_ref().config_hash().unwrap();
    assert_eq!(t.model_config_hash, config_hash);
    assert_eq!(&t.request, request.value());
    assert_eq!(t.input_hash, request.input_hash());
    let expected_cache_key = cache_key(
        &source("msg-981"),
        &tollgate_core::SourceRevision::new("v1").unwrap(),
        &request,
        &config_hash,
        Some(&user("u1")),
    );
    assert_eq!(
        t.cache_key.as_deref(),
        Some(expected_cache_key.as_str()),
        "the cache key is core's cache_key()"
    );
    assert_eq!(t.status, TaskStatus::Queued);
    assert!(!t.cancel_requested);
    assert_eq!(t.cached_from, None);
    assert_eq!(
        (t.output.clone(), t.usage, t.error.clone()),
        (None, None, None)
    );
    assert_eq!(t.attempt, 0);
    assert_eq!(t.worker, None);
    assert_eq!(t.created_at, now, "created_at comes from the store's clock");
    assert_eq!(
        (t.claimed_at, t.heartbeat_at, t.completed_at, t.released_at),
        (None, None, None, None)
    );

    assert_eq!(
        get(&*s, &app("acme"), t.id).await,
        t,
        "get_task returns what create returned"
    );
    assert_eq!(
        get_by_key(&*s, &app("acme"), "k1").await,
        Some(t.clone()),
        "get_task_by_effect_key finds it"
    );
    assert_eq!(get_by_key(&*s, &app("acme"), "k2").await, None);
    assert_eq!(
        try_get(&*s, &app("acme"), tollgate_core::TaskId::generate()).await,
        None
    );
}

/// docs/conformance.md#task-kinds: the store keeps the canonical request and its SHA-256 as `input_hash`, so
/// equal requests hash equally whatever the client's key order.
pub async fn stored_request_is_canonical_and_hashed(b: &dyn Backend) {
    let s = b.open().await;
    let a: serde_json::Value =
        serde_json::from_str(r#"{"labels":["spam","ham"],"input":"Hi","instructions":"Be brief"}"#)
            .unwrap();
    let z: serde_json::Value =
        serde_json::from_str(r#"{"instructions":"Be brief","input":"Hi","labels":["spam","ham"]}"#)
            .unwrap();
    let ra = ValidatedRequest::new(
        TaskKind::Classify,
        &a,
        tollgate_core::DEFAULT_MAX_REQUEST_BYTES,
    )
    .unwrap();
    let rz = ValidatedRequest::new(
        TaskKind::Classify,
        &z,
        tollgate_core::DEFAULT_MAX_REQUEST_BYTES,
    )
    .unwrap();
    let ta = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            request: ra.clone(),
            ..new_app_task("acme", "s", "a")
        },
    )
    .await;
    let tz = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            request: rz,
            ..new_app_task("acme", "s", "z")
        },
    )
    .await;
    assert_eq!(
        ta.input_hash, tz.input_hash,
        "key order does not change the input hash"
    );
    assert_eq!(ta.request, tz.request);
    let stored = canonical_json(&get(&*s, &app("acme"), ta.id).await.request).unwrap();
    assert_eq!(
        stored,
        ra.canonical(),
        "the stored request is the canonical request"
    );
    assert_eq!(
        ta.input_hash,
        sha256_hex(stored.as_bytes()),
        "input_hash is SHA-256 of the canonical request"
    );
    assert_eq!(
        ta.request["kind"],
        json!("classify"),
        "the stored request carries its kind"
    );
}

/// docs/conformance.md#task-kinds: the size limit is measured on the exact bytes the store keeps: a request of
/// exactly the limit is accepted and stored byte for byte; one byte more is refused before
/// anything is written.
pub async fn request_at_the_size_limit_is_stored_exactly(b: &dyn Backend) {
    let s = b.open().await;
    let raw = json!({"input": "x".repeat(1000), "labels": ["spam", "ham"]});
    let exact = ValidatedRequest::new(TaskKind::Classify, &raw, usize::MAX)
        .unwrap()
        .canonical()
        .len();
    let request = ValidatedRequest::new(TaskKind::Classify, &raw, exact)
        .expect("a request of exactly the limit is valid");
    let err = ValidatedRequest::new(TaskKind::Classify, &raw, exact - 1)
        .expect_err("one byte over the limit is refused");
    assert_eq!(err.code(), ErrorCode::RequestTooLarge);
    let t = create_new(
        &*s,
        NewTask {
            dispatch: tollgate_core::Dispatch::default(),
            request,
            ..new_app_task("acme", "s", "k")
        },
    )
    .await;
    let stored = canonical_json(&get(&*s, &app("acme"), t.id).await.request).unwrap();
    assert_eq!(
        stored.len(),
        exact,
        "the store keeps exactly the measured bytes"
    );
}

/// docs/conformance.md#create-validate: a model configuration that cannot be hashed is a clear input error and
/// nothing is written.
pub async fn invalid_model_config_is_rejected_and_writes_nothing(b: &dyn Backend) {
    let s = b.open().await;
    let mut new = new_scoped_task("acme", "s", "k", "doc", unlimited());
    new.model_ref
        .params
        .insert("seed".into(), json!(9_007_199_254_740_993u64));
    match create_err(&*s, new).await {
        StoreError::Invalid(e) => assert_eq!(e.code(), ErrorCode::InvalidRequest),
        other => panic!("expected StoreError::Invalid, got {other:?}"),
    }
    assert_eq!(
        get_by_key(&*s, &app("acme"), "k").await,
        None,
        "nothing was written"
    );
    create_new(&*s, new_scoped_task("acme", "s", "k", "doc", unlimited())).await;
}

/// docs/conformance.md#create-idempotency: an existing effect key returns the existing task with
/// `created = false`, whatever its state, without admission: a replay succeeds even when
/// the budget is exhausted, and replays spend nothing.
pub async fn idempotent_create_returns_existing_task_and_spends_no_budget(b: &dyn Backend) {
    let s = b.open().await;
    let acme = app("acme");
    // Every limit is 1: any admission of a replay would be refused.
    let tight = budget(1, 1, 1, 1, 1, 1);
    let first = create_new(&*s, new_scoped_task("acme", "s", "k", "doc", tight)).await;
    for _ in 0..3 {
        let again = create(&*s, new_scoped_task("acme", "s", "k", "doc", tight)).await;
        assert!(!again.created, "a replay is not a new task");
        assert_eq!(again.task, first, "a replay returns the existing task");
    }
    // The key names the task whatever the replay carries.
    let other = with_input(
        new_scoped_task("acme", "s", "k", "other-doc", unlimited()),
        "different",
    );
    let again = create(&*s, other).await;
    assert_eq!((again.created, again.task.id), (false, first.id));

    // Whatever its state: after success the replay returns the task itself, not a cache copy.
    let done = succeed(&*s, first.id).await;
    let again = create(&*s, new_scoped_task("acme", "s", "k", "doc", tight)).await;
    assert_eq!((again.created, &again.task), (false, &done));
    assert_eq!(again.task.cached_from, None);

    // And after failure.
    let f = create_new(&*s, new_app_task("acme", "s", "f")).await;
    fail(&*s, f.id, "boom").await;
    let again = create(&*s, new_app_task("acme", "s", "f")).await;
    assert_eq!(
        (again.created, again.task.status),
        (false, TaskStatus::Failed)
    );

    // Replays take no token: with burst 2, five replays leave the second token.
    let bucket = budget(100, 100, 100, 100, 2, 1);
    create_new(&*s, new_scoped_task("acme", "r", "r1", "doc", bucket)).await;
    for _ in 0..5 {
        let again = create(&*s, new_scoped_task("acme", "r", "r1", "doc", bucket)).await;
        assert!(!again.created);
    }
    create_new(
        &*s,
        with_input(new_scoped_task("acme", "r", "r2", "doc", bucket), "second"),
    )
    .await;
    let r = rejection(
        &*s,
        with_input(new_scoped_task("acme", "r", "r3", "doc", bucket), "third"),
    )
    .await;
    assert_eq!(r.code(), ErrorCode::RateLimit);
    assert_eq!(
        get(&*s, &acme, first.id).await.status,
        TaskStatus::Succeeded
    );
}

/// docs/conformance.md#concepts, docs/conformance.md#per-app-effect-keys: an effect key is unique per app, not per scope or owner: the same key in
/// another scope of the same app names the same task.
pub async fn effect_keys_are_unique_per_app(b: &dyn Backend) {
    let s = b.open().await;
    let first = create_new(&*s, new_app_task("acme", "s1", "k")).await;
    let again = create(&*s, new_scoped_task("acme", "s2", "k", "doc", unlimited())).await;
    assert_eq!((again.created, again.task.id), (false, first.id));
    assert_eq!(again.task.scope, scope("s1"));
    let run = create_run(&*s, new_run("acme", "s3")).await;
    let again = create(&*s, new_run_task("acme", run.id, "k")).await;
    assert_eq!((again.created, again.task.id), (false, first.id));
}

/// docs/conformance.md#create-cache, docs/conformance.md#create-admission, docs/conformance.md#http-shapes: a task without a source is neither cached nor admitted: it
/// never copies an output, and it neither needs nor uses any budget.
pub async fn unscoped_tasks_skip_cache_and_admission(b: &dyn Backend) {
    let s = b.open().await;
    let first = create_new(&*s, new_app_task("acme", "s", "u1")).await;
    assert_eq!(first.cache_key, None);
    assert_eq!(first.source, None);
    succeed(&*s, first.id).await;
    let second = create_new(&*s, new_app_task("acme", "s", "u2")).await;
    assert_eq!(
        (second.status, second.cached_from),
        (TaskStatus::Queued, None),
        "unscoped tasks never hit the cache"
    );
    // Many queued unscoped tasks do not use the scope's (or the service's) capacity.
    for i in 0..3 {
        create_new(&*s, new_app_task("acme", "s", &format!("more-{i}"))).await;
    }
    create_new(
        &*s,
        new_scoped_task("acme", "s", "scoped", "doc", budget(1, 1, 1, 1, 1, 1)),
    )
    .await;
}

/// `create_tasks`: each item is admitted or refused on its own, in order; a refused item
/// writes nothing and does not undo the others; a key repeated in the batch names the
/// task its first occurrence created.
pub async fn create_many_admits_or_refuses_each_item_on_its_own(b: &dyn Backend) {
    let s = b.open().await;
    // Two tasks may be queued in the scope at once.
    let two = budget(100, 100, 2, 100, 100, 60);
    let items = vec![
        new_scoped_task("acme", "s", "m1", "doc-1", two),
        new_scoped_task("acme", "s", "m2", "doc-2", two),
        new_scoped_task("acme", "s", "m3", "doc-3", two),
        new_app_task("acme", "s", "m4"),
        new_scoped_task("acme", "s", "m1", "doc-1", two),
    ];
    let results = s.create_tasks(items).await.expect("the batch runs");
    assert_eq!(results.len(), 5, "one result per item, in order");
    let first = results[0].as_ref().expect("m1 admitted");
    assert!(first.created);
    assert!(results[1].as_ref().expect("m2 admitted").created);
    match &results[2] {
        Err(StoreError::Admission(r)) => assert_eq!(r.code(), ErrorCode::Capacity),
        other => panic!("m3 exceeds scope_concurrent = 2, got {other:?}"),
    }
    assert!(
        results[3]
            .as_ref()
            .expect("unscoped m4 needs no admission")
            .created
    );
    let replay = results[4].as_ref().expect("the repeated key is a replay");
    assert!(!replay.created);
    assert_eq!(replay.task.id, first.task.id);
    let acme = app("acme");
    assert!(
        get_by_key(&*s, &acme, "m3").await.is_none(),
        "a refused item writes nothing"
    );
    for k in ["m1", "m2", "m4"] {
        assert!(get_by_key(&*s, &acme, k).await.is_some(), "{k} is stored");
    }
    // The refusal spent nothing: once a slot frees, m3 is admitted.
    fail(&*s, first.task.id, "free a slot").await;
    let again = create(&*s, new_scoped_task("acme", "s", "m3", "doc-3", two)).await;
    assert!(again.created);
    assert_eq!(
        s.create_tasks(Vec::new()).await.expect("empty batch").len(),
        0
    );
    // Unscoped items, a repeated key among them, and run-owned items of a missing and of
    // a live run: each answered in its place.
    let run = create_run(&*s, new_run("acme", "s")).await;
    let missing = tollgate_core::RunId::generate();
    let results = s
        .create_tasks(vec![
            new_app_task("acme", "s", "u1"),
            new_run_task("acme", missing, "u2"),
            new_app_task("acme", "s", "u1"),
            new_run_task("acme", run.id, "u3"),
        ])
        .await
        .expect("the batch runs");
    let u1 = results[0].as_ref().expect("u1 created");
    assert!(u1.created);
    assert!(
        matches!(results[1], Err(StoreError::RunNotFound(_))),
        "{:?}",
        results[1]
    );
    let again = results[2].as_ref().expect("u1 again");
    assert!(!again.created);
    assert_eq!(again.task.id, u1.task.id);
    let u3 = results[3].as_ref().expect("u3 created");
    assert_eq!(u3.task.run_id(), Some(run.id));
    assert!(get_by_key(&*s, &acme, "u2").await.is_none());
}
