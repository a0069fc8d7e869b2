//! SQLite-only behaviour the shared conformance suite cannot express: creating the file,
//! schema versions, and repair of a lost wake written behind the store's back.

use serde_json::json;
use std::sync::Arc;
use tollgate_core::{
    AppId, EffectKey, ManualClock, ModelId, ModelRef, NewRun, NewTask, Owner, RunState, ScopeId,
    StepKey, TaskKind, Timestamp, ValidatedRequest,
};
use tollgate_store::prelude::*;
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};
use tollgate_store::{StoreError, SweepConfig, WaitOutcome};

/// The manual clock's start (the conformance suite's `START`: 2026-01-01T00:00:00Z).
const START: Timestamp = Timestamp(1_767_225_600_000);

fn options(path: &std::path::Path, clock: &ManualClock) -> SqliteOptions {
    SqliteOptions::new(path).with_clock(Arc::new(clock.clone()))
}

/// A classify task of `owner` under `key`, its input `input`.
fn classify_task(owner: Owner, key: &str, input: &str) -> NewTask {
    NewTask {
        cost: None,
        dispatch: tollgate_core::Dispatch::default(),
        owner,
        step: StepKey::new("label").unwrap(),
        effect_key: EffectKey::new(key).unwrap(),
        request: ValidatedRequest::new(
            TaskKind::Classify,
            &json!({"input": input, "labels": ["a", "b"]}),
            1 << 18,
        )
        .unwrap(),
        model: ModelId::new("default").unwrap(),
        model_ref: ModelRef::new("dev", "dev-1"),
        scope: None,
        trace_parent: None,
        max_attempts: tollgate_core::MaxAttempts::ONE,
        released: false,
        claim_by: None,
    }
}

#[tokio::test]
async fn opening_a_missing_file_creates_it_and_its_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested").join("deeper").join("tollgate.db");
    let clock = ManualClock::new(START);
    let store = SqliteStore::open(options(&path, &clock)).await.unwrap();
    store.ping().await.unwrap();
    assert!(path.exists());
    // Opening again (a restart) keeps the data and applies nothing twice.
    store.close().await;
    SqliteStore::open(options(&path, &clock)).await.unwrap();
}

#[tokio::test]
async fn opening_a_newer_schema_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.db");
    let clock = ManualClock::new(START);
    let store = SqliteStore::open(options(&path, &clock)).await.unwrap();
    store.close().await;
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', 1, x'00', 0)",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    match SqliteStore::open(options(&path, &clock)).await {
        Err(e @ StoreError::SchemaTooNew { found: 9999, .. }) => {
            assert!(e.to_string().contains("upgrade Tollgate"), "{e}");
        }
        other => panic!("a newer schema must be refused clearly, got {other:?}"),
    }
}

#[tokio::test]
async fn sweep_repairs_a_lost_wake() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.db");
    let clock = ManualClock::new(START);
    let store = SqliteStore::open(options(&path, &clock)).await.unwrap();
    let acme = AppId::new("acme").unwrap();
    let run = store
        .create_run(NewRun {
            trace_parent: None,
            app: acme.clone(),
            scope: ScopeId::new("s").unwrap(),
            subject: None,
            input: json!({}),
        })
        .await
        .unwrap();
    let task = store
        .create_task(classify_task(
            Owner::Run {
                app: acme.clone(),
                run_id: run.id,
            },
            "k",
            "x",
        ))
        .await
        .unwrap()
        .task;
    assert!(matches!(
        store.wait_on_task(&acme, run.id, task.id).await.unwrap(),
        WaitOutcome::Waiting(_)
    ));
    // What a crash between saving the result and waking the run would leave behind.
    let pool = sqlx::SqlitePool::connect(&format!("sqlite://{}", path.display()))
        .await
        .unwrap();
    sqlx::query(
        "UPDATE tasks SET status = 'failed', error_code = 'provider_error', completed_at = 1 \
         WHERE id = ?",
    )
    .bind(task.id.to_string())
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;
    let report = store.sweep(&SweepConfig::default()).await.unwrap();
    assert_eq!(report.runs_repaired, 1);
    assert_eq!(report.woken_runs, vec![run.id]);
    let woken = store.get_run(&acme, run.id).await.unwrap().unwrap();
    assert_eq!(woken.state, RunState::Running);
    assert_eq!(
        store
            .sweep(&SweepConfig::default())
            .await
            .unwrap()
            .runs_repaired,
        0
    );
}

/// Migration 0013 (issue 26 item 13): a provider paused for 31 years by a
/// `Retry-After: 1000000000` written before pauses were capped starts afresh; a pause
/// of seconds stays.
#[tokio::test]
async fn migration_0013_repairs_a_provider_paused_for_years() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let store = SqliteStore::open(options(&dir.path().join("t.db"), &clock))
        .await
        .unwrap();
    let years = std::time::Duration::from_secs(1_000_000_000);
    store.pause_pace("wedged", years).await.unwrap();
    store
        .pause_pace("fine", std::time::Duration::from_secs(10))
        .await
        .unwrap();
    let keys = |k: &str| vec![k.to_string()];
    assert!(store.pace_pause_left(&keys("wedged")).await.unwrap() > years / 2);
    sqlx::raw_sql(include_str!(
        "../migrations/sqlite/0013_provider_pause_cap.sql"
    ))
    .execute(store.writer_pool())
    .await
    .unwrap();
    assert_eq!(
        store.pace_pause_left(&keys("wedged")).await.unwrap(),
        std::time::Duration::ZERO
    );
    assert_eq!(
        store.pace_pause_left(&keys("fine")).await.unwrap(),
        std::time::Duration::from_secs(10)
    );
}

/// docs/locking.md, "Creations made together": creations racing on one instance wait
/// for the writer together and are made in shared write transactions; each is created
/// once (a repeated key is answered with its one task).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_creations_are_made_together() {
    const CALLS: usize = 48;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tollgate.db");
    let clock = ManualClock::new(START);
    let store = SqliteStore::open(options(&path, &clock)).await.unwrap();
    let barrier = Arc::new(tokio::sync::Barrier::new(CALLS));
    let mut racers = Vec::new();
    for i in 0..CALLS {
        let owner = Owner::Application {
            app: AppId::new("acme").unwrap(),
            scope: ScopeId::new(format!("s{}", i % 3)).unwrap(),
            subject: None,
        };
        // Two racers of each key.
        let new = classify_task(owner, &format!("k{}", i / 2), &format!("x{}", i / 2));
        let (store, barrier) = (store.clone(), barrier.clone());
        racers.push(tokio::spawn(async move {
            barrier.wait().await;
            (i / 2, store.create_task(new).await.unwrap())
        }));
    }
    let mut by_key = std::collections::BTreeMap::<usize, Vec<_>>::new();
    for racer in racers {
        let (key, created) = racer.await.unwrap();
        by_key.entry(key).or_default().push(created);
    }
    for (key, answers) in &by_key {
        assert_eq!(answers[0].task.id, answers[1].task.id, "k{key}: one task");
        assert_eq!(
            answers.iter().filter(|c| c.created).count(),
            1,
            "k{key}: created once"
        );
    }
    assert!(
        store.created_together() > 0,
        "racing creations share write transactions"
    );
    let tasks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tasks")
        .fetch_one(store.writer_pool())
        .await
        .unwrap();
    assert_eq!(tasks, CALLS as i64 / 2);
}
