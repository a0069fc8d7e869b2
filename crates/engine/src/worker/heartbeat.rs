//! Keeping held tasks alive: one heartbeat per interval for all of them, and stopping
//! the executions of tasks the store or a notification says ended elsewhere.

use super::WorkerPool;
use crate::metrics as m;
use crate::notify::Event;
use std::sync::Arc;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, mpsc};
use tollgate_core::TaskId;

impl WorkerPool {
    /// One heartbeat per interval for every held task; stops the ones the store reports.
    pub(super) async fn heartbeat_loop(self: Arc<Self>) {
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
            let held: Vec<(TaskId, u32)> = self.held().keys().copied().collect();
            if held.is_empty() {
                continue;
            }
            match self.inner.store.heartbeat(&self.worker, &held).await {
                Ok(report) => {
                    let held = self.held();
                    for key in &report.stop {
                        if let Some(token) = held.get(key) {
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
    pub(super) async fn event_loop(
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
                    // Something may be claimable: no door call claims at creation until
                    // the dispatcher has looked (docs/engine.md, "Door calls claimed at
                    // creation").
                    self.set_idle(false);
                    if !self.control.stop_claiming.is_cancelled() {
                        let _ = hints.try_send(id);
                    }
                }
                Ok(Event::TaskFinished { id, .. }) => {
                    // Every execution of the task (a stale one too): it ended.
                    for (_, token) in self.held().iter().filter(|((held, _), _)| *held == id) {
                        token.cancel();
                    }
                }
                // Missed events may have named queued tasks.
                Err(RecvError::Lagged(_)) => self.set_idle(false),
                Ok(Event::RunWoken { .. } | Event::StreamAppended { .. }) => {}
                Err(RecvError::Closed) => return,
            }
        }
    }
}
