//! The background sweeper (docs/conformance.md#sweep-recovery) and start-up recovery (docs/conformance.md#sweep-recovery).
//!
//! Every replica sweeps at `sweeper.interval`: the store expires queued and silent
//! running tasks, repairs lost run wakes, prunes admission records and applies retention,
//! each in bounded batches that skip rows other replicas hold, so replicas never wait on
//! each other. A round that filled a batch is followed by another at once. What a sweep
//! finished or woke is published, so waiters and workflow workers hear about it.

use crate::error::EngineError;
use crate::facade::Tollgate;
use crate::inner::Inner;
use crate::metrics as m;
use crate::notify::Event;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tollgate_core::TaskId;
use tollgate_store::{StoreError, SweepConfig, SweepReport};

impl Tollgate {
    /// Runs the docs/conformance.md#sweeps sweep now, in rounds until nothing is left, and publishes what
    /// finished. The background sweeper does this every `sweeper.interval`.
    pub async fn sweep_now(&self) -> Result<SweepReport, EngineError> {
        Ok(sweep_until_done(&self.inner, None).await?)
    }
}

/// Most rounds of one sweep before yielding until the next tick.
const MAX_ROUNDS: usize = 100;

/// The store's sweep settings from the configuration.
pub(crate) fn sweep_config(inner: &Inner) -> SweepConfig {
    let c = &inner.config.sweeper;
    SweepConfig {
        queue_timeout: c.queue_timeout,
        liveness_timeout: c.liveness_timeout,
        retention: c.retention,
        batch_size: c.batch_size,
    }
}

/// Sweeps in rounds while the store says there is more (at most [`MAX_ROUNDS`]),
/// publishing every finished task and woken run. Returns the rounds' sum.
pub(crate) async fn sweep_until_done(
    inner: &Inner,
    stop: Option<&CancellationToken>,
) -> Result<SweepReport, StoreError> {
    let config = sweep_config(inner);
    let mut total = SweepReport::default();
    for _ in 0..MAX_ROUNDS {
        if stop.is_some_and(CancellationToken::is_cancelled) {
            break;
        }
        let report = inner.store.sweep(&config).await?;
        for id in &report.finished {
            inner.notifier.publish(Event::TaskFinished {
                app: None,
                id: *id,
                status: None,
                task: None,
            });
        }
        // docs/routes.md, "Attempts": a requeued task waits for any replica's worker.
        for (app, id) in &report.requeued {
            inner.notifier.publish(Event::TaskQueued {
                app: app.clone(),
                id: *id,
            });
        }
        if !report.requeued.is_empty() {
            metrics::counter!(m::ATTEMPTS_TOTAL, "outcome" => "interrupted")
                .increment(report.requeued.len() as u64);
        }
        for run in &report.woken_runs {
            inner.notifier.publish(Event::RunWoken {
                app: None,
                id: *run,
            });
        }
        record(&report);
        let more = report.more;
        total.queue_timed_out += report.queue_timed_out;
        total.interrupted += report.interrupted;
        total.canceled += report.canceled;
        total.runs_repaired += report.runs_repaired;
        total.admissions_pruned += report.admissions_pruned;
        total.tasks_deleted += report.tasks_deleted;
        total.finished.extend(report.finished);
        total.requeued.extend(report.requeued);
        total.woken_runs.extend(report.woken_runs);
        total.more = more;
        if !more {
            break;
        }
    }
    Ok(total)
}

fn record(report: &SweepReport) {
    for (item, n) in [
        ("queue_timed_out", report.queue_timed_out),
        ("interrupted", report.interrupted),
        ("canceled", report.canceled),
        ("runs_repaired", report.runs_repaired),
        ("admissions_pruned", report.admissions_pruned),
        ("tasks_deleted", report.tasks_deleted),
        ("requeued", report.requeued.len() as u64),
    ] {
        if n > 0 {
            metrics::counter!(m::SWEEP_ROWS_TOTAL, "item" => item).increment(n);
        }
    }
}

/// Sweeps every `sweeper.interval` until `stop`.
pub(crate) async fn run(inner: Arc<Inner>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(inner.config.sweeper.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        match sweep_until_done(&inner, Some(&stop)).await {
            Ok(report)
                if !report.finished.is_empty()
                    || report.runs_repaired > 0
                    || !report.requeued.is_empty() =>
            {
                tracing::info!(
                    requeued = report.requeued.len(),
                    queue_timed_out = report.queue_timed_out,
                    interrupted = report.interrupted,
                    canceled = report.canceled,
                    runs_repaired = report.runs_repaired,
                    "sweep finished tasks"
                );
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "sweep failed; trying again next interval"),
        }
    }
}

/// docs/conformance.md#sweep-recovery: on start, queued tasks left by any replica are dispatched. The dispatcher
/// claims in batches (`claim_next`, in dispatch order) as soon as it starts and goes on
/// while batches come back full, so recovery only has to wake it when something is
/// queued: one queued task's id, as a hint. (Listing every queued task as hints did the
/// same work slower: a hint is only a wake-up, several at once are served by one
/// batched claim, and paging through a large backlog cost the database a scan per
/// page.)
pub(crate) async fn recover(
    inner: Arc<Inner>,
    hints: mpsc::Sender<TaskId>,
    stop: CancellationToken,
) {
    let mut failures = 0u32;
    while !stop.is_cancelled() {
        match inner.store.first_queued().await {
            Ok(first) => {
                if let Some(id) = first {
                    // A full hint queue already holds wake-ups.
                    let _ = hints.try_send(id);
                    tracing::info!("recovery found queued tasks; the workers claim them");
                }
                return;
            }
            Err(e) if failures < 5 => {
                failures += 1;
                tracing::warn!(error = %e, "recovery cannot list queued tasks; retrying");
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(200) * failures) => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "recovery gave up; polling will find queued tasks");
                return;
            }
        }
    }
}
