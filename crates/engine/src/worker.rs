//! The worker pool: claims tasks, runs them on their providers, validates, completes.
//!
//! - **Claiming.** A dispatcher claims a lone hinted task by id (`claim_task`, hints come
//!   from notifications and start-up recovery) and otherwise claims in batches with
//!   `claim_next`, oldest first (several hints at once are served that way too, one
//!   transaction for many tasks), never more than the free execution slots
//!   (`workers.concurrency`). An empty claim
//!   does not prove the queue is empty (`SKIP LOCKED`), so idle workers poll again every
//!   `notifications.poll_interval`. The store's claim is conditional, so a task is
//!   executed by at most one worker at a time, across every replica.
//! - **Heartbeats.** Every `workers.heartbeat_interval` the pool sends ONE heartbeat for
//!   all the tasks it holds. Tasks the store reports to stop (canceled, expired, deleted,
//!   not ours) have their execution dropped at once, which drops the in-flight provider
//!   call (the HTTP connection closes). A notification that a held task finished does
//!   the same without waiting for the next heartbeat.
//! - **Validation.** Every output goes through `tollgate_core::validate_output`. An
//!   invalid one is sent back to the provider with the validation error, at most
//!   `workers.max_output_retries` times; then the task fails with
//!   `invalid_model_output`. A provider failure fails it with `provider_error`.
//! - **Panics.** A panic in an execution is caught and fails its task at once with
//!   `WORKFLOW_AI_INTERRUPTED`; a task is held (and heartbeated) only while its execution
//!   exists, so one whose execution is gone otherwise is ended by the sweeper.
//! - **Completion.** `complete_task` is refused for a task that was canceled or expired
//!   meanwhile; that is fine and changes nothing. Completions that are ready together are
//!   recorded together (`complete_tasks`, group commit; see [`CompletionBatcher`]).
//! - **Shutdown.** Claiming stops at once; executions in flight get until the deadline;
//!   those still running then are failed with `WORKFLOW_AI_INTERRUPTED` (tasks never run
//!   twice), and queued tasks stay queued for any replica.

use crate::cost::{TokenCounter, attempt_input_tokens, output_bound, reask_error};
use crate::cpu;
use crate::driver::Driver;
use crate::error::EngineError;
use crate::facade::Inner;
use crate::metrics as m;
use crate::notify::Event;
use crate::provider::{ProviderCall, ProviderError};
use crate::sweeper;
use futures::FutureExt;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, broadcast, mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_core::{
    ErrorCode, OutputTooLarge, OutputViolation, Reservation, Task, TaskId, TaskRequest, Usage,
    WorkerId, check_output_size, validate_output,
};
use tollgate_store::{Completion, MAX_PAGE, StoreError, Transition};

/// Hints waiting for the dispatcher; when full, new ones are dropped (polling covers).
const HINT_CAPACITY: usize = 4096;
/// Attempts to record a completion while the database is unavailable.
const RECORD_ATTEMPTS: u32 = 4;
/// Most completions recorded in one store call (one transaction on PostgreSQL).
const MAX_COMPLETION_BATCH: usize = 64;
/// How long shutdown waits for interrupted executions to record their end.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// The cancellation tokens that stop the pool's parts, in shutdown order.
#[derive(Debug, Clone, Default)]
struct Control {
    /// The dispatcher and recovery stop claiming.
    stop_claiming: CancellationToken,
    /// Executions still running are dropped and recorded as interrupted.
    interrupt: CancellationToken,
    /// Heartbeats, the event listener and the sweeper stop.
    stop_background: CancellationToken,
    /// Everything stops at once without recording anything (a simulated crash).
    crash: CancellationToken,
}

/// Why an execution ended without an output.
#[derive(Debug)]
struct Failure {
    code: ErrorCode,
    message: String,
    /// SPEC §13: what the attempts used, when every attempt reported it (`None`: unknown,
    /// and a started task is then charged its whole reservation).
    usage: Option<Usage>,
}

impl Failure {
    fn new(code: ErrorCode, message: impl Into<String>) -> Failure {
        Failure {
            code,
            message: message.into(),
            usage: None,
        }
    }

    fn with_usage(mut self, usage: Usage) -> Failure {
        self.usage = Some(usage);
        self
    }
}

/// How an execution ended.
enum Ended {
    Done(Result<(Value, Usage), Failure>),
    /// The store or a notification said to stop (canceled, expired, deleted).
    Stopped,
    /// Shutdown's deadline passed.
    Interrupted,
}

/// Ends a task's holding by this pool when dropped, also by a panic's unwinding: the
/// heartbeat covers only tasks whose execution is alive.
struct HeldUntilDropped {
    pool: Arc<WorkerPool>,
    id: TaskId,
}

impl Drop for HeldUntilDropped {
    fn drop(&mut self) {
        self.pool.held().remove(&self.id);
        metrics::gauge!(m::TASKS_IN_FLIGHT).decrement(1.0);
        self.pool.slot_freed.notify_one();
    }
}

/// The worker pool of one process.
#[derive(Debug)]
pub(crate) struct WorkerPool {
    inner: Arc<Inner>,
    worker: WorkerId,
    held: Mutex<HashMap<TaskId, CancellationToken>>,
    slots: Arc<Semaphore>,
    slot_freed: Notify,
    executions: TaskTracker,
    control: Control,
    completions: CompletionBatcher,
}

/// Where a queued completion's answer goes.
type CompletionAnswer = oneshot::Sender<Result<Transition, StoreError>>;

/// Group commit of completions: executions that finish while a batch is being recorded
/// queue up, and the next one to take the commit lock records the whole queue in one
/// `complete_tasks` call. Nothing waits on purpose: a lone completion is recorded at
/// once, and batches form only while the store is busy — under load, one commit serves
/// many tasks.
#[derive(Debug, Default)]
struct CompletionBatcher {
    queue: Mutex<Vec<(Completion, CompletionAnswer)>>,
    committing: tokio::sync::Mutex<()>,
}

impl WorkerPool {
    /// Starts the dispatcher, heartbeats, the event listener, the sweeper and recovery.
    pub(crate) async fn start(inner: Arc<Inner>) -> Result<EngineHandle, EngineError> {
        let worker = WorkerId::new(format!("worker-{}", uuid::Uuid::new_v4().simple()))?;
        // 0 executions (an API-only replica): this process runs the sweeper, and the
        // pipeline driver when `pipelines.drive_without_workers` says so.
        let concurrency = inner.config.workers.concurrency as usize;
        let pool = Arc::new(WorkerPool {
            inner: inner.clone(),
            worker: worker.clone(),
            held: Mutex::new(HashMap::new()),
            slots: Arc::new(Semaphore::new(concurrency)),
            slot_freed: Notify::new(),
            executions: TaskTracker::new(),
            control: Control::default(),
            completions: CompletionBatcher::default(),
        });
        let (hint_tx, hint_rx) = mpsc::channel(HINT_CAPACITY);
        // Subscribe before recovery lists the queue, so nothing queued meanwhile is missed.
        let events = inner.notifier.subscribe();
        let claiming = TaskTracker::new();
        if concurrency > 0 {
            claiming.spawn(pool.clone().dispatch(hint_rx));
            claiming.spawn(sweeper::recover(
                inner.clone(),
                hint_tx.clone(),
                pool.control.stop_claiming.clone(),
            ));
        }
        // An API-only replica drives runs only when configured to.
        let drives = inner.config.pipelines.concurrency > 0
            && (concurrency > 0 || inner.config.pipelines.drive_without_workers);
        if drives {
            // Stops claiming runs with the workers; a crash drops it mid-drive.
            let driver = Driver::new(inner.clone())?;
            let driver_events = inner.notifier.subscribe();
            let stop = pool.control.stop_claiming.clone();
            let crash = pool.control.crash.clone();
            claiming.spawn(async move {
                tokio::select! {
                    _ = crash.cancelled() => {}
                    _ = driver.run(driver_events, stop) => {}
                }
            });
        }
        claiming.close();
        let background = TaskTracker::new();
        if concurrency > 0 {
            background.spawn(pool.clone().heartbeat_loop());
            background.spawn(pool.clone().event_loop(events, hint_tx));
        }
        let sweeper_stop = pool.control.stop_background.clone();
        let crash = pool.control.crash.clone();
        background.spawn(async move {
            tokio::select! {
                _ = crash.cancelled() => {}
                _ = sweeper::run(inner, sweeper_stop) => {}
            }
        });
        background.close();
        tracing::info!(worker = %worker, concurrency, drives, "workers started");
        Ok(EngineHandle {
            pool,
            claiming,
            background,
        })
    }

    fn held(&self) -> std::sync::MutexGuard<'_, HashMap<TaskId, CancellationToken>> {
        // The map stays consistent even if a holder panicked: recover it.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims tasks while there are free slots; waits for hints, freed slots or the poll
    /// interval otherwise.
    async fn dispatch(self: Arc<Self>, mut hints: mpsc::Receiver<TaskId>) {
        let poll = self.inner.config.notifications.poll_interval;
        let stop = self.control.stop_claiming.clone();
        let crash = self.control.crash.clone();
        let mut pending: VecDeque<TaskId> = VecDeque::new();
        let fair = self.inner.config.dispatch.fairness;
        loop {
            if stop.is_cancelled() || crash.is_cancelled() {
                return;
            }
            while let Ok(id) = hints.try_recv() {
                if pending.len() < HINT_CAPACITY {
                    pending.push_back(id);
                }
            }
            // Free execution slots, and never more held in all (executing plus waiting
            // for their completion's commit) than the concurrency and two completion
            // batches (one committing, the next forming): while completions keep up,
            // claims take every free slot; when they fall behind, claiming waits.
            let held_cap =
                self.inner.config.workers.concurrency as usize + 2 * MAX_COMPLETION_BATCH;
            let free = self
                .slots
                .available_permits()
                .min(held_cap.saturating_sub(self.held().len()));
            if free == 0 {
                tokio::select! {
                    _ = self.slot_freed.notified() => continue,
                    _ = stop.cancelled() => return,
                    _ = crash.cancelled() => return,
                }
            }
            let mut claimed: Vec<(Task, &'static str)> = Vec::new();
            let mut failed = false;
            if pending.len() > 1 || fair {
                // Several hints at once (a batch submit, start-up recovery): one batched
                // `claim_next` below (in dispatch order, any queued task) serves them with
                // one transaction instead of one claim per id. Under SPEC §14 fairness
                // every hint is only a wake-up: claiming a hinted task by id would let it
                // pass the fair order. Hints are only hints.
                pending.clear();
            }
            while claimed.len() < free {
                let Some(id) = pending.pop_front() else { break };
                if self.held().contains_key(&id) {
                    continue;
                }
                match self.inner.store.claim_task(id, &self.worker).await {
                    Ok(Some(task)) => claimed.push((task, "hint")),
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "claim failed");
                        failed = true;
                        break;
                    }
                }
            }
            let mut more = false;
            if !failed && claimed.len() < free {
                let want = (free - claimed.len()).min(MAX_PAGE as usize) as u32;
                match self.inner.store.claim_next(&self.worker, want).await {
                    Ok(tasks) => {
                        more = tasks.len() == want as usize;
                        claimed.extend(tasks.into_iter().map(|t| (t, "poll")));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "claim failed");
                        failed = true;
                    }
                }
            }
            for (task, via) in claimed {
                metrics::counter!(m::CLAIMS_TOTAL, "via" => via).increment(1);
                record_claim(&task);
                // Slots are only taken here, so one is free for every claimed task.
                let permit = match self.slots.clone().acquire_owned().await {
                    Ok(p) => p,
                    Err(_) => return,
                };
                self.executions
                    .spawn(self.clone().run_task(Arc::new(task), permit));
            }
            if !failed && (more || !pending.is_empty()) {
                // Let the executions just started run first: short ones end and free
                // their slots now, so the next claim takes a batch instead of the few
                // slots still free this instant.
                tokio::task::yield_now().await;
                continue;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = crash.cancelled() => return,
                hint = hints.recv() => match hint {
                    Some(id) => pending.push_back(id),
                    None => tokio::time::sleep(poll).await,
                },
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// One execution, from claim to its recorded end. Frees its slot when done.
    async fn run_task(self: Arc<Self>, task: Arc<Task>, permit: OwnedSemaphorePermit) {
        metrics::gauge!(m::TASKS_IN_FLIGHT).increment(1.0);
        // However this ends (a crash, or a panic outside the caught execution), the task
        // is no longer held, so it is no longer heartbeated and the sweeper ends it.
        let _held = HeldUntilDropped {
            pool: self.clone(),
            id: task.id,
        };
        let crash = self.control.crash.clone();
        tokio::select! {
            biased;
            _ = crash.cancelled() => {}
            _ = self.clone().execute_and_record(task, permit) => {}
        }
    }

    /// Runs the task, frees its execution slot as soon as the execution has ended, then
    /// records the end. The slot bounds concurrent executions (provider calls); while a
    /// completion waits for its batch's commit the next task may already run, which is
    /// what lets completions and claims batch under load. The task stays held (and
    /// heartbeated) until its end is recorded.
    async fn execute_and_record(self: Arc<Self>, task: Arc<Task>, permit: OwnedSemaphorePermit) {
        let stop = CancellationToken::new();
        self.held().insert(task.id, stop.clone());
        let started = Instant::now();
        let interrupt = self.control.interrupt.clone();
        // The task's reservation as it grows with each re-ask (docs/budgets.md).
        let mut reservation = task.reservation;
        let ended = tokio::select! {
            biased;
            _ = stop.cancelled() => Ended::Stopped,
            _ = interrupt.cancelled() => Ended::Interrupted,
            // docs/engine.md, "Workers": a panicking execution fails its task at once.
            result = AssertUnwindSafe(self.execute(&task, &mut reservation)).catch_unwind() => match result {
                Ok(result) => Ended::Done(result),
                Err(panic) => {
                    let message = cpu::panic_message(&*panic);
                    tracing::error!(task = %task.id, %message, "the execution panicked");
                    Ended::Done(Err(Failure::new(
                        ErrorCode::Interrupted,
                        format!("the execution panicked: {message}"),
                    )))
                }
            },
        };
        drop(permit);
        self.slot_freed.notify_one();
        let ended = match ended {
            // The task was canceled, deleted or finished before its re-ask was reserved.
            Ended::Done(Err(f)) if f.code == ErrorCode::Canceled => Ended::Stopped,
            other => other,
        };
        let r = reservation.as_ref();
        let (outcome, code) = match ended {
            Ended::Done(Ok((output, usage))) => self.complete(&task, r, output, usage).await,
            Ended::Done(Err(failure)) => {
                tracing::info!(task = %task.id, code = %failure.code, message = %failure.message, "task failed");
                self.fail(&task, r, failure).await
            }
            Ended::Stopped => {
                tracing::info!(task = %task.id, "execution stopped: task canceled, expired or deleted");
                // Acknowledge a requested cancellation (a no-op when already canceled).
                match self.inner.store.mark_canceled(task.id).await {
                    Ok(t) => self.inner.publish_transition(&t),
                    Err(e) => tracing::debug!(error = %e, "mark_canceled failed"),
                }
                ("aborted", "none")
            }
            Ended::Interrupted => {
                let failure = Failure::new(
                    ErrorCode::Interrupted,
                    "the worker shut down before the task finished",
                );
                let (_, code) = self.fail(&task, r, failure).await;
                ("interrupted", code)
            }
        };
        metrics::counter!(m::TASK_OUTCOMES_TOTAL, "outcome" => outcome, "code" => code)
            .increment(1);
        metrics::histogram!(m::TASK_EXECUTION_SECONDS, "kind" => task.kind.as_str())
            .record(started.elapsed().as_secs_f64());
        self.held().remove(&task.id);
    }

    /// Calls the provider, validating and re-asking as configured. Each re-ask is
    /// reserved before it is made (`reservation` grows with it; docs/budgets.md, "The
    /// reservation"); a re-ask that does not fit ends the task with
    /// `WORKFLOW_AI_SPEND_BUDGET`, its spent attempts settled.
    async fn execute(
        &self,
        task: &Task,
        reservation: &mut Option<Reservation>,
    ) -> Result<(Value, Usage), Failure> {
        let request = task.parsed_request().map_err(|e| {
            Failure::new(
                ErrorCode::InvalidRequest,
                format!("the stored request cannot be read: {e}"),
            )
        })?;
        let provider_name = task.model_ref.provider.as_str();
        let provider = self.inner.providers.get(provider_name).ok_or_else(|| {
            Failure::new(
                ErrorCode::ProviderError,
                format!("provider `{provider_name}` is not configured in this process"),
            )
        })?;
        let schema = request.request().output_schema();
        let max_retries = self.inner.config.workers.max_output_retries;
        let max_output_bytes = self.inner.config.max_output_bytes;
        let mut usage = Usage::default();
        let mut previous: Option<String> = None;
        let counter = TokenCounter::for_model_ref(&self.inner.config, &task.model_ref);
        for attempt in 0..=max_retries {
            let call = ProviderCall {
                model: &task.model_ref,
                request: request.request(),
                output_schema: &schema,
                previous_error: previous.as_deref(),
                max_output_bytes,
            };
            if attempt > 0 {
                if let Err(failure) = self.reserve_reask(task, counter, &call, reservation).await {
                    return Err(failure.with_usage(self.priced(task, usage)));
                }
                metrics::counter!(m::OUTPUT_REASKS_TOTAL, "kind" => task.kind.as_str())
                    .increment(1);
            }
            let started = Instant::now();
            let answer = provider.complete(call).await;
            metrics::histogram!(m::PROVIDER_LATENCY_SECONDS, "provider" => provider_name.to_string())
                .record(started.elapsed().as_secs_f64());
            let (output, used, refused) = match answer {
                Ok(a) => (Some(a.output), a.usage, None),
                Err(ProviderError::InvalidOutput { message, usage }) => {
                    (None, usage, Some(reask_error(message)))
                }
                Err(ProviderError::Failed(message)) => {
                    provider_call(provider_name, "error");
                    return Err(Failure::new(ErrorCode::ProviderError, message));
                }
                Err(ProviderError::OutputTooLarge(message)) => {
                    provider_call(provider_name, "too_large");
                    return Err(Failure::new(ErrorCode::OutputTooLarge, message));
                }
            };
            let used = attempt_usage(task, counter, &call, used);
            if let Some(refused) = refused {
                previous = Some(refused);
            }
            add_usage(&mut usage, used, provider_name);
            if let Some(output) = output {
                match check_output(request.request(), output, max_output_bytes).await? {
                    Ok(valid) => {
                        provider_call(provider_name, "ok");
                        return Ok((valid, self.priced(task, usage)));
                    }
                    Err(violation) => previous = Some(reask_error(violation.0)),
                }
            }
            provider_call(provider_name, "invalid_output");
            tracing::debug!(task = %task.id, attempt, error = ?previous, "invalid model output");
        }
        // Every attempt reported its usage: a failed task is charged what it used.
        Err(Failure::new(
            ErrorCode::InvalidModelOutput,
            format!(
                "the model's output was invalid {} time(s); last: {}",
                max_retries + 1,
                previous.unwrap_or_default()
            ),
        )
        .with_usage(self.priced(task, usage)))
    }

    /// docs/budgets.md, "The reservation": reserves the re-ask `call` (its input counted
    /// exactly as it will be sent) before it is made, through the store, with the same
    /// exactness as admission. Tasks without a bounded reservation reserve nothing.
    async fn reserve_reask(
        &self,
        task: &Task,
        counter: TokenCounter,
        call: &ProviderCall<'_>,
        reservation: &mut Option<Reservation>,
    ) -> Result<(), Failure> {
        let Some(current) = reservation.filter(|r| r.bounded) else {
            return Ok(());
        };
        let Some(output) = output_bound(call.model, call.request) else {
            return Ok(());
        };
        let input = attempt_input_tokens(counter, call);
        let attempt = tollgate_core::cost::attempt_reservation(input, output, current.prices);
        let store = &self.inner.store;
        match retry_unavailable(|| store.reserve_attempt(task.id, &self.worker, &attempt)).await {
            Ok(Some(after)) => {
                *reservation = Some(after);
                if attempt.nano_usd > 0 {
                    metrics::counter!(m::SPEND_RESERVED_TOTAL, "app" => task.app.to_string())
                        .increment(attempt.nano_usd as u64);
                }
                Ok(())
            }
            Ok(None) => Err(Failure::new(
                ErrorCode::Canceled,
                "the task was canceled, deleted or finished before its re-ask",
            )),
            Err(StoreError::Cost(c)) => Err(Failure::new(
                ErrorCode::SpendBudget,
                format!("the model's output was invalid and its re-ask does not fit: {c}"),
            )),
            Err(e) => Err(Failure::new(
                ErrorCode::ProviderError,
                format!("cannot reserve the re-ask: {e}"),
            )),
        }
    }

    /// SPEC §13: `cost_usd` of a usage at the task's prices (those it was reserved at, or
    /// the model's for a task that reserved nothing); an unpriced model's is `None`
    /// (unknown, `priced: false`) whatever its provider reported.
    fn priced(&self, task: &Task, mut usage: Usage) -> Usage {
        let prices = task.reservation.and_then(|r| r.prices).or_else(|| {
            self.inner
                .models
                .resolve(Some(&task.model))
                .ok()
                .and_then(|m| m.prices)
        });
        usage.cost_usd = prices.map(|p| tollgate_core::cost::nano_to_usd(p.cost_nano(&usage)));
        usage
    }

    /// SPEC §13 metrics of a recorded end: settled spend, and any overrun (logged by
    /// the store too). `reservation`: the task's, its re-asks included.
    fn count_settlement(
        &self,
        task: &Task,
        reservation: Option<&Reservation>,
        usage: Option<&Usage>,
    ) {
        let Some(r) = reservation else { return };
        let charge = tollgate_core::cost::settle(r, usage, true);
        if charge.nano_usd > 0 {
            metrics::counter!(m::SPEND_SETTLED_TOTAL, m::app_labels(&task.app))
                .increment(charge.nano_usd as u64);
        }
        if charge.overrun_nano > 0 {
            metrics::counter!(m::SPEND_OVERRUN_TOTAL, m::app_labels(&task.app))
                .increment(charge.overrun_nano as u64);
        }
    }

    /// Records a success. Returns the outcome and code labels.
    async fn complete(
        &self,
        task: &Arc<Task>,
        reservation: Option<&Reservation>,
        output: Value,
        usage: Usage,
    ) -> (&'static str, &'static str) {
        let settled = usage;
        let result = self
            .record_completion(Completion {
                id: task.id,
                worker: self.worker.clone(),
                output,
                usage,
                claimed: Some(task.clone()),
            })
            .await;
        match result {
            Ok(t) if t.applied => {
                self.inner.publish_transition(&t);
                self.count_settlement(task, reservation, Some(&settled));
                ("succeeded", "none")
            }
            Ok(_) => {
                tracing::info!(task = %task.id, "completion refused: the task was canceled, expired or deleted meanwhile");
                ("refused", "none")
            }
            Err(StoreError::InvalidOutput(v)) => {
                let failure = Failure::new(ErrorCode::InvalidModelOutput, v.0).with_usage(settled);
                self.fail(task, reservation, failure).await
            }
            Err(e) => {
                tracing::error!(task = %task.id, error = %e, "cannot record the completion; the sweeper will end the task");
                ("unrecorded", "none")
            }
        }
    }

    /// Records one completion through the [`CompletionBatcher`]: queues it, then either
    /// its answer arrives (another execution recorded it) or this execution takes the
    /// commit lock and records everything queued.
    async fn record_completion(&self, completion: Completion) -> Result<Transition, StoreError> {
        let batcher = &self.completions;
        let (tx, mut rx) = oneshot::channel();
        batcher
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((completion, tx));
        loop {
            let guard = tokio::select! {
                biased;
                answer = &mut rx => {
                    return answer.unwrap_or_else(|_| {
                        Err(StoreError::Unavailable("the completion batch was abandoned".into()))
                    });
                }
                guard = batcher.committing.lock() => guard,
            };
            let batch: Vec<_> = {
                let mut queue = batcher.queue.lock().unwrap_or_else(PoisonError::into_inner);
                let n = queue.len().min(MAX_COMPLETION_BATCH);
                queue.drain(..n).collect()
            };
            if batch.is_empty() {
                // Ours was taken by the previous batch: its answer is on the way.
                drop(guard);
                continue;
            }
            let (items, answers): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
            let store = &self.inner.store;
            let recorded = retry_unavailable(|| store.complete_tasks(items.clone())).await;
            match recorded {
                Ok(results) => {
                    for (answer, result) in answers.into_iter().zip(results) {
                        let _ = answer.send(result);
                    }
                }
                Err(e) => {
                    let message = e.to_string();
                    for answer in answers {
                        let _ = answer.send(Err(if e.is_retryable() {
                            StoreError::Unavailable(message.clone())
                        } else {
                            StoreError::Database(message.clone())
                        }));
                    }
                }
            }
            drop(guard);
        }
    }

    /// Records a failure. Returns the outcome and code labels.
    async fn fail(
        &self,
        task: &Task,
        reservation: Option<&Reservation>,
        failure: Failure,
    ) -> (&'static str, &'static str) {
        let store = &self.inner.store;
        let id = task.id;
        let usage = failure.usage.as_ref();
        let result =
            retry_unavailable(|| store.fail_task(id, failure.code, &failure.message, usage)).await;
        match result {
            Ok(t) if t.applied => {
                self.inner.publish_transition(&t);
                self.count_settlement(task, reservation, usage);
                ("failed", failure.code.as_str())
            }
            Ok(_) => ("refused", failure.code.as_str()),
            Err(e) => {
                tracing::error!(task = %id, error = %e, "cannot record the failure; the sweeper will end the task");
                ("unrecorded", failure.code.as_str())
            }
        }
    }

    /// One heartbeat per interval for every held task; stops the ones the store reports.
    async fn heartbeat_loop(self: Arc<Self>) {
        let mut tick = tokio::time::interval(self.inner.config.workers.heartbeat_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let stop = self.control.stop_background.clone();
        let crash = self.control.crash.clone();
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = crash.cancelled() => return,
                _ = tick.tick() => {}
            }
            let ids: Vec<TaskId> = self.held().keys().copied().collect();
            if ids.is_empty() {
                continue;
            }
            match self.inner.store.heartbeat(&self.worker, &ids).await {
                Ok(report) => {
                    let held = self.held();
                    for id in &report.stop {
                        if let Some(token) = held.get(id) {
                            metrics::counter!(m::HEARTBEAT_STOPS_TOTAL).increment(1);
                            token.cancel();
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "heartbeat failed"),
            }
        }
    }

    /// Turns notifications into claim hints, and stops held tasks that finished elsewhere
    /// (canceled by another replica, expired by a sweep).
    async fn event_loop(
        self: Arc<Self>,
        mut events: broadcast::Receiver<Event>,
        hints: mpsc::Sender<TaskId>,
    ) {
        let stop = self.control.stop_background.clone();
        let crash = self.control.crash.clone();
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                _ = crash.cancelled() => return,
                event = events.recv() => event,
            };
            match event {
                Ok(Event::TaskQueued { id, .. }) => {
                    if !self.control.stop_claiming.is_cancelled() {
                        let _ = hints.try_send(id);
                    }
                }
                Ok(Event::TaskFinished { id, .. }) => {
                    if let Some(token) = self.held().get(&id) {
                        token.cancel();
                    }
                }
                Ok(Event::RunWoken { .. }) | Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => return,
            }
        }
    }
}

/// The output limit, then the kind's contract (`validate_output`), off the async runtime
/// unless small (a large output or a complex schema takes real CPU; see `cpu::is_small`). `Err`: the task fails
/// (`output_too_large`); `Ok(Err)`: the output breaks the contract (asked again).
async fn check_output(
    request: &TaskRequest,
    output: Value,
    max_output_bytes: usize,
) -> Result<Result<Value, OutputViolation>, Failure> {
    let checked = if cpu::is_small(request, Some(&output)) {
        cpu::inline(None, |_| checked_output(request, &output, max_output_bytes))
    } else {
        let request = request.clone();
        cpu::run(None, move |_| {
            checked_output(&request, &output, max_output_bytes)
        })
        .await
    };
    let checked = checked.map_err(|panic| {
        Failure::new(
            ErrorCode::ProviderError,
            format!("checking the output failed: {panic}"),
        )
    })?;
    checked.map_err(|e: OutputTooLarge| {
        Failure::new(ErrorCode::OutputTooLarge, format!("the model's {e}"))
    })
}

/// [`check_output`]'s work, wherever it runs.
fn checked_output(
    request: &TaskRequest,
    output: &Value,
    max_output_bytes: usize,
) -> Result<Result<Value, OutputViolation>, OutputTooLarge> {
    check_output_size(output, max_output_bytes)?;
    let valid = validate_output(request, output);
    // The normalized output is what is stored: it must fit too.
    if let Ok(v) = &valid {
        check_output_size(v, max_output_bytes)?;
    }
    Ok(valid)
}

fn provider_call(provider: &str, outcome: &'static str) {
    metrics::counter!(m::PROVIDER_CALLS_TOTAL, "provider" => provider.to_string(), "outcome" => outcome)
        .increment(1);
}

/// docs/budgets.md, "Settlement": what one attempt is counted as. A provider that
/// reported no usage is counted at the attempt's bound (its input as sent, its output
/// bound: never less than could have been billed) and flagged `estimated`; absurd usage
/// is clamped to `MAX_REPORTED_TOKENS` and logged (the excess over the reservation is
/// settled as overrun).
fn attempt_usage(
    task: &Task,
    counter: TokenCounter,
    call: &ProviderCall<'_>,
    used: Usage,
) -> Usage {
    let used = if used.estimated {
        let input = attempt_input_tokens(counter, call);
        let output = output_bound(call.model, call.request).unwrap_or(0);
        tracing::warn!(
            task = %task.id, provider = %call.model.provider, input_tokens = input, output_tokens = output,
            "the provider reported no usage: the attempt is counted at its bound"
        );
        Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: None,
            ..used
        }
    } else {
        used
    };
    let (clamped, absurd) = used.clamped();
    if absurd {
        tracing::warn!(
            task = %task.id, provider = %call.model.provider,
            input_tokens = used.input_tokens, output_tokens = used.output_tokens,
            "the provider reported absurd usage: clamped to {} tokens",
            tollgate_core::MAX_REPORTED_TOKENS
        );
    }
    clamped
}

fn add_usage(total: &mut Usage, used: Usage, provider: &str) {
    total.input_tokens += used.input_tokens;
    total.output_tokens += used.output_tokens;
    total.cost_usd = match (total.cost_usd, used.cost_usd) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    total.cached_input_tokens = match (total.cached_input_tokens, used.cached_input_tokens) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    };
    total.estimated |= used.estimated;
    metrics::counter!(m::PROVIDER_TOKENS_TOTAL, "provider" => provider.to_string(), "direction" => "input")
        .increment(used.input_tokens);
    metrics::counter!(m::PROVIDER_TOKENS_TOTAL, "provider" => provider.to_string(), "direction" => "output")
        .increment(used.output_tokens);
}

/// Retries a store write while the database is unavailable (a few times, backing off).
async fn retry_unavailable<T, F, Fut>(mut write: F) -> Result<T, StoreError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, StoreError>>,
{
    let mut attempt = 0;
    loop {
        match write().await {
            Err(e) if e.is_retryable() && attempt + 1 < RECORD_ATTEMPTS => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(100) * 2u32.pow(attempt)).await;
            }
            other => return other,
        }
    }
}

/// What [`EngineHandle::shutdown`] did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ShutdownReport {
    /// Whether every execution in flight finished before the deadline.
    pub drained: bool,
    /// Executions still running at the deadline, recorded as `WORKFLOW_AI_INTERRUPTED`.
    pub interrupted: usize,
}

/// The running workers and sweeper of one [`Tollgate`](crate::Tollgate). Dropping it
/// without [`shutdown`](Self::shutdown) stops everything abruptly, like
/// [`abandon`](Self::abandon).
#[derive(Debug)]
pub struct EngineHandle {
    pool: Arc<WorkerPool>,
    claiming: TaskTracker,
    background: TaskTracker,
}

impl EngineHandle {
    /// The worker id recorded on the tasks this pool claims.
    pub fn worker_id(&self) -> &WorkerId {
        &self.pool.worker
    }

    /// Tasks this pool is executing now.
    pub fn in_flight(&self) -> Vec<TaskId> {
        self.pool.held().keys().copied().collect()
    }

    /// Graceful stop: claims nothing more at once, lets executions in flight finish
    /// until `deadline`, then records the rest as `WORKFLOW_AI_INTERRUPTED` (tasks never
    /// run twice). Queued tasks stay queued for any replica. Heartbeats continue until
    /// the executions are done, so nothing expires meanwhile.
    pub async fn shutdown(self, deadline: Duration) -> ShutdownReport {
        let control = &self.pool.control;
        control.stop_claiming.cancel();
        self.claiming.wait().await;
        self.pool.executions.close();
        let drained = tokio::time::timeout(deadline, self.pool.executions.wait())
            .await
            .is_ok();
        let interrupted = if drained {
            0
        } else {
            let left = self.pool.held().len();
            control.interrupt.cancel();
            if tokio::time::timeout(INTERRUPT_GRACE, self.pool.executions.wait())
                .await
                .is_err()
            {
                tracing::warn!("interrupted executions did not record their end in time");
            }
            left
        };
        control.stop_background.cancel();
        self.background.wait().await;
        tracing::info!(worker = %self.pool.worker, drained, interrupted, "workers stopped");
        ShutdownReport {
            drained,
            interrupted,
        }
    }

    /// Stops everything at once without recording anything, as if the process had
    /// crashed: executions are dropped mid-call, their tasks stay `running` in the
    /// database until a sweeper (of any replica) fails them with
    /// `WORKFLOW_AI_INTERRUPTED` after the liveness timeout. For tests and drills.
    pub async fn abandon(self) {
        let control = &self.pool.control;
        control.crash.cancel();
        control.stop_claiming.cancel();
        control.stop_background.cancel();
        self.pool.executions.close();
        self.claiming.wait().await;
        self.pool.executions.wait().await;
        self.background.wait().await;
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let control = &self.pool.control;
        control.stop_claiming.cancel();
        control.stop_background.cancel();
        control.crash.cancel();
    }
}

/// SPEC §14 metrics of one claim: the task's wait in the queue and the claim, by app only
/// when the operator opted in (docs/api.md, "Metrics": never by scope).
fn record_claim(task: &Task) {
    if let Some(claimed) = task.claimed_at {
        let waited = (claimed.0 - task.created_at.0).max(0) as f64 / 1000.0;
        metrics::histogram!(m::QUEUE_WAIT_SECONDS, m::app_labels(&task.app)).record(waited);
    }
    metrics::counter!(m::SCOPE_CLAIMS_TOTAL, m::app_labels(&task.app)).increment(1);
}
