//! A [`Store`] that counts what the engine asks of the real one: heartbeat writes (and how
//! long each took), claims and applied completions (with the instant of the last one).
//! It writes [`WorkerStore`] itself (the calls it counts); every other concern is
//! forwarded by `tollgate_store::wrap`, each call timed and, if it may write, counted.

use async_trait::async_trait;
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tollgate_core::{ErrorCode, Task, TaskId, Usage, WorkerId};
use tollgate_store::wrap::{Call, ForwardStore, StoreWrapper};
use tollgate_store::{Completion, HeartbeatReport, Store, StoreResult, Transition, WorkerStore};

/// The counters of a [`CountingStore`].
#[derive(Debug, Default)]
pub struct Counts {
    /// Calls of every method that may write (each one transaction), heartbeats included:
    /// what the engine costs the database in writes, whatever it writes for.
    pub writes: AtomicU64,
    /// `heartbeat` calls (each one write transaction, one statement for all its ids).
    pub heartbeat_calls: AtomicU64,
    /// Task ids carried by those calls.
    pub heartbeat_ids: AtomicU64,
    /// Tasks claimed (`claim_task` that claimed, plus every task `claim_next` returned).
    pub claimed: AtomicU64,
    /// Completions that took effect (`complete_task` or items of `complete_tasks`).
    pub completed: AtomicU64,
    /// Per store method: calls and total time inside them (a timing profile).
    per_method: Mutex<BTreeMap<&'static str, (u64, Duration)>>,
    heartbeat_latency_us: Mutex<Vec<u64>>,
    last_completion: Mutex<Option<Instant>>,
}

impl Counts {
    /// When the last applied completion returned (its transaction had committed).
    pub fn last_completion(&self) -> Option<Instant> {
        *self
            .last_completion
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the latencies of the heartbeat calls recorded so far (microseconds).
    pub fn take_heartbeat_latencies(&self) -> Vec<u64> {
        std::mem::take(
            &mut *self
                .heartbeat_latency_us
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Calls and time spent per store method so far, busiest first.
    pub fn profile(&self) -> Vec<(&'static str, u64, Duration)> {
        let map = self
            .per_method
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut rows: Vec<_> = map.iter().map(|(m, (n, t))| (*m, *n, *t)).collect();
        rows.sort_by_key(|r| std::cmp::Reverse(r.2));
        rows
    }

    /// A counter's value.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::SeqCst)
    }
}

/// Wraps a store and counts; see the module documentation.
#[derive(Clone)]
pub struct CountingStore {
    inner: Arc<dyn Store>,
    counts: Arc<Counts>,
}

impl CountingStore {
    /// Counts the calls made to `inner`.
    pub fn new(inner: Arc<dyn Store>) -> CountingStore {
        CountingStore {
            inner,
            counts: Arc::new(Counts::default()),
        }
    }

    /// The counters.
    pub fn counts(&self) -> &Arc<Counts> {
        &self.counts
    }

    /// Runs one call of the inner store, adding it to the method's profile.
    async fn timed<T>(&self, method: &'static str, call: impl Future<Output = T>) -> T {
        let started = Instant::now();
        let out = call.await;
        let took = started.elapsed();
        let mut map = self
            .counts
            .per_method
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let entry = map.entry(method).or_default();
        entry.0 += 1;
        entry.1 += took;
        out
    }

    /// Counts `applied` completions whose transaction has just committed.
    fn completed(&self, applied: u64) {
        if applied == 0 {
            return;
        }
        let now = Instant::now();
        let mut last = self
            .counts
            .last_completion
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *last = Some(last.map_or(now, |l| l.max(now)));
        self.counts.completed.fetch_add(applied, Ordering::SeqCst);
    }

    /// Counts one call of a method that may write.
    fn wrote(&self) {
        self.counts.writes.fetch_add(1, Ordering::SeqCst);
    }
}

impl std::fmt::Debug for CountingStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountingStore")
            .field("backend", &self.inner.backend())
            .field("counts", &self.counts)
            .finish()
    }
}

impl StoreWrapper for CountingStore {
    fn inner(&self) -> &dyn Store {
        &*self.inner
    }

    /// Every forwarded call is timed; one that may write counts as a write.
    fn around<'a, T: Send + 'a>(&'a self, call: Call, run: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        Box::pin(async move {
            if call.writes {
                self.wrote();
            }
            self.timed(call.method, run).await
        })
    }
}

impl ForwardStore for CountingStore {}

#[async_trait]
impl WorkerStore for CountingStore {
    async fn claim_task(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<Task>> {
        self.wrote();
        let claimed = self
            .timed("claim_task", self.inner.claim_task(id, worker))
            .await?;
        if claimed.is_some() {
            self.counts.claimed.fetch_add(1, Ordering::SeqCst);
        }
        Ok(claimed)
    }

    async fn claim_next(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<Task>> {
        self.wrote();
        let claimed = self
            .timed("claim_next", self.inner.claim_next(worker, limit))
            .await?;
        self.counts
            .claimed
            .fetch_add(claimed.len() as u64, Ordering::SeqCst);
        Ok(claimed)
    }

    async fn heartbeat(
        &self,
        worker: &WorkerId,
        held: &[(TaskId, u32)],
    ) -> StoreResult<HeartbeatReport> {
        self.wrote();
        let started = Instant::now();
        let report = self
            .timed("heartbeat", self.inner.heartbeat(worker, held))
            .await;
        let took = started.elapsed().as_micros() as u64;
        self.counts.heartbeat_calls.fetch_add(1, Ordering::SeqCst);
        self.counts
            .heartbeat_ids
            .fetch_add(held.len() as u64, Ordering::SeqCst);
        self.counts
            .heartbeat_latency_us
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(took);
        report
    }

    async fn complete_task(
        &self,
        id: TaskId,
        lease: &tollgate_core::Lease,
        output: serde_json::Value,
        usage: Usage,
    ) -> StoreResult<Transition> {
        self.wrote();
        let transition = self
            .timed(
                "complete_task",
                self.inner.complete_task(id, lease, output, usage),
            )
            .await?;
        self.completed(u64::from(transition.applied));
        Ok(transition)
    }

    async fn reserve_attempt(
        &self,
        id: TaskId,
        lease: &tollgate_core::Lease,
        attempt: &tollgate_core::Reservation,
    ) -> StoreResult<Option<tollgate_core::Reservation>> {
        let call = self.inner.reserve_attempt(id, lease, attempt);
        self.around(Call::write("reserve_attempt"), call).await
    }

    async fn complete_tasks(
        &self,
        items: Vec<Completion>,
    ) -> StoreResult<Vec<StoreResult<Transition>>> {
        self.wrote();
        let answers = self
            .timed("complete_tasks", self.inner.complete_tasks(items))
            .await?;
        let applied = answers
            .iter()
            .filter(|a| matches!(a, Ok(t) if t.applied))
            .count();
        self.completed(applied as u64);
        Ok(answers)
    }

    async fn fail_task(
        &self,
        id: TaskId,
        lease: Option<&tollgate_core::Lease>,
        code: ErrorCode,
        message: &str,
        usage: Option<&tollgate_core::Usage>,
    ) -> StoreResult<Transition> {
        let call = self.inner.fail_task(id, lease, code, message, usage);
        self.around(Call::write("fail_task"), call).await
    }

    async fn mark_canceled(&self, id: TaskId) -> StoreResult<Transition> {
        let call = self.inner.mark_canceled(id);
        self.around(Call::write("mark_canceled"), call).await
    }

    async fn is_cancellation_requested(&self, id: TaskId) -> StoreResult<bool> {
        let call = self.inner.is_cancellation_requested(id);
        self.around(Call::read("is_cancellation_requested"), call)
            .await
    }
}

/// Listings are not on any benchmarked path: forwarded uncounted.
#[async_trait]
impl tollgate_store::ListStore for CountingStore {
    async fn list_tasks(
        &self,
        app: &tollgate_core::AppId,
        query: &tollgate_store::list::TaskListQuery,
    ) -> StoreResult<tollgate_store::list::ListPage<Task>> {
        self.inner.list_tasks(app, query).await
    }

    async fn list_runs(
        &self,
        app: &tollgate_core::AppId,
        query: &tollgate_store::list::RunListQuery,
    ) -> StoreResult<tollgate_store::list::ListPage<tollgate_store::list::ListedRun>> {
        self.inner.list_runs(app, query).await
    }

    async fn list_pipelines(
        &self,
        app: &tollgate_core::AppId,
        after: Option<&tollgate_store::list::ListCursor>,
        limit: u32,
    ) -> StoreResult<tollgate_store::list::ListPage<tollgate_store::list::PipelineSummary>> {
        self.inner.list_pipelines(app, after, limit).await
    }

    async fn list_scopes(
        &self,
        app: &tollgate_core::AppId,
        after: Option<&tollgate_store::list::ListCursor>,
        limit: u32,
    ) -> StoreResult<tollgate_store::list::ListPage<tollgate_store::list::ScopeSnapshot>> {
        self.inner.list_scopes(app, after, limit).await
    }

    async fn scope_snapshot(
        &self,
        app: &tollgate_core::AppId,
        scope: &tollgate_core::ScopeId,
    ) -> StoreResult<tollgate_store::list::ScopeSnapshot> {
        self.inner.scope_snapshot(app, scope).await
    }

    async fn task_stats(
        &self,
        app: &tollgate_core::AppId,
        since: Option<tollgate_core::Timestamp>,
    ) -> StoreResult<tollgate_store::list::TaskStatsRaw> {
        self.inner.task_stats(app, since).await
    }
}
