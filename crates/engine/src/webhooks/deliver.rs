//! The delivery loop (docs/webhooks.md, "Delivery"): every replica with
//! `[webhooks] concurrency > 0` leases due deliveries from the store (one replica holds a
//! delivery at a time; a dead replica's leases run out and another sends them), sends
//! each in its own task and records how it went. At most `per_app_concurrency` of one
//! app are in flight here, and apps at that limit are left out of the next lease, so a
//! slow or dead endpoint holds only its own app's share, never the others'.

use super::http::Sender;
use crate::inner::Inner;
use crate::metrics as m;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tollgate_core::{AppId, WorkerId};
use tollgate_store::webhooks::{AttemptResult, LeasedDelivery};

/// Delivers until `stop`.
pub(crate) async fn run(inner: Arc<Inner>, stop: CancellationToken) {
    let config = &inner.config.webhooks;
    let sender = match Sender::new(config) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            tracing::error!(error = %e, "webhooks: cannot build the HTTP client; no deliveries from this replica");
            return;
        }
    };
    let worker = match WorkerId::new(format!("webhooks-{}", uuid::Uuid::new_v4().simple())) {
        Ok(w) => w,
        Err(e) => {
            tracing::error!(error = %e, "webhooks: no worker id");
            return;
        }
    };
    let loop_state = Arc::new(Loop {
        inner: inner.clone(),
        sender,
        worker,
        slots: Semaphore::new(config.concurrency as usize),
        in_flight: Mutex::new(HashMap::new()),
        freed: Notify::new(),
    });
    let tasks = TaskTracker::new();
    loop {
        if stop.is_cancelled() {
            break;
        }
        let leased = loop_state.lease_some().await;
        let got = leased.len();
        for delivery in leased {
            let state = loop_state.clone();
            tasks.spawn(async move { state.deliver(delivery).await });
        }
        // A full lease: look again at once (more may be due) once a slot is free.
        let full = got > 0 && loop_state.slots.available_permits() > 0;
        if full {
            continue;
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = loop_state.freed.notified() => {}
            _ = tokio::time::sleep(config.poll_interval) => {}
        }
    }
    tasks.close();
    // In-flight attempts get a moment to record their answer; one still running after
    // it is left to its lease (another replica, or this one restarted, sends it again).
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait()).await;
}

/// How long stopping waits for attempts in flight.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

struct Loop {
    inner: Arc<Inner>,
    sender: Arc<Sender>,
    worker: WorkerId,
    slots: Semaphore,
    in_flight: Mutex<HashMap<AppId, u32>>,
    freed: Notify,
}

impl Loop {
    fn in_flight(&self) -> std::sync::MutexGuard<'_, HashMap<AppId, u32>> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Leases as many due deliveries as there are free slots, leaving out apps at their
    /// limit, and takes a slot and the app's share for each; any beyond an app's free
    /// share are given back at once.
    async fn lease_some(&self) -> Vec<LeasedDelivery> {
        let config = &self.inner.config.webhooks;
        let free = self.slots.available_permits();
        if free == 0 {
            return Vec::new();
        }
        let busy: Vec<AppId> = self
            .in_flight()
            .iter()
            .filter(|(_, n)| **n >= config.per_app_concurrency)
            .map(|(a, _)| a.clone())
            .collect();
        let leased = match self
            .inner
            .store
            .lease_webhook_deliveries(
                &self.worker,
                config.lease,
                u32::try_from(free).unwrap_or(u32::MAX),
                config.per_app_concurrency,
                &busy,
            )
            .await
        {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "webhooks: cannot lease deliveries; trying again");
                return Vec::new();
            }
        };
        let mut taken = Vec::with_capacity(leased.len());
        for delivery in leased {
            let fits = {
                let mut map = self.in_flight();
                let n = map.entry(delivery.delivery.app.clone()).or_default();
                if *n < config.per_app_concurrency
                    && self.slots.try_acquire().is_ok_and(|p| {
                        p.forget();
                        true
                    })
                {
                    *n += 1;
                    true
                } else {
                    false
                }
            };
            if fits {
                taken.push(delivery);
            } else if let Err(e) = self
                .inner
                .store
                .release_webhook_delivery(&delivery.delivery.id, &self.worker)
                .await
            {
                tracing::warn!(error = %e, "webhooks: cannot give a lease back; it runs out");
            }
        }
        taken
    }

    /// Sends one delivery and records the attempt, then frees its slot.
    async fn deliver(&self, delivery: LeasedDelivery) {
        let now_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        let result = self.sender.send(&delivery, now_secs).await;
        let outcome = match &result {
            AttemptResult::Delivered { .. } => "delivered",
            AttemptResult::Failed { .. } => "failed",
        };
        metrics::counter!(m::WEBHOOK_ATTEMPTS_TOTAL, "outcome" => outcome).increment(1);
        if let AttemptResult::Failed { error, .. } = &result {
            tracing::info!(delivery = %delivery.delivery.id, app = %delivery.delivery.app, error = %error, "webhook attempt failed");
        }
        let schedule = self.inner.config.webhooks.retry.schedule();
        if let Err(e) = self
            .inner
            .store
            .record_webhook_attempt(
                &delivery.delivery.id,
                &self.worker,
                result,
                &schedule,
                fastrand::f64(),
            )
            .await
        {
            // The lease runs out and the delivery is sent again: at least once.
            tracing::warn!(error = %e, delivery = %delivery.delivery.id, "webhooks: cannot record an attempt");
        }
        {
            let mut map = self.in_flight();
            if let Some(n) = map.get_mut(&delivery.delivery.app) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    map.remove(&delivery.delivery.app);
                }
            }
        }
        self.slots.add_permits(1);
        self.freed.notify_one();
    }
}
