//! Claiming (see the [module docs](super)): hints claimed by id when alone, batches
//! claimed with `claim_next` otherwise, never more than the free execution slots; each
//! claimed task is spawned as one execution.

use super::{HeldUntilDropped, MAX_COMPLETION_BATCH, WorkerPool};
use crate::metrics as m;
use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tollgate_core::{Task, TaskId};
use tollgate_store::MAX_PAGE;

/// Hints waiting for the dispatcher; when full, new ones are dropped (polling covers).
pub(super) const HINT_CAPACITY: usize = 4096;

/// How soon a claim that missed a hinted task looks again (once): the task is committed
/// (hints are sent after the commit), so a claim that skipped it met a row lock held for
/// a moment by another statement (`SKIP LOCKED` on PostgreSQL), not an empty queue.
const HINT_RECHECK: Duration = Duration::from_millis(5);

impl WorkerPool {
    /// Claims tasks while there are free slots; waits for hints, freed slots or the poll
    /// interval otherwise.
    pub(super) async fn dispatch(self: Arc<Self>, mut hints: mpsc::Receiver<TaskId>) {
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
            // The tasks this round was woken for: each should be claimed by it (or held
            // already), unless another replica took it first.
            let hinted: HashSet<TaskId> = pending.iter().copied().collect();
            if pending.len() > 1 || fair {
                // Several hints at once (a batch submit, start-up recovery): one batched
                // `claim_next` below (in dispatch order, any queued task) serves them with
                // one transaction instead of one claim per id. Under docs/conformance.md#fair-share fairness
                // every hint is only a wake-up: claiming a hinted task by id would let it
                // pass the fair order. Hints are only hints.
                pending.clear();
            }
            while claimed.len() < free {
                let Some(id) = pending.pop_front() else { break };
                if self.holds(id) {
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
            // A hinted task neither claimed nor held was skipped, not absent: look again
            // soon rather than after the poll interval (once: a task another replica
            // claimed would otherwise be looked for again and again).
            // Then the idle wait below is cut short by one more look (HINT_RECHECK).
            let recheck = !failed
                && !hinted.is_empty()
                && claimed.len() < free
                && hinted
                    .iter()
                    .any(|id| !claimed.iter().any(|(t, _)| t.id == *id) && !self.holds(*id));
            if recheck {
                tracing::debug!("a hinted task was not claimable: looking again soon");
            }
            // Nothing more to claim (as far as this claim saw) and no hint waiting: a door
            // call may now be created claimed (docs/engine.md, "Door calls claimed at
            // creation"). A claim that filled every slot, failed or left hints says not.
            self.set_idle(!failed && claimed.len() < free && pending.is_empty());
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
            let wait = if recheck { HINT_RECHECK } else { poll };
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = crash.cancelled() => return,
                hint = hints.recv() => match hint {
                    Some(id) => pending.push_back(id),
                    None => tokio::time::sleep(wait).await,
                },
                _ = tokio::time::sleep(wait) => {}
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
            key: (task.id, task.attempt),
        };
        let crash = self.control.crash.clone();
        // docs/telemetry.md, "Logs": the worker's lines about the task carry its trace id.
        let log = crate::telemetry::task_log_span(&task);
        tokio::select! {
            biased;
            _ = crash.cancelled() => {}
            _ = tracing::Instrument::instrument(self.clone().execute_and_record(task, permit), log) => {}
        }
    }
}

/// docs/conformance.md#fair-share metrics of one claim: the task's wait in the queue and the claim, by app only
/// when the operator opted in (docs/api.md, "Metrics": never by scope).
fn record_claim(task: &Task) {
    if let Some(claimed) = task.claimed_at {
        let waited = (claimed.0 - task.created_at.0).max(0) as f64 / 1000.0;
        metrics::histogram!(m::QUEUE_WAIT_SECONDS, m::app_labels(&task.app)).record(waited);
    }
    metrics::counter!(m::SCOPE_CLAIMS_TOTAL, m::app_labels(&task.app)).increment(1);
}

impl WorkerPool {
    /// Whether the dispatcher found nothing more to claim ([`WorkerPool::direct_slot`]).
    pub(super) fn set_idle(&self, idle: bool) {
        self.idle.store(idle, std::sync::atomic::Ordering::SeqCst);
    }

    /// An execution slot for a task created already claimed by this pool's worker
    /// (docs/engine.md, "Tasks claimed at creation"): only while the dispatcher is
    /// idle (its last claim found nothing more, no hint since), so such a task passes no
    /// queued task of the fair order, and only with a slot free and the held executions
    /// under the dispatcher's own cap. `None`: the call's task goes through the queue.
    pub(crate) fn direct_slot(self: &Arc<Self>) -> Option<DirectSlot> {
        if self.control.stop_claiming.is_cancelled()
            || self.control.crash.is_cancelled()
            || !self.idle.load(std::sync::atomic::Ordering::SeqCst)
        {
            return None;
        }
        let held_cap = self.inner.config.workers.concurrency as usize + 2 * MAX_COMPLETION_BATCH;
        if self.held().len() >= held_cap {
            return None;
        }
        let permit = self.slots.clone().try_acquire_owned().ok()?;
        Some(DirectSlot {
            pool: self.clone(),
            permit: Some(permit),
        })
    }
}

/// A free execution slot of a [`WorkerPool`], taken for one task created claimed by its
/// worker ([`WorkerPool::direct_slot`]). Given back (and the dispatcher told) when
/// dropped unused: the creation was a replay, a cache hit, refused or failed.
#[derive(Debug)]
pub(crate) struct DirectSlot {
    pool: Arc<WorkerPool>,
    permit: Option<OwnedSemaphorePermit>,
}

impl DirectSlot {
    /// The worker a task created with this slot is claimed by.
    pub(crate) fn worker(&self) -> &tollgate_core::WorkerId {
        &self.pool.worker
    }

    /// Starts the execution of `task`, which its creation claimed for this slot's worker
    /// (running, by this worker); any other task leaves the slot unused.
    pub(crate) fn start(mut self, task: &Task) {
        if task.status != tollgate_core::TaskStatus::Running
            || task.worker.as_ref() != Some(&self.pool.worker)
        {
            return;
        }
        let Some(permit) = self.permit.take() else {
            return;
        };
        metrics::counter!(m::CLAIMS_TOTAL, "via" => "creation").increment(1);
        record_claim(task);
        let pool = self.pool.clone();
        pool.executions
            .spawn(pool.clone().run_task(Arc::new(task.clone()), permit));
    }
}

impl Drop for DirectSlot {
    fn drop(&mut self) {
        if self.permit.take().is_some() {
            // The dispatcher may be waiting for a slot while this one was taken.
            self.pool.slot_freed.notify_one();
        }
    }
}
