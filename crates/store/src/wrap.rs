//! Wrapping a store: a type that holds another [`Store`] implements [`StoreWrapper`],
//! hand-writes the traits whose calls it changes, and opts in to forwarding for the rest
//! with [`ForwardStore`] (task, run, pipeline, maintenance and pace calls) and, when it
//! leaves the worker calls alone too, [`ForwardWorkerStore`]. Every forwarded call passes
//! through [`StoreWrapper::around`] with its [`Call`], so a wrapper that observes every
//! call (timing, counting writes) writes that once.
//!
//! ```ignore
//! impl StoreWrapper for Counting { fn inner(&self) -> &dyn Store { &*self.inner } }
//! impl ForwardStore for Counting {}
//! #[async_trait] impl WorkerStore for Counting { /* the calls it counts */ }
//! ```

use crate::webhooks::{
    AttemptResult, DeliveryQuery, LeasedDelivery, NewWebhookEndpoint, WebhookDelivery,
    WebhookEndpoint, WebhookEndpointPatch,
};
use crate::{
    AttemptEnd, AttemptStore, Completion, Created, EmbeddingEntry, EmbeddingStore, HeartbeatReport,
    MaintenanceStore, PaceSlot, PaceStore, PipelineRef, PipelineStore, RunCancel, RunResult,
    RunStore, SpendWindow, Store, StoreResult, StoredPipeline, StreamChunk, StreamLogStore,
    StreamPosition, SweepConfig, SweepReport, TaskStore, Transition, UnreleasedPage,
    UnreleasedQuery, WaitOutcome, WebhookStore, WorkerStore,
};
use async_trait::async_trait;
use futures::future::BoxFuture;
use std::time::Duration;
use tollgate_core::webhook::{RetrySchedule, WebhookEvent};
use tollgate_core::{
    AppId, EffectKey, ErrorCode, Lease, NewRun, NewTask, PipelineName, Reservation, Run, RunId,
    ScopeId, SourceId, Task, TaskId, Timestamp, Usage, WorkerId,
};

/// One store call as a wrapper sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Call {
    /// The method's name (`"create_task"`).
    pub method: &'static str,
    /// Whether the method may write (runs a write transaction).
    pub writes: bool,
}

impl Call {
    /// A call of a method that only reads.
    pub const fn read(method: &'static str) -> Call {
        Call {
            method,
            writes: false,
        }
    }

    /// A call of a method that may write.
    pub const fn write(method: &'static str) -> Call {
        Call {
            method,
            writes: true,
        }
    }
}

/// A store that wraps another.
pub trait StoreWrapper: Send + Sync + 'static {
    /// The wrapped store, which forwarded calls reach.
    fn inner(&self) -> &dyn Store;

    /// Runs one call of the wrapped store; the default just runs it.
    fn around<'a, T: Send + 'a>(&'a self, call: Call, run: BoxFuture<'a, T>) -> BoxFuture<'a, T> {
        let _ = call;
        run
    }
}

/// Forward [`TaskStore`], [`AttemptStore`], [`EmbeddingStore`], [`StreamLogStore`], [`RunStore`], [`PipelineStore`],
/// [`MaintenanceStore`], [`PaceStore`] and [`WebhookStore`] to [`StoreWrapper::inner`]:
/// every concern but the worker's.
pub trait ForwardStore: StoreWrapper {}
/// Forward [`WorkerStore`] to [`StoreWrapper::inner`] as well.
pub trait ForwardWorkerStore: StoreWrapper {}

/// `self.around(Call::$kind("method"), self.inner().method(args))`.
macro_rules! forward {
    ($self:ident, $kind:ident, $method:ident ( $($arg:expr),* )) => {
        $self
            .around(Call::$kind(stringify!($method)), $self.inner().$method($($arg),*))
            .await
    };
}

#[async_trait]
impl<W: ForwardStore> TaskStore for W {
    async fn create_task(&self, new: NewTask) -> StoreResult<Created> {
        forward!(self, write, create_task(new))
    }
    async fn create_tasks(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>> {
        forward!(self, write, create_tasks(news))
    }
    async fn get_task(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Task>> {
        forward!(self, read, get_task(app, id))
    }
    async fn get_task_by_effect_key(
        &self,
        app: &AppId,
        key: &EffectKey,
    ) -> StoreResult<Option<Task>> {
        forward!(self, read, get_task_by_effect_key(app, key))
    }
    async fn request_cancel(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Transition>> {
        forward!(self, write, request_cancel(app, id))
    }
    async fn release(&self, app: &AppId, scope: &ScopeId, key: &EffectKey) -> StoreResult<bool> {
        forward!(self, write, release(app, scope, key))
    }
    async fn list_unreleased_sources(
        &self,
        app: &AppId,
        query: &UnreleasedQuery,
    ) -> StoreResult<UnreleasedPage> {
        forward!(self, read, list_unreleased_sources(app, query))
    }
    async fn delete_owner_data(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> StoreResult<u64> {
        forward!(self, write, delete_owner_data(app, scope, source))
    }
    async fn spend(&self, app: &AppId, scope: Option<&ScopeId>) -> StoreResult<SpendWindow> {
        forward!(self, read, spend(app, scope))
    }
}

#[async_trait]
impl<W: ForwardStore> EmbeddingStore for W {
    async fn cached_embeddings(
        &self,
        app: &AppId,
        scope: &ScopeId,
        keys: &[String],
    ) -> StoreResult<std::collections::HashMap<String, Vec<f32>>> {
        forward!(self, read, cached_embeddings(app, scope, keys))
    }
    async fn put_embeddings(&self, task: TaskId, entries: &[EmbeddingEntry]) -> StoreResult<u64> {
        forward!(self, write, put_embeddings(task, entries))
    }
    async fn embeddings_of_task(&self, app: &AppId, task: TaskId) -> StoreResult<u64> {
        forward!(self, read, embeddings_of_task(app, task))
    }
}

#[async_trait]
impl<W: ForwardStore> StreamLogStore for W {
    async fn append_stream_chunks(&self, chunks: &[StreamChunk]) -> StoreResult<Vec<bool>> {
        forward!(self, write, append_stream_chunks(chunks))
    }
    async fn stream_chunks(
        &self,
        app: &AppId,
        task: TaskId,
        from: StreamPosition,
        limit: u32,
    ) -> StoreResult<Vec<StreamChunk>> {
        forward!(self, read, stream_chunks(app, task, from, limit))
    }
}

#[async_trait]
impl<W: ForwardStore> AttemptStore for W {
    async fn begin_attempt(
        &self,
        id: TaskId,
        lease: &Lease,
        deployment: &str,
    ) -> StoreResult<Option<u32>> {
        forward!(self, write, begin_attempt(id, lease, deployment))
    }
    async fn redirect_attempt(
        &self,
        id: TaskId,
        lease: &Lease,
        n: u32,
        deployment: &str,
    ) -> StoreResult<bool> {
        forward!(self, write, redirect_attempt(id, lease, n, deployment))
    }
    async fn end_attempt(&self, id: TaskId, n: u32, end: &AttemptEnd) -> StoreResult<bool> {
        forward!(self, write, end_attempt(id, n, end))
    }
    async fn task_attempts(
        &self,
        app: &AppId,
        id: TaskId,
    ) -> StoreResult<Vec<tollgate_core::Attempt>> {
        forward!(self, read, task_attempts(app, id))
    }
    async fn requeue_task(&self, id: TaskId, lease: &Lease, message: &str) -> StoreResult<bool> {
        forward!(self, write, requeue_task(id, lease, message))
    }
}

#[async_trait]
impl<W: ForwardWorkerStore> WorkerStore for W {
    async fn claim_task(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<Task>> {
        forward!(self, write, claim_task(id, worker))
    }
    async fn claim_next(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<Task>> {
        forward!(self, write, claim_next(worker, limit))
    }
    async fn heartbeat(
        &self,
        worker: &WorkerId,
        held: &[(TaskId, u32)],
    ) -> StoreResult<HeartbeatReport> {
        forward!(self, write, heartbeat(worker, held))
    }
    async fn complete_task(
        &self,
        id: TaskId,
        lease: &Lease,
        output: serde_json::Value,
        usage: Usage,
    ) -> StoreResult<Transition> {
        forward!(self, write, complete_task(id, lease, output, usage))
    }
    async fn complete_tasks(
        &self,
        items: Vec<Completion>,
    ) -> StoreResult<Vec<StoreResult<Transition>>> {
        forward!(self, write, complete_tasks(items))
    }
    async fn fail_task(
        &self,
        id: TaskId,
        lease: Option<&Lease>,
        code: ErrorCode,
        message: &str,
        usage: Option<&Usage>,
    ) -> StoreResult<Transition> {
        forward!(self, write, fail_task(id, lease, code, message, usage))
    }
    async fn reserve_attempt(
        &self,
        id: TaskId,
        lease: &Lease,
        attempt: &Reservation,
    ) -> StoreResult<Option<Reservation>> {
        forward!(self, write, reserve_attempt(id, lease, attempt))
    }
    async fn mark_canceled(&self, id: TaskId) -> StoreResult<Transition> {
        forward!(self, write, mark_canceled(id))
    }
    async fn is_cancellation_requested(&self, id: TaskId) -> StoreResult<bool> {
        forward!(self, read, is_cancellation_requested(id))
    }
}

#[async_trait]
impl<W: ForwardStore> RunStore for W {
    async fn create_run(&self, new: NewRun) -> StoreResult<Run> {
        forward!(self, write, create_run(new))
    }
    async fn get_run(&self, app: &AppId, id: RunId) -> StoreResult<Option<Run>> {
        forward!(self, read, get_run(app, id))
    }
    async fn request_run_cancel(&self, app: &AppId, id: RunId) -> StoreResult<Option<RunCancel>> {
        forward!(self, write, request_run_cancel(app, id))
    }
    async fn wait_on_task(
        &self,
        app: &AppId,
        run: RunId,
        task: TaskId,
    ) -> StoreResult<WaitOutcome> {
        forward!(self, write, wait_on_task(app, run, task))
    }
    async fn finish_run(
        &self,
        app: &AppId,
        run: RunId,
        result: RunResult,
    ) -> StoreResult<Option<Run>> {
        forward!(self, write, finish_run(app, run, result))
    }
    async fn run_tasks(&self, app: &AppId, run: RunId) -> StoreResult<Vec<Task>> {
        forward!(self, read, run_tasks(app, run))
    }
}

#[async_trait]
impl<W: ForwardStore> PipelineStore for W {
    async fn put_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: &str,
        definition: &serde_json::Value,
    ) -> StoreResult<(StoredPipeline, bool)> {
        forward!(self, write, put_pipeline(app, name, version, definition))
    }
    async fn get_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: Option<&str>,
    ) -> StoreResult<Option<StoredPipeline>> {
        forward!(self, read, get_pipeline(app, name, version))
    }
    async fn create_pipeline_run(&self, new: NewRun, pipeline: &PipelineRef) -> StoreResult<Run> {
        forward!(self, write, create_pipeline_run(new, pipeline))
    }
    async fn start_pipeline_run_once(
        &self,
        new: NewRun,
        pipeline: &PipelineRef,
        start_key: &EffectKey,
    ) -> StoreResult<(Run, bool)> {
        forward!(
            self,
            write,
            start_pipeline_run_once(new, pipeline, start_key)
        )
    }
    async fn run_pipeline(&self, app: &AppId, run: RunId) -> StoreResult<Option<PipelineRef>> {
        forward!(self, read, run_pipeline(app, run))
    }
    async fn claim_pipeline_runs(
        &self,
        driver: &WorkerId,
        lease: Duration,
        limit: u32,
    ) -> StoreResult<Vec<Run>> {
        forward!(self, write, claim_pipeline_runs(driver, lease, limit))
    }
    async fn release_pipeline_run(
        &self,
        run: RunId,
        driver: &WorkerId,
        wake_at: Option<Timestamp>,
    ) -> StoreResult<bool> {
        forward!(self, write, release_pipeline_run(run, driver, wake_at))
    }
}

#[async_trait]
impl<W: ForwardStore> MaintenanceStore for W {
    fn backend(&self) -> &'static str {
        self.inner().backend()
    }
    async fn ping(&self) -> StoreResult<()> {
        forward!(self, read, ping())
    }
    async fn sweep(&self, config: &SweepConfig) -> StoreResult<SweepReport> {
        forward!(self, write, sweep(config))
    }
    async fn first_queued(&self) -> StoreResult<Option<TaskId>> {
        forward!(self, read, first_queued())
    }
    async fn keep_setting(&self, name: &str, value: &str) -> StoreResult<String> {
        forward!(self, write, keep_setting(name, value))
    }
}

#[async_trait]
impl<W: ForwardStore> PaceStore for W {
    async fn reserve_pace(&self, slots: &[PaceSlot]) -> StoreResult<Duration> {
        forward!(self, write, reserve_pace(slots))
    }
    async fn settle_pace(&self, key: &str, delta_us: i64) -> StoreResult<()> {
        forward!(self, write, settle_pace(key, delta_us))
    }
    async fn pause_pace(&self, key: &str, pause: Duration) -> StoreResult<()> {
        forward!(self, write, pause_pace(key, pause))
    }
    async fn pace_pause_left(&self, keys: &[String]) -> StoreResult<Duration> {
        forward!(self, read, pace_pause_left(keys))
    }
    async fn pace_pauses_left(&self, keys: &[String]) -> StoreResult<Vec<Duration>> {
        forward!(self, read, pace_pauses_left(keys))
    }
}

#[async_trait]
impl<W: ForwardStore> WebhookStore for W {
    async fn create_webhook_endpoint(
        &self,
        new: NewWebhookEndpoint,
    ) -> StoreResult<WebhookEndpoint> {
        forward!(self, write, create_webhook_endpoint(new))
    }
    async fn list_webhook_endpoints(&self, app: &AppId) -> StoreResult<Vec<WebhookEndpoint>> {
        forward!(self, read, list_webhook_endpoints(app))
    }
    async fn get_webhook_endpoint(
        &self,
        app: &AppId,
        id: &str,
    ) -> StoreResult<Option<WebhookEndpoint>> {
        forward!(self, read, get_webhook_endpoint(app, id))
    }
    async fn update_webhook_endpoint(
        &self,
        app: &AppId,
        id: &str,
        patch: WebhookEndpointPatch,
    ) -> StoreResult<Option<WebhookEndpoint>> {
        forward!(self, write, update_webhook_endpoint(app, id, patch))
    }
    async fn delete_webhook_endpoint(&self, app: &AppId, id: &str) -> StoreResult<bool> {
        forward!(self, write, delete_webhook_endpoint(app, id))
    }
    async fn sync_config_webhook_endpoints(
        &self,
        endpoints: Vec<NewWebhookEndpoint>,
    ) -> StoreResult<()> {
        forward!(self, write, sync_config_webhook_endpoints(endpoints))
    }
    async fn list_webhook_events(&self, app: &AppId, limit: u32) -> StoreResult<Vec<WebhookEvent>> {
        forward!(self, read, list_webhook_events(app, limit))
    }
    async fn list_webhook_deliveries(
        &self,
        app: &AppId,
        query: &DeliveryQuery,
    ) -> StoreResult<Vec<WebhookDelivery>> {
        forward!(self, read, list_webhook_deliveries(app, query))
    }
    async fn replay_webhook_delivery(
        &self,
        app: &AppId,
        id: &str,
    ) -> StoreResult<Option<WebhookDelivery>> {
        forward!(self, write, replay_webhook_delivery(app, id))
    }
    async fn lease_webhook_deliveries(
        &self,
        worker: &WorkerId,
        lease: Duration,
        limit: u32,
        per_app: u32,
        skip_apps: &[AppId],
    ) -> StoreResult<Vec<LeasedDelivery>> {
        forward!(
            self,
            write,
            lease_webhook_deliveries(worker, lease, limit, per_app, skip_apps)
        )
    }
    async fn record_webhook_attempt(
        &self,
        id: &str,
        worker: &WorkerId,
        result: AttemptResult,
        schedule: &RetrySchedule,
        random: f64,
    ) -> StoreResult<bool> {
        forward!(
            self,
            write,
            record_webhook_attempt(id, worker, result, schedule, random)
        )
    }
    async fn release_webhook_delivery(&self, id: &str, worker: &WorkerId) -> StoreResult<bool> {
        forward!(self, write, release_webhook_delivery(id, worker))
    }
}
