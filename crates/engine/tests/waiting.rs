//! Waiting for tasks (docs/api.md, "Waiting"): waiters of one task share one watch, so
//! waiting costs no database read per waiter; each app has a bounded number of waiters;
//! an end nobody announced is still found by the watch's bounded poll.

mod common;

use async_trait::async_trait;
use common::*;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::{AppId, ScopeId, TaskKind, TaskStatus};
use tollgate_core::{Task, Timestamp};
use tollgate_engine::{EngineConfig, EngineError, Submission, Tollgate};
use tollgate_store::Store;
use tollgate_store::list::{
    ListCursor, ListPage, ListedRun, PipelineSummary, RunListQuery, ScopeSnapshot, TaskListQuery,
    TaskStatsRaw,
};
use tollgate_store::wrap::{Call, ForwardStore, ForwardWorkerStore, StoreWrapper};
use tollgate_store::{ListStore, StoreResult};

/// Counts the task reads (`get_task`) of the store it wraps.
struct CountingReads {
    inner: Arc<dyn Store>,
    reads: Arc<AtomicUsize>,
}

impl StoreWrapper for CountingReads {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    fn around<'a, T: Send + 'a>(&'a self, call: Call, run: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        if call.method == "get_task" {
            self.reads.fetch_add(1, Ordering::SeqCst);
        }
        run
    }
}
impl ForwardStore for CountingReads {}
impl ForwardWorkerStore for CountingReads {}

/// Listings are not on any waiting path: forwarded.
#[async_trait]
impl ListStore for CountingReads {
    async fn list_tasks(&self, app: &AppId, query: &TaskListQuery) -> StoreResult<ListPage<Task>> {
        self.inner.list_tasks(app, query).await
    }

    async fn list_runs(
        &self,
        app: &AppId,
        query: &RunListQuery,
    ) -> StoreResult<ListPage<ListedRun>> {
        self.inner.list_runs(app, query).await
    }

    async fn list_pipelines(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<PipelineSummary>> {
        self.inner.list_pipelines(app, after, limit).await
    }

    async fn list_scopes(
        &self,
        app: &AppId,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> StoreResult<ListPage<ScopeSnapshot>> {
        self.inner.list_scopes(app, after, limit).await
    }

    async fn scope_snapshot(&self, app: &AppId, scope: &ScopeId) -> StoreResult<ScopeSnapshot> {
        self.inner.scope_snapshot(app, scope).await
    }

    async fn task_stats(&self, app: &AppId, since: Option<Timestamp>) -> StoreResult<TaskStatsRaw> {
        self.inner.task_stats(app, since).await
    }
}

/// No workers: submitted tasks stay queued until the test ends them.
fn idle_config() -> EngineConfig {
    let mut c = fast_config();
    c.workers.concurrency = 0;
    c
}

async fn counted_engine(db: &TestDb, config: EngineConfig) -> (Tollgate, Arc<AtomicUsize>) {
    let reads = Arc::new(AtomicUsize::new(0));
    let store = CountingReads {
        inner: db.store().await,
        reads: reads.clone(),
    };
    let engine = Tollgate::new(Arc::new(store), config).expect("valid configuration");
    (engine, reads)
}

/// 300 waiters on one queued task for a second cost about one read per poll interval
/// (100 ms), not one per waiter per interval (3,000); a cancel wakes them all at once.
async fn waiters_of_one_task_share_one_watch(db: TestDb) {
    let (engine, reads) = counted_engine(&db, idle_config()).await;
    let task = engine.submit(classify("watched", "x")).await.unwrap().task;
    assert_eq!(task.status, TaskStatus::Queued);
    let mut waiting = Vec::new();
    for _ in 0..300 {
        let (engine, known) = (engine.clone(), task.clone());
        waiting.push(tokio::spawn(async move {
            engine
                .waiter()
                .wait(&app(), known.id, Some(known), Duration::from_secs(20))
                .await
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = reads.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = reads.load(Ordering::SeqCst) - before;
    assert!(
        during <= 25,
        "300 waiters of one task read it {during} times in one second"
    );
    let canceled_at = Instant::now();
    engine.cancel(&app(), task.id).await.unwrap();
    for w in waiting {
        let got = w.await.unwrap().unwrap().expect("the task exists");
        assert_eq!(got.status, TaskStatus::Canceled);
    }
    assert!(
        canceled_at.elapsed() < Duration::from_secs(2),
        "waiters woke {:?} after the cancel",
        canceled_at.elapsed()
    );
}

/// An end this process did not announce (another replica's, without notifications) is
/// found by the watch's poll within a few poll intervals.
async fn an_unannounced_end_is_found_by_the_poll(db: TestDb) {
    let (engine, _) = counted_engine(&db, idle_config()).await;
    let task = engine
        .submit(classify("unannounced", "x"))
        .await
        .unwrap()
        .task;
    let waiter = {
        let (engine, known) = (engine.clone(), task.clone());
        tokio::spawn(async move {
            engine
                .waiter()
                .wait(&app(), known.id, Some(known), Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Another replica, whose notifier carries nothing here.
    let other = db.store().await;
    let started = Instant::now();
    other.request_cancel(&app(), task.id).await.unwrap();
    let got = waiter.await.unwrap().unwrap().expect("the task exists");
    assert_eq!(got.status, TaskStatus::Canceled);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "found after {:?}",
        started.elapsed()
    );
}

/// Beyond `[notifications] waiters_per_app` an app's waiter is refused (nothing else
/// changes); another app still waits; a slot is free again when a waiter ends.
async fn waiters_beyond_the_app_limit_are_refused(db: TestDb) {
    let mut config = idle_config();
    config.notifications.waiters_per_app = 5;
    let (engine, _) = counted_engine(&db, config).await;
    let task = engine.submit(classify("limited", "x")).await.unwrap().task;
    let mut waiting = Vec::new();
    for _ in 0..5 {
        let engine = engine.clone();
        let id = task.id;
        waiting.push(tokio::spawn(async move {
            engine.wait(&app(), id, Duration::from_millis(1500)).await
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while engine.waiters(&app()) < 5 {
        assert!(Instant::now() < deadline, "the waiters never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(engine.watched_tasks(), 1, "five waiters, one watch");
    let refused = engine
        .wait(&app(), task.id, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(
        matches!(refused, EngineError::TooManyWaiters { limit: 5, .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("acme"), "{refused}");
    assert!(engine.waiter_for(&app()).is_err());
    // Another app is not affected.
    let beta = AppId::new("beta").unwrap();
    let theirs = engine
        .submit(Submission::application(
            beta.clone(),
            ScopeId::new("s").unwrap(),
            key("theirs"),
            TaskKind::Classify,
            serde_json::json!({"input": "y", "labels": ["a", "b"]}),
        ))
        .await
        .unwrap()
        .task;
    let got = engine
        .wait(&beta, theirs.id, Duration::from_millis(200))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.status, TaskStatus::Queued);
    for w in waiting {
        let got = w.await.unwrap().unwrap().unwrap();
        assert_eq!(got.status, TaskStatus::Queued, "timed out as it was");
    }
    assert_eq!(engine.waiters(&app()), 0);
    assert_eq!(engine.watched_tasks(), 0, "a watch nobody waits on is gone");
    let got = engine
        .wait(&app(), task.id, Duration::from_millis(100))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.id, task.id);
}

on_both_backends!(
    waiters_of_one_task_share_one_watch,
    an_unannounced_end_is_found_by_the_poll,
    waiters_beyond_the_app_limit_are_refused,
);

#[test]
fn a_zero_waiter_limit_is_refused() {
    let mut config = EngineConfig::default();
    config.notifications.waiters_per_app = 0;
    let err = config.validate().unwrap_err();
    assert!(
        err.to_string().contains("notifications.waiters_per_app"),
        "{err}"
    );
}
