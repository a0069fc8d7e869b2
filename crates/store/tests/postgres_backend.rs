//! PostgreSQL-only behaviour that the shared conformance suite cannot express: schema
//! versions, replicas migrating at once, lost-wake repair, index use at scale, and
//! connection loss. Skipped (with a notice) without `TOLLGATE_TEST_DATABASE_URL`.

use serde_json::json;
use sqlx::Row;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{
    AppId, Budget, EffectKey, ManualClock, ModelId, ModelRef, NewRun, NewTask, Owner, ScopeId,
    SourceId, SourceRevision, StepKey, TaskKind, TaskScope, Timestamp, ValidatedRequest, WorkerId,
};
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
use tollgate_store::prelude::*;
use tollgate_store::{StoreError, SweepConfig, UnreleasedQuery, WaitOutcome};

/// The manual clock's start (the conformance suite's `START`: 2026-01-01T00:00:00Z).
const START: Timestamp = Timestamp(1_767_225_600_000);

#[path = "support/pg_schema.rs"]
mod pg_schema;
use pg_schema::{Schema, database_url};

/// Waits for other connections to publish their statistics counters (they do when idle)
/// and drops this connection's cached snapshot, so the next read sees them.
async fn fresh_counters(pool: &sqlx::PgPool) {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    sqlx::query("SELECT pg_stat_clear_snapshot()")
        .execute(pool)
        .await
        .unwrap();
}

fn classify(input: &str) -> ValidatedRequest {
    ValidatedRequest::new(
        TaskKind::Classify,
        &json!({"input": input, "labels": ["spam", "ham"]}),
        256 * 1024,
    )
    .expect("valid request")
}

fn app_task(app: &str, scope: &str, key: &str, source: Option<&str>) -> NewTask {
    NewTask {
        cost: None,
        dispatch: tollgate_core::Dispatch::default(),
        owner: Owner::Application {
            app: AppId::new(app).unwrap(),
            scope: ScopeId::new(scope).unwrap(),
            subject: None,
        },
        step: StepKey::new("label").unwrap(),
        effect_key: EffectKey::new(key).unwrap(),
        request: classify(key),
        model: ModelId::new("default").unwrap(),
        model_ref: ModelRef::new("dev", "dev-1"),
        scope: source.map(|s| TaskScope {
            source_id: SourceId::new(s).unwrap(),
            source_revision: SourceRevision::new("v1").unwrap(),
            recompute: false,
            budget: Budget::unlimited(),
            reservation: tollgate_core::Reservation::default(),
        }),
        trace_parent: None,
        max_attempts: tollgate_core::MaxAttempts::ONE,
        released: false,
        claim_by: None,
    }
}

/// The cost of a task without a source under a scope's USD limit (nano-dollars) and a
/// token rate, reserving `(nano-dollars, tokens)`.
fn metered(
    scope_nano: Option<std::num::NonZeroU64>,
    rate: Option<tollgate_core::TokenRate>,
    (nano_usd, tokens): (i64, u64),
) -> tollgate_core::TaskCost {
    tollgate_core::TaskCost {
        budget: Budget {
            cost: tollgate_core::CostLimits {
                scope_nano_per_24_hours: scope_nano,
                token_rate: rate,
                app_nano_per_24_hours: None,
            },
            ..Budget::unlimited()
        },
        reservation: tollgate_core::Reservation {
            nano_usd,
            tokens,
            bounded: true,
            ..Default::default()
        },
    }
}

/// Statements that name tasks by id read them through the primary key even when the
/// statistics are stale: taken while no task was queued, they make the partial indexes of
/// queued (and unsucceeded) tasks look empty, and a statement that also says `status =
/// 'queued'` (or `IN ('queued', 'running')`) could walk one of them whole for every call.
/// Measured from PostgreSQL's own counters: the index entries those indexes hand out stay
/// far below one walk of the backlog per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_by_id_stay_on_the_primary_key_with_stale_statistics() {
    let Some(url) = database_url("lookups_by_id_stay_on_the_primary_key_with_stale_statistics")
    else {
        return;
    };
    let schema = Schema::new(&url, "stale");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let pool = store.pool().clone();
    const BACKLOG: usize = 4000;
    let mut ids = Vec::new();
    for chunk in 0..BACKLOG / 1000 {
        let news: Vec<NewTask> = (0..1000)
            .map(|i| app_task("stale", "s", &format!("k-{chunk}-{i}"), None))
            .collect();
        for created in store.create_tasks(news).await.unwrap() {
            ids.push(created.unwrap().task.id);
        }
    }
    // Statistics taken while nothing was queued, then the backlog is queued again.
    for sql in [
        "UPDATE tasks SET status = 'succeeded'",
        "ANALYZE tasks",
        "UPDATE tasks SET status = 'queued'",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    let entries_read = || {
        let pool = pool.clone();
        async move {
            fresh_counters(&pool).await;
            sqlx::query_scalar::<_, i64>(
                "SELECT COALESCE(SUM(idx_tup_read), 0)::BIGINT FROM pg_stat_user_indexes \
                 WHERE schemaname = current_schema() AND indexrelname IN \
                 ('tasks_queued_dispatch', 'tasks_queued_age', 'tasks_app_unsucceeded')",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let before = entries_read().await;
    let w = WorkerId::new("w").unwrap();
    let app = AppId::new("stale").unwrap();
    const CALLS: usize = 12;
    for _ in 0..CALLS {
        assert_eq!(store.claim_next(&w, 4).await.unwrap().len(), 4);
    }
    let mut rest = ids[CALLS * 4..].iter();
    for _ in 0..CALLS {
        let id = *rest.next().unwrap();
        assert!(store.claim_task(id, &w).await.unwrap().is_some());
        let failed = store
            .fail_task(
                id,
                None,
                tollgate_core::ErrorCode::ProviderError,
                "boom",
                None,
            )
            .await
            .unwrap();
        assert!(failed.applied);
        let id = *rest.next().unwrap();
        assert!(store.request_cancel(&app, id).await.unwrap().is_some());
    }
    let read = entries_read().await - before;
    // Claims read the head of the queue (a few entries each, plus the ones they claimed
    // before); a single walk of the backlog is 4,000.
    assert!(
        read < BACKLOG as i64,
        "{read} entries of the queued and unsucceeded indexes read for {} calls",
        CALLS * 4
    );
}

/// A scope whose tasks are all created claimed (docs/engine.md, "Door calls claimed at
/// creation") has no queue row: the pass moves its claims owe are dropped at the next
/// payment, not carried (and written again) for ever.
#[tokio::test]
async fn moves_owed_to_queues_that_do_not_exist_are_dropped_when_paid() {
    let Some(url) = database_url("moves_owed_to_queues_that_do_not_exist_are_dropped_when_paid")
    else {
        return;
    };
    let schema = Schema::new(&url, "owed");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let w = WorkerId::new("w").unwrap();
    for i in 0..3 {
        let mut new = app_task("owed", &format!("door-{i}"), &format!("k{i}"), None);
        new.claim_by = Some(w.clone());
        let created = store.create_task(new).await.unwrap();
        assert_eq!(created.task.status, tollgate_core::TaskStatus::Running);
    }
    assert_eq!(
        store.owed_pass_moves(),
        3,
        "each claim at creation owes its move"
    );
    // A queue that exists is moved: its move is paid too.
    let queued = store
        .create_task(app_task("owed", "queued", "q", None))
        .await
        .unwrap();
    let claimed = store.claim_next(&w, 1).await.unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, queued.task.id);
    // The claim owes the queue's move; the next read of the queues pays it.
    assert!(store.claim_next(&w, 1).await.unwrap().is_empty());
    assert_eq!(
        store.owed_pass_moves(),
        0,
        "moves owed to queues without a row are dropped, the others written"
    );
}

/// docs/locking.md, "Creations made together": door-like calls (no source, a
/// token limit, created claimed) racing in one scope on one instance are created
/// together, in fewer transactions than calls, and each is created once, running, its
/// reservation recorded once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_calls_of_one_scope_are_created_together() {
    let Some(url) = database_url("racing_calls_of_one_scope_are_created_together") else {
        return;
    };
    const CALLS: usize = 48;
    let schema = Schema::new(&url, "together");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let rate = tollgate_core::TokenRate {
        tokens_per_minute: std::num::NonZeroU32::new(1_000_000).unwrap(),
        token_burst: std::num::NonZeroU32::new(1_000_000).unwrap(),
    };
    let barrier = Arc::new(tokio::sync::Barrier::new(CALLS));
    let mut racers = Vec::new();
    for i in 0..CALLS {
        let mut new = app_task("together", "door", &format!("k{i}"), None);
        new.claim_by = Some(WorkerId::new("w").unwrap());
        new.cost = Some(metered(None, Some(rate), (0, 10)));
        let (store, barrier) = (store.clone(), barrier.clone());
        racers.push(tokio::spawn(async move {
            barrier.wait().await;
            store.create_task(new).await
        }));
    }
    for racer in racers {
        let created = racer.await.unwrap().unwrap();
        assert!(created.created);
        assert_eq!(created.task.status, tollgate_core::TaskStatus::Running);
    }
    assert!(
        store.created_together() > 0,
        "racing calls of one scope share transactions"
    );
    let tasks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tasks")
        .fetch_one(store.pool())
        .await
        .unwrap();
    let reserved: i64 =
        sqlx::query_scalar("SELECT CAST(SUM(reserved_tokens) AS BIGINT) FROM scope_spend")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!((tasks, reserved), (CALLS as i64, CALLS as i64 * 10));
}

/// The advisory lock key of an (app, scope), as the store computes it (the first 8 bytes
/// of SHA-256 of both, with a separator).
const SCOPE_LOCK_KEY_SQL: &str = "SELECT ('x' || substr(encode(sha256(convert_to(\
     'tollgate-scope' || chr(31) || $1 || chr(31) || $2, 'UTF8')), 'hex'), 1, 16))::bit(64)::bigint";

/// Creates `new` across a change of its scope's facts: holds the (app, scope)'s lock,
/// and once the creation's statement waits for it, runs `change` in the holder's
/// transaction (as another replica's write would be) and commits; the creation's answer.
async fn created_across_a_change(
    store: &PostgresStore,
    (app, scope): (&str, &str),
    new: NewTask,
    change: &'static str,
) -> Result<tollgate_store::Created, StoreError> {
    let mut holder = hold_scope_lock(store, app, scope).await;
    let racing = {
        let store = store.clone();
        tokio::spawn(async move { store.create_task(new).await })
    };
    let waited = async {
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            )
            .fetch_one(store.pool())
            .await
            .unwrap();
            if waiting > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), waited)
        .await
        .expect("the creation's statement waits for the scope's lock");
    sqlx::query(change).execute(&mut *holder).await.unwrap();
    holder.commit().await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), racing)
        .await
        .expect("the creation is answered")
        .unwrap()
}

/// Adds an enabled webhook endpoint `id` of `app` listening for `task.succeeded`.
async fn listen_for_task_succeeded(store: &PostgresStore, id: &str, app: &str) {
    store
        .create_webhook_endpoint(tollgate_store::webhooks::NewWebhookEndpoint {
            id: id.into(),
            app: AppId::new(app).unwrap(),
            url: "https://hooks.example.com/a".into(),
            secret: "s".repeat(32),
            events: vec![tollgate_core::webhook::WebhookEventType::TaskSucceeded],
            budget_thresholds: vec![tollgate_core::webhook::budget::BudgetThreshold::DEFAULT],
            enabled: true,
            description: None,
            from_config: false,
        })
        .await
        .unwrap();
}

/// A transaction holding the (app, scope)'s advisory lock exclusively until it ends.
async fn hold_scope_lock(
    store: &PostgresStore,
    app: &str,
    scope: &str,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let key: i64 = sqlx::query_scalar(SCOPE_LOCK_KEY_SQL)
        .bind(app)
        .bind(scope)
        .fetch_one(store.pool())
        .await
        .unwrap();
    let mut holder = store.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(key)
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

/// docs/locking.md, "A creation in one statement": a lone door-like call (no source, a
/// USD limit, created claimed) is created in one statement, its reservation recorded
/// once; a replay answers its task. When the scope's facts change between the call's
/// reads and its statement (here: a spend written while the statement waited for the
/// scope's lock), the statement writes nothing and the call is created by the
/// transaction instead, decided on the new facts: the scope's limit holds exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_metered_call_is_created_in_one_statement_unless_its_facts_change() {
    let Some(url) =
        database_url("a_lone_metered_call_is_created_in_one_statement_unless_its_facts_change")
    else {
        return;
    };
    let schema = Schema::new(&url, "lone_call");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    // The scope may spend 250,000 n$ a day; each call reserves 100,000.
    let call = |key: &str| {
        let mut new = app_task("lone", "door", key, None);
        new.claim_by = Some(WorkerId::new("w").unwrap());
        new.cost = Some(metered(
            std::num::NonZeroU64::new(250_000),
            None,
            (100_000, 10),
        ));
        new
    };
    let reserved = |store: PostgresStore| async move {
        let sum: Option<i64> =
            sqlx::query_scalar("SELECT CAST(SUM(reserved_nano) AS BIGINT) FROM scope_spend")
                .fetch_one(store.pool())
                .await
                .unwrap();
        sum.unwrap_or(0)
    };
    let first = store.create_task(call("a")).await.unwrap();
    assert!(first.created);
    assert_eq!(first.task.status, tollgate_core::TaskStatus::Running);
    assert_eq!(store.created_in_one_statement(), (1, 0));
    assert_eq!(reserved(store.clone()).await, 100_000);
    let replay = store.create_task(call("a")).await.unwrap();
    assert_eq!((replay.created, replay.task.id), (false, first.task.id));
    assert_eq!(store.created_in_one_statement(), (1, 0));
    assert_eq!(reserved(store.clone()).await, 100_000);

    // Hold the scope's lock; the next call reads its facts (100,000 n$ spent: it fits),
    // then its statement waits for the lock. Meanwhile 100,000 n$ more are reserved in
    // the scope (as another replica's creation would have): the call no longer fits.
    let answer = created_across_a_change(
        &store,
        ("lone", "door"),
        call("b"),
        "UPDATE scope_spend SET reserved_nano = reserved_nano + 100000",
    )
    .await;
    assert!(
        matches!(
            answer,
            Err(StoreError::Cost(
                tollgate_core::CostRejection::ScopeSpend { .. }
            ))
        ),
        "decided again on the new facts: {answer:?}"
    );
    assert_eq!(store.created_in_one_statement(), (1, 1));
    assert_eq!(reserved(store.clone()).await, 200_000);
    let tasks: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM tasks")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(tasks, 1, "the failed statement wrote nothing");
}

/// docs/locking.md, "A creation in one statement": a lone scoped creation is made in one
/// statement after one plain read — its admission (once its slot stripe has an
/// allowance: the first admission under a cap finds none, and the transaction
/// rebalances), and its cache hit with its saving; a replay answers its task. When the
/// scope's facts change between the read and the statement (here: another replica's
/// admission counted while the statement waited for the scope's lock), the statement
/// writes nothing and the transaction decides again on the new facts: the scope's limit
/// holds exactly. A hit whose app has an endpoint listening for `task.succeeded` is made
/// by the transaction, which writes the outbox's event.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lone_scoped_creation_is_made_in_one_statement_unless_its_facts_change() {
    let Some(url) =
        database_url("a_lone_scoped_creation_is_made_in_one_statement_unless_its_facts_change")
    else {
        return;
    };
    let schema = Schema::new(&url, "lone_scoped");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let budget = Budget {
        scope_concurrent: std::num::NonZeroU32::new(3).unwrap(),
        ..Budget::unlimited()
    };
    let task = |key: &str, source: &str| {
        let mut new = app_task("lone", "s", key, Some(source));
        new.scope.as_mut().unwrap().budget = budget;
        new
    };
    let count = |sql: &'static str| {
        let store = store.clone();
        async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(store.pool())
                .await
                .unwrap()
        }
    };
    // The first admission under this cap: no stripe has an allowance for it yet.
    let first = store.create_task(task("a", "doc-1")).await.unwrap();
    assert!(first.created);
    assert_eq!(store.created_in_one_statement(), (0, 1));
    let second = store.create_task(task("b", "doc-2")).await.unwrap();
    assert!(second.created);
    assert_eq!(store.created_in_one_statement(), (1, 1));
    let replay = store.create_task(task("b", "doc-2")).await.unwrap();
    assert_eq!((replay.created, replay.task.id), (false, second.task.id));
    assert_eq!(store.created_in_one_statement(), (1, 1));
    let (active, sources): (i64, i64) =
        sqlx::query_as("SELECT active, sources_in_window FROM scope_state")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!((active, sources), (2, 2), "both admissions counted once");
    assert_eq!(count("SELECT COUNT(*) FROM admissions").await, 2);

    // Hold the scope's lock; the next creation reads its facts (2 active of 3: it fits),
    // then its statement waits for the lock. Meanwhile another admission is counted in
    // the scope (as another replica's would be): the creation no longer fits.
    let answer = created_across_a_change(
        &store,
        ("lone", "s"),
        task("c", "doc-3"),
        "UPDATE scope_state SET active = active + 1",
    )
    .await;
    assert!(
        matches!(
            answer,
            Err(StoreError::Admission(
                tollgate_core::AdmissionRejection::ScopeCapacity { .. }
            ))
        ),
        "decided again on the new facts: {answer:?}"
    );
    assert_eq!(store.created_in_one_statement(), (1, 2));
    assert_eq!(
        count("SELECT COUNT(*) FROM tasks").await,
        2,
        "nothing written"
    );
    assert_eq!(count("SELECT COUNT(*) FROM admissions").await, 2);

    // "b" succeeds; the same step under a new effect key is its cache hit, in one
    // statement, its saving recorded.
    let w = WorkerId::new("w").unwrap();
    let claimed = store.claim_next(&w, 4).await.unwrap();
    let b = claimed
        .iter()
        .find(|t| t.id == second.task.id)
        .expect("b is claimed")
        .clone();
    let usage = tollgate_core::Usage {
        input_tokens: 10,
        output_tokens: 1,
        ..tollgate_core::Usage::default()
    };
    let answers = store
        .complete_tasks(vec![tollgate_store::Completion {
            id: b.id,
            lease: b.lease().unwrap(),
            output: json!({"label": "spam"}),
            usage,
            claimed: Some(Arc::new(b)),
            attempt: None,
        }])
        .await
        .unwrap();
    assert!(answers[0].as_ref().unwrap().applied);
    // What b cost (the dev model has no prices): what a hit on it saves.
    sqlx::query("UPDATE tasks SET charged_nano = 700 WHERE effect_key = 'b'")
        .execute(store.pool())
        .await
        .unwrap();
    let mut again = task("b2", "doc-2");
    again.request = classify("b");
    let hit = store.create_task(again).await.unwrap();
    assert!(hit.created && hit.task.cached());
    assert_eq!(hit.task.status, tollgate_core::TaskStatus::Succeeded);
    assert_eq!(store.created_in_one_statement(), (2, 2));
    let saved = count("SELECT CAST(COALESCE(SUM(saved_nano), 0) AS BIGINT) FROM scope_spend").await;
    assert_eq!(saved, 700, "the hit saved what b was charged");
    assert_eq!(count("SELECT COUNT(*) FROM webhook_events").await, 0);

    // With an endpoint listening for task.succeeded, a hit is the transaction's (its
    // event written).
    listen_for_task_succeeded(&store, "whe_lone", "lone").await;
    let mut listened = task("b3", "doc-2");
    listened.request = classify("b");
    let hit = store.create_task(listened).await.unwrap();
    assert!(hit.created && hit.task.cached());
    assert_eq!(store.created_in_one_statement(), (2, 3));
    assert_eq!(count("SELECT COUNT(*) FROM webhook_events").await, 1);
}

/// A creation in one statement that finds its key taken reads the task on the
/// connection it holds: replays racing on a pool of two connections are all answered
/// (a second connection taken from the pool while holding one would wait for ever once
/// every connection is held so).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replays_racing_on_a_small_pool_are_answered() {
    let Some(url) = database_url("replays_racing_on_a_small_pool_are_answered") else {
        return;
    };
    let schema = Schema::new(&url, "small_pool");
    let clock = ManualClock::new(START);
    let mut options = schema.options(&clock);
    options.max_connections = 2;
    options.acquire_timeout = Duration::from_secs(3);
    let store = PostgresStore::open(options).await.unwrap();
    let scoped = || app_task("small", "s", "a", Some("doc-1"));
    let metered_call = || {
        let mut new = app_task("small", "door", "m", None);
        new.cost = Some(metered(
            std::num::NonZeroU64::new(1_000_000_000),
            None,
            (100, 10),
        ));
        new
    };
    let first = store.create_task(scoped()).await.unwrap();
    let call = store.create_task(metered_call()).await.unwrap();
    let mut racing = Vec::new();
    for n in 0..32 {
        let store = store.clone();
        let new = if n % 2 == 0 { scoped() } else { metered_call() };
        racing.push(tokio::spawn(async move { store.create_task(new).await }));
    }
    for (n, answer) in racing.into_iter().enumerate() {
        let answer = answer.await.unwrap().expect("a replay is answered");
        let id = if n % 2 == 0 {
            first.task.id
        } else {
            call.task.id
        };
        assert_eq!((answer.created, answer.task.id), (false, id));
    }
}

/// docs/locking.md, "Connections for lone statements": a lone creation runs on a
/// connection kept beside the pool and leaves it for the next; one abandoned while its
/// statement waits (its caller went away) closes its connection instead (it may still
/// owe that statement's answer), and a later creation gets its own answer; one the server
/// closed while it was idle is found closed before use; at most the cap are kept, and
/// none after the store closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lone_statements_keep_their_connections_and_close_an_abandoned_one() {
    let Some(url) =
        database_url("lone_statements_keep_their_connections_and_close_an_abandoned_one")
    else {
        return;
    };
    let schema = Schema::new(&url, "kept_conns");
    let clock = ManualClock::new(START);
    // 16 connections in the pool: two kept beside it.
    let mut options = schema.options(&clock);
    options.application_name = "tollgate-kept-conns-test".to_string();
    let store = PostgresStore::open(options).await.unwrap();
    for key in ["a", "b", "c"] {
        let made = store
            .create_task(app_task("kept", "s", key, None))
            .await
            .unwrap();
        assert!(made.created);
        assert_eq!(made.task.effect_key.as_str(), key);
    }
    assert_eq!(
        store.kept_connections(),
        1,
        "one after another, one connection"
    );

    // The server ends the idle kept connection (as an idle timeout or a restart would);
    // the next creation, a while later, pings it first, finds it gone and takes another.
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'tollgate-kept-conns-test' AND state = 'idle'",
    )
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert!(!ended.is_empty());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let after = store
        .create_task(app_task("kept", "s", "after-idle", None))
        .await
        .expect("a closed kept connection is not used");
    assert!(after.created);
    assert_eq!(store.kept_connections(), 1);

    // The scope's lock held: the next creation's statement waits for it, and is
    // abandoned.
    let holder = hold_scope_lock(&store, "kept", "s").await;
    let abandoned = tokio::time::timeout(
        Duration::from_millis(300),
        store.create_task(app_task("kept", "s", "abandoned", None)),
    )
    .await;
    assert!(
        abandoned.is_err(),
        "the creation waits for the scope's lock"
    );
    assert_eq!(
        store.kept_connections(),
        0,
        "the abandoned connection is closed"
    );
    holder.commit().await.unwrap();
    let next = store
        .create_task(app_task("kept", "s", "d", None))
        .await
        .unwrap();
    assert!(next.created);
    assert_eq!(next.task.effect_key.as_str(), "d", "its own answer");
    assert_eq!(store.kept_connections(), 1);

    // Many at once (each its own scope: no group forms): at most the cap kept.
    let racing: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let new = app_task("kept", &format!("r{i}"), &format!("r{i}"), None);
                store.create_task(new).await
            })
        })
        .collect();
    for made in futures::future::join_all(racing).await {
        assert!(made.unwrap().unwrap().created);
    }
    assert!(
        store.kept_connections() <= 2,
        "{}",
        store.kept_connections()
    );
    store.close().await;
    assert_eq!(store.kept_connections(), 0);
}

/// docs/locking.md, "Creations made together": when the creation that leads a group goes
/// away (its caller dropped it while it waited), the creations waiting for it are still
/// made. The lead's own creation is made at most once: its statement, already sent, may
/// still commit (docs/locking.md, "A creation in one statement": as an answer lost after
/// its commit; disconnecting cancels nothing, docs/api.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creations_waiting_for_a_lead_that_goes_away_are_still_made() {
    let Some(url) = database_url("creations_waiting_for_a_lead_that_goes_away_are_still_made")
    else {
        return;
    };
    let schema = Schema::new(&url, "lead_gone");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let call = |key: &str| {
        let mut new = app_task("lead_gone", "door", key, None);
        new.cost = Some(metered(
            std::num::NonZeroU64::new(1_000_000_000),
            None,
            (10, 0),
        ));
        new
    };
    // Inserts into `tasks` wait while this transaction holds the table: the lead's
    // creation stops at its insert, and the others wait for it in the group.
    let mut blocker = store.pool().begin().await.unwrap();
    sqlx::query("LOCK TABLE tasks IN EXCLUSIVE MODE")
        .execute(&mut *blocker)
        .await
        .unwrap();
    let lead = {
        let (store, new) = (store.clone(), call("lead"));
        tokio::spawn(async move { store.create_task(new).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut waiting = Vec::new();
    for i in 0..8 {
        let (store, new) = (store.clone(), call(&format!("w{i}")));
        waiting.push(tokio::spawn(async move { store.create_task(new).await }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    lead.abort();
    assert!(lead.await.unwrap_err().is_cancelled());
    blocker.commit().await.unwrap();
    for w in waiting {
        let created = tokio::time::timeout(Duration::from_secs(30), w)
            .await
            .expect("a waiting creation is answered")
            .unwrap()
            .unwrap();
        assert!(created.created);
    }
    let mut keys: Vec<String> =
        sqlx::query_scalar("SELECT effect_key FROM tasks ORDER BY effect_key")
            .fetch_all(store.pool())
            .await
            .unwrap();
    keys.retain(|k| k != "lead");
    assert_eq!(keys, (0..8).map(|i| format!("w{i}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn opening_a_newer_schema_is_refused() {
    let Some(url) = database_url("opening_a_newer_schema_is_refused") else {
        return;
    };
    let schema = Schema::new(&url, "newer");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from the future', TRUE, '\\x00', 0)",
    )
    .execute(store.pool())
    .await
    .unwrap();
    store.close().await;
    match PostgresStore::open(schema.options(&clock)).await {
        Err(StoreError::SchemaTooNew { found: 9999, .. }) => {}
        other => panic!("a newer schema must be refused clearly, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_at_once_migrate_once() {
    let Some(url) = database_url("replicas_starting_at_once_migrate_once") else {
        return;
    };
    let schema = Schema::new(&url, "migrate");
    let clock = ManualClock::new(START);
    let mut opens = Vec::new();
    for _ in 0..8 {
        let options = schema.options(&clock);
        opens.push(tokio::spawn(
            async move { PostgresStore::open(options).await },
        ));
    }
    let mut stores = Vec::new();
    for o in opens {
        stores.push(o.await.unwrap().expect("every replica starts"));
    }
    let (applied, distinct): (i64, i64) =
        sqlx::query_as("SELECT COUNT(*), COUNT(DISTINCT version) FROM _sqlx_migrations")
            .fetch_one(stores[0].pool())
            .await
            .unwrap();
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations/postgres"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count() as i64;
    assert_eq!(
        (applied, distinct),
        (files, files),
        "each migration is applied once"
    );
    let created = stores[3]
        .create_task(app_task("acme", "s", "k", Some("doc")))
        .await
        .unwrap();
    assert!(created.created);
}

#[tokio::test]
async fn sweep_repairs_a_lost_wake() {
    let Some(url) = database_url("sweep_repairs_a_lost_wake") else {
        return;
    };
    let schema = Schema::new(&url, "wake");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
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
    let mut new = app_task("acme", "s", "k", None);
    new.owner = Owner::Run {
        app: acme.clone(),
        run_id: run.id,
    };
    let task = store.create_task(new).await.unwrap().task;
    assert!(matches!(
        store.wait_on_task(&acme, run.id, task.id).await.unwrap(),
        WaitOutcome::Waiting(_)
    ));
    // A crash between saving the result and waking: the task is terminal, the run still
    // waits (written behind the store's back, as only a crash could leave it).
    sqlx::query("UPDATE tasks SET status = 'failed', error_code = 'provider_error', completed_at = 1 WHERE id = $1")
        .bind(task.id.to_string())
        .execute(store.pool())
        .await
        .unwrap();
    let report = store.sweep(&SweepConfig::default()).await.unwrap();
    assert_eq!(report.runs_repaired, 1);
    assert_eq!(report.woken_runs, vec![run.id]);
    let woken = store.get_run(&acme, run.id).await.unwrap().unwrap();
    assert_eq!(woken.state, tollgate_core::RunState::Running);
    assert_eq!(
        store
            .sweep(&SweepConfig::default())
            .await
            .unwrap()
            .runs_repaired,
        0
    );
}

/// docs/conformance.md#constant-admission / issue 3: with ≥ 100,000 tasks (and as many admission records), none of the
/// hot statements scans a whole table. Measured from PostgreSQL's own counters: every
/// store operation on the hot paths runs, and `seq_scan` of `tasks` and `admissions`
/// must not move.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_queries_never_scan_whole_tables_at_100k_rows() {
    let Some(url) = database_url("hot_queries_never_scan_whole_tables_at_100k_rows") else {
        return;
    };
    let schema = Schema::new(&url, "explain");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let pool = store.pool().clone();
    let request = classify("bulk").canonical().to_string();
    // 100,000 finished tasks over 1,000 scopes, and one admission record each.
    sqlx::query(
        "INSERT INTO tasks (id, app, effect_key, kind, step, scope, source_id, source_revision, \
         recompute, admitted, model_id, model_ref, model_config_hash, request, input_hash, \
         cache_key, status, output, usage, created_at, completed_at, released_at) \
         SELECT md5('t' || i)::uuid::TEXT, 'bulk', 'key-' || i, 'classify', 'label', 'scope-' || (i % 1000), \
         'src-' || i, 'v1', FALSE, TRUE, 'default', '{\"provider\":\"dev\",\"model\":\"dev-1\",\"params\":{}}', \
         'h', $1, 'ih', 'ck-' || i, CASE WHEN i % 10 = 0 THEN 'failed' ELSE 'succeeded' END, \
         '{\"label\":\"spam\"}', '{\"input_tokens\":1,\"output_tokens\":1}', $2 - 1000, $2 - 500, \
         CASE WHEN i % 3 = 0 THEN $2 ELSE NULL END \
         FROM generate_series(1, 100000) AS i",
    )
    .bind(&request)
    .bind(START.0)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO admissions (app, scope, source_id, task_id, logical_key, admitted_at) \
         SELECT 'bulk', 'scope-' || (i % 1000), 'src-' || i, md5('t' || i)::uuid::TEXT, 'ck-' || i, $1 - 1000 \
         FROM generate_series(1, 100000) AS i",
    )
    .bind(START.0)
    .execute(&pool)
    .await
    .unwrap();
    // docs/conformance.md#cost-limits: a day of hourly spend buckets for every scope, and for 500 apps.
    let hour = tollgate_core::cost::spend_bucket(START);
    sqlx::query(
        "INSERT INTO scope_spend (app, scope, bucket, reserved_nano, settled_nano) \
         SELECT 'bulk', 'scope-' || s, $1 - h, 10, 20 \
         FROM generate_series(0, 999) AS s, generate_series(0, 30) AS h",
    )
    .bind(hour)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO app_spend (app, bucket, stripe, reserved_nano, settled_nano) \
         SELECT CASE WHEN a = 0 THEN 'bulk' ELSE 'app-' || a END, $1 - h, st, 10, 20 \
         FROM generate_series(0, 499) AS a, generate_series(0, 30) AS h, \
              generate_series(0, 7) AS st",
    )
    .bind(hour)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();

    let seq_scans = || {
        let pool = pool.clone();
        async move {
            fresh_counters(&pool).await;
            let rows = sqlx::query(
                "SELECT relname::TEXT AS rel, COALESCE(seq_scan, 0) AS n FROM pg_stat_user_tables \
                 WHERE schemaname = current_schema() \
                 AND relname IN ('tasks', 'admissions', 'scope_spend', 'app_spend')",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            rows.iter()
                .map(|r| (r.get::<String, _>("rel"), r.get::<i64, _>("n")))
                .collect::<std::collections::BTreeMap<_, _>>()
        }
    };
    let before = seq_scans().await;

    // Every hot path once.
    let acme = AppId::new("bulk").unwrap();
    let w = WorkerId::new("w").unwrap();
    let a = store
        .create_task(app_task("bulk", "scope-7", "new-1", Some("src-new")))
        .await
        .unwrap()
        .task;
    let cached = store
        .create_task(app_task("bulk", "scope-8", "new-2", Some("src-8")))
        .await
        .unwrap();
    // docs/conformance.md#cost-limits: an admission under every cost limit, and the usage reads.
    let mut costly = app_task("bulk", "scope-6", "new-costly", Some("src-costly"));
    if let Some(scoped) = costly.scope.as_mut() {
        scoped.budget.cost = tollgate_core::CostLimits {
            scope_nano_per_24_hours: std::num::NonZeroU64::new(1_000_000_000),
            token_rate: Some(tollgate_core::TokenRate {
                tokens_per_minute: std::num::NonZeroU32::new(1_000_000).unwrap(),
                token_burst: std::num::NonZeroU32::new(1_000_000).unwrap(),
            }),
            app_nano_per_24_hours: std::num::NonZeroU64::new(1_000_000_000_000),
        };
        scoped.reservation = tollgate_core::cost::reservation(
            Some(&tollgate_core::TokenBound {
                input_tokens: 100,
                reask_input_tokens: 10,
                output_tokens: 10,
                attempts: 2,
            }),
            Some(tollgate_core::Prices {
                input: 1_000,
                output: 2_000,
                cached_input: 500,
                cache_write_input: 1_000,
            }),
        );
    }
    let costly = store.create_task(costly).await.unwrap().task;
    store.request_cancel(&acme_id(), costly.id).await.unwrap();
    store
        .spend(&acme_id(), Some(&ScopeId::new("scope-6").unwrap()))
        .await
        .unwrap();
    store.spend(&acme_id(), None).await.unwrap();
    let b = store
        .create_task(app_task("bulk", "scope-9", "new-3", None))
        .await
        .unwrap()
        .task;
    store.get_task(&acme, a.id).await.unwrap();
    store
        .get_task_by_effect_key(&acme, &EffectKey::new("key-5").unwrap())
        .await
        .unwrap();
    let claimed = store.claim_next(&w, 1).await.unwrap();
    assert_eq!(claimed.len(), 1);
    store.claim_task(b.id, &w).await.unwrap();
    store.heartbeat(&w, &[(a.id, 1), (b.id, 1)]).await.unwrap();
    store
        .complete_task(
            claimed[0].id,
            &tollgate_core::Lease::new(w.clone(), 1),
            json!({"label": "spam"}),
            Default::default(),
        )
        .await
        .unwrap();
    store
        .fail_task(
            b.id,
            None,
            tollgate_core::ErrorCode::ProviderError,
            "boom",
            None,
        )
        .await
        .unwrap();
    store.is_cancellation_requested(a.id).await.unwrap();
    store.request_cancel(&acme, a.id).await.unwrap();
    store.mark_canceled(a.id).await.unwrap();
    store
        .release(
            &acme,
            &ScopeId::new("scope-8").unwrap(),
            &EffectKey::new("new-2").unwrap(),
        )
        .await
        .unwrap();
    store
        .list_unreleased_sources(&acme, &UnreleasedQuery::default())
        .await
        .unwrap();
    store
        .list_unreleased_sources(
            &acme,
            &UnreleasedQuery {
                scope: Some(ScopeId::new("scope-3").unwrap()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    store.first_queued().await.unwrap();
    let run = store
        .create_run(NewRun {
            trace_parent: None,
            app: acme.clone(),
            scope: ScopeId::new("scope-1").unwrap(),
            subject: None,
            input: json!({}),
        })
        .await
        .unwrap();
    let mut rt = app_task("bulk", "x", "run-task", Some("src-run"));
    rt.owner = Owner::Run {
        app: acme.clone(),
        run_id: run.id,
    };
    let rt = store.create_task(rt).await.unwrap().task;
    store.wait_on_task(&acme, run.id, rt.id).await.unwrap();
    store.request_run_cancel(&acme, run.id).await.unwrap();
    clock.advance(Duration::from_secs(2 * 24 * 3600));
    let mut sweeps = 0;
    loop {
        let r = store.sweep(&SweepConfig::default()).await.unwrap();
        sweeps += 1;
        if !r.more || sweeps >= 3 {
            break;
        }
    }
    store
        .delete_owner_data(
            &acme,
            &ScopeId::new("scope-4").unwrap(),
            Some(&SourceId::new("src-4").unwrap()),
        )
        .await
        .unwrap();
    store
        .delete_owner_data(&acme, &ScopeId::new("scope-5").unwrap(), None)
        .await
        .unwrap();
    // docs/conformance.md#listings listings: every filter of every listing, and a second page.
    use tollgate_store::list::{RunListQuery, TaskListQuery};
    let queries = [
        TaskListQuery::default(),
        TaskListQuery {
            scope: Some(ScopeId::new("scope-3").unwrap()),
            ..Default::default()
        },
        TaskListQuery {
            statuses: vec![
                tollgate_core::TaskStatus::Failed,
                tollgate_core::TaskStatus::Queued,
            ],
            ..Default::default()
        },
        TaskListQuery {
            statuses: vec![tollgate_core::TaskStatus::Succeeded],
            ..Default::default()
        },
        TaskListQuery {
            kind: Some(tollgate_core::TaskKind::GenerateText),
            ..Default::default()
        },
        TaskListQuery {
            step: Some(tollgate_core::StepKey::new("label").unwrap()),
            ..Default::default()
        },
        TaskListQuery {
            error_code: Some("WORKFLOW_AI_PROVIDER_ERROR".into()),
            ..Default::default()
        },
        TaskListQuery {
            source: Some(SourceId::new("src-77").unwrap()),
            ..Default::default()
        },
        TaskListQuery {
            run: Some(run.id),
            ..Default::default()
        },
        TaskListQuery {
            created_after: Some(START.minus(Duration::from_secs(5))),
            created_before: Some(START),
            ..Default::default()
        },
    ];
    for q in &queries {
        let page = store.list_tasks(&acme, q).await.unwrap();
        if let Some(next) = page.next {
            let q = TaskListQuery {
                after: Some(next),
                ..q.clone()
            };
            store.list_tasks(&acme, &q).await.unwrap();
        }
    }
    store
        .list_runs(&acme, &RunListQuery::default())
        .await
        .unwrap();
    store
        .list_runs(
            &acme,
            &RunListQuery {
                scope: Some(ScopeId::new("x").unwrap()),
                states: vec![tollgate_core::RunState::Canceled],
                pipeline: Some(tollgate_core::PipelineName::new("p").unwrap()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    store.list_pipelines(&acme, None, 10).await.unwrap();
    store.list_scopes(&acme, None, 10).await.unwrap();
    store
        .scope_snapshot(&acme, &ScopeId::new("scope-7").unwrap())
        .await
        .unwrap();
    store.task_stats(&acme, None).await.unwrap();
    store
        .task_stats(&acme, Some(START.minus(Duration::from_secs(3600))))
        .await
        .unwrap();
    assert!(!cached.created || cached.task.cached_from.is_none());

    let after = seq_scans().await;
    assert_eq!(
        before, after,
        "a hot statement scanned a whole table (seq_scan before vs after)"
    );
}

fn acme_id() -> AppId {
    AppId::new("bulk").unwrap()
}

/// Connection loss: PostgreSQL stopped mid-use surfaces as a retryable error, never a
/// wrong state, and the first call after it is back succeeds. Uses a private cluster
/// made with `initdb` in a temporary folder so other tests keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_postgres_is_retryable_then_recovers() {
    if database_url("restarted_postgres_is_retryable_then_recovers").is_none() {
        return;
    }
    let Some(cluster) = PrivateCluster::start() else {
        if std::env::var("TOLLGATE_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
            panic!("cannot make a private PostgreSQL cluster (initdb/pg_ctl as user postgres)");
        }
        eprintln!("skipping: cannot make a private PostgreSQL cluster");
        return;
    };
    let clock = ManualClock::new(START);
    let mut options = PostgresOptions::new(cluster.url()).with_clock(Arc::new(clock.clone()));
    options.acquire_timeout = Duration::from_secs(2);
    let store = PostgresStore::open(options)
        .await
        .expect("store on the private cluster");
    let first = store
        .create_task(app_task("acme", "s", "before", Some("doc")))
        .await
        .unwrap();
    assert!(first.created);

    cluster.stop();
    let err = store
        .create_task(app_task("acme", "s", "during", Some("doc")))
        .await
        .expect_err("no database, no task");
    assert!(
        err.is_retryable(),
        "connection loss must be retryable, got {err:?}"
    );

    cluster.start_again();
    let mut after = None;
    for _ in 0..20 {
        match store
            .create_task(app_task("acme", "s", "after", Some("doc")))
            .await
        {
            Ok(c) => {
                after = Some(c);
                break;
            }
            Err(e) if e.is_retryable() => tokio::time::sleep(Duration::from_millis(250)).await,
            Err(e) => panic!("after the restart only retryable errors are allowed: {e:?}"),
        }
    }
    assert!(after.expect("a call after the restart succeeds").created);
    let acme = AppId::new("acme").unwrap();
    assert!(
        store
            .get_task_by_effect_key(&acme, &EffectKey::new("during").unwrap())
            .await
            .unwrap()
            .is_none(),
        "the failed call wrote nothing"
    );
    assert!(
        store
            .get_task_by_effect_key(&acme, &EffectKey::new("before").unwrap())
            .await
            .unwrap()
            .is_some()
    );
}

/// A throwaway PostgreSQL server owned by the `postgres` user in a temporary folder.
struct PrivateCluster {
    dir: std::path::PathBuf,
    port: u16,
    bin: std::path::PathBuf,
}

impl PrivateCluster {
    fn start() -> Option<PrivateCluster> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .find(|p| p.join("initdb").exists())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir =
            std::env::temp_dir().join(format!("tollgate-pg-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).ok()?;
        let as_postgres = |args: &[&str]| -> bool {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .args(args)
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false)
        };
        Command::new("chown")
            .args(["postgres:postgres", dir.to_str()?])
            .status()
            .ok()?;
        let data = dir.join("data");
        let ok = as_postgres(&[
            bin.join("initdb").to_str()?,
            "-D",
            data.to_str()?,
            "-A",
            "trust",
            "-U",
            "postgres",
        ]);
        if !ok {
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        }
        let cluster = PrivateCluster { dir, port, bin };
        if !cluster.pg_ctl("start") {
            return None;
        }
        Some(cluster)
    }

    fn pg_ctl(&self, action: &str) -> bool {
        let data = self.dir.join("data");
        let log = self.dir.join("log");
        let opts = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off",
            self.port,
            self.dir.display()
        );
        let mut args = vec![
            self.bin.join("pg_ctl").display().to_string(),
            "-D".into(),
            data.display().to_string(),
            "-l".into(),
            log.display().to_string(),
            "-w".into(),
            "-t".into(),
            "30".into(),
        ];
        if action == "stop" {
            args.extend(["-m".into(), "immediate".into()]);
        } else {
            args.extend(["-o".into(), opts]);
        }
        args.push(action.into());
        Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .args(&args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    fn stop(&self) {
        assert!(self.pg_ctl("stop"), "pg_ctl stop");
    }

    fn start_again(&self) {
        assert!(self.pg_ctl("start"), "pg_ctl start");
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Migration 0013 (issue 26 item 13): a provider paused for 31 years by a
/// `Retry-After: 1000000000` written before pauses were capped starts afresh; a pause
/// of seconds stays.
#[tokio::test]
async fn migration_0013_repairs_a_provider_paused_for_years() {
    let Some(url) = database_url("migration_0013_repairs_a_provider_paused_for_years") else {
        return;
    };
    let schema = Schema::new(&url, "pause_cap");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let years = Duration::from_secs(1_000_000_000);
    store.pause_pace("wedged", years).await.unwrap();
    store
        .pause_pace("fine", Duration::from_secs(10))
        .await
        .unwrap();
    let keys = |k: &str| vec![k.to_string()];
    assert!(store.pace_pause_left(&keys("wedged")).await.unwrap() > years / 2);
    sqlx::raw_sql(include_str!(
        "../migrations/postgres/0013_provider_pause_cap.sql"
    ))
    .execute(store.pool())
    .await
    .unwrap();
    assert_eq!(
        store.pace_pause_left(&keys("wedged")).await.unwrap(),
        Duration::ZERO
    );
    assert_eq!(
        store.pace_pause_left(&keys("fine")).await.unwrap(),
        Duration::from_secs(10)
    );
    store.close().await;
}

/// docs/engine.md, "Dead rows": a hot table whose dead rows pass the bound (at least 1,000
/// and a tenth of its live rows) is vacuumed after a sweep, without autovacuum's help
/// (off for this table here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_vacuums_hot_tables_whose_dead_rows_passed_the_bound() {
    let Some(url) = database_url("a_sweep_vacuums_hot_tables_whose_dead_rows_passed_the_bound")
    else {
        return;
    };
    let schema = Schema::new(&url, "lean");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let pool = store.pool().clone();
    // Dead rows and manual vacuums of `dispatch_queues`, as the statistics show them now.
    let stats = || {
        let pool = pool.clone();
        async move {
            fresh_counters(&pool).await;
            sqlx::query_as::<_, (i64, i64)>(
                "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables \
                 WHERE schemaname = current_schema() AND relname = 'dispatch_queues'",
            )
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    for sql in [
        "ALTER TABLE dispatch_queues SET (autovacuum_enabled = false)",
        "INSERT INTO dispatch_queues (app, scope, weight, pass, active) \
         VALUES ('lean', 's', 1, 0, FALSE)",
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&pool)
            .await
            .unwrap();
    }
    // 3,000 updates of an indexed column of one row (as claims move a queue's pass): dead
    // versions well past the bound of 1,000, even when the statistics count fewer (a CI
    // run once saw 991 of 1,500).
    for _ in 0..3000 {
        sqlx::query("UPDATE dispatch_queues SET pass = pass + 1 WHERE app = 'lean'")
            .execute(&pool)
            .await
            .unwrap();
    }
    let (before, vacuums_before) = stats().await;
    assert!(before >= 1000, "only {before} dead rows were made");
    store.sweep(&SweepConfig::default()).await.unwrap();
    // The vacuum runs in the background after the sweep. Whether it can remove the dead
    // rows depends on the oldest snapshot open anywhere on the server (other tests'), so
    // what is asserted is that the table was vacuumed.
    let mut vacuums = vacuums_before;
    for _ in 0..100 {
        vacuums = stats().await.1;
        if vacuums > vacuums_before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        vacuums > vacuums_before,
        "{before} dead rows, and the sweep did not vacuum dispatch_queues"
    );
}

/// docs/locking.md, "Completions in one statement": a lone completion of a metered task
/// without a source, at its only attempt, is moved and settled in one statement (its spend
/// and its token refunds exact); once an endpoint of the app listens for its event, a completion is recorded in
/// its transaction, which writes the event; a batch of several takes the transaction.
#[tokio::test]
async fn metered_completions_are_written_in_one_statement_unless_someone_listens() {
    let Some(url) =
        database_url("metered_completions_are_written_in_one_statement_unless_someone_listens")
    else {
        return;
    };
    let schema = Schema::new(&url, "one_statement");
    let clock = ManualClock::new(START);
    let store = PostgresStore::open(schema.options(&clock)).await.unwrap();
    let w = WorkerId::new("w").unwrap();
    // `together`: the completions in one batch; otherwise each a batch of its own, as
    // at low load.
    let batch = |keys: &'static [&'static str], together: bool| {
        let store = store.clone();
        let w = w.clone();
        async move {
            let mut items = Vec::new();
            for key in keys {
                let mut new = app_task("one_statement", "door", key, None);
                new.claim_by = Some(w.clone());
                let rate = tollgate_core::TokenRate {
                    tokens_per_minute: std::num::NonZeroU32::new(1_000).unwrap(),
                    token_burst: std::num::NonZeroU32::new(1_000).unwrap(),
                };
                new.cost = Some(metered(
                    std::num::NonZeroU64::new(1_000_000_000),
                    Some(rate),
                    (500, 10),
                ));
                let task = store.create_task(new).await.unwrap().task;
                items.push(tollgate_store::Completion {
                    id: task.id,
                    lease: task.lease().unwrap(),
                    output: json!({"label": "spam"}),
                    usage: tollgate_core::Usage::default(),
                    claimed: Some(Arc::new(task)),
                    attempt: None,
                });
            }
            let batches = if together {
                vec![items]
            } else {
                items.into_iter().map(|i| vec![i]).collect()
            };
            for items in batches {
                let answers = store.complete_tasks(items).await.unwrap();
                assert!(answers.iter().all(|a| a.as_ref().unwrap().applied));
            }
        }
    };
    batch(&["a", "b", "c"], false).await;
    assert_eq!(store.completed_in_one_statement(), 3);
    batch(&["x", "y"], true).await;
    assert_eq!(
        store.completed_in_one_statement(),
        3,
        "a batch of several: its transaction"
    );
    let (reserved, settled): (i64, i64) = sqlx::query_as(
        "SELECT CAST(SUM(reserved_nano) AS BIGINT), CAST(SUM(settled_nano) AS BIGINT) \
         FROM scope_spend",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(reserved, 0, "every reservation settled");
    let charged: i64 = sqlx::query_scalar("SELECT CAST(SUM(charged_nano) AS BIGINT) FROM tasks")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(
        settled, charged,
        "the buckets hold what the tasks were charged"
    );
    // The clock stands still: only the refunds of the unused reserved tokens fill the
    // token bucket again.
    let (units, capacity): (i64, i64) =
        sqlx::query_as("SELECT token_units, token_capacity FROM scope_state")
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(
        units, capacity,
        "each task's unused tokens went back to the bucket"
    );

    listen_for_task_succeeded(&store, "whe_a", "one_statement").await;
    batch(&["d"], false).await;
    assert_eq!(
        store.completed_in_one_statement(),
        3,
        "a listener: its transaction"
    );
    let events: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM webhook_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(events, 1, "the listened task's event is written");
}
