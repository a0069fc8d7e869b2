//! docs/conformance.md#fair-share on PostgreSQL: the queues a fair claim found empty are
//! deactivated after the claim has returned its tasks, in one batch per store instance.
//!
//! A claim hands the queues that gave it nothing to [`PostgresStore::deactivate_later`]
//! and returns at once; a background task of the instance deactivates, in one short
//! transaction, those still without a queued task, pays the pass debt of the instance's
//! claims in the same transaction, and drops the deactivated queues from the view. At
//! most one batch of an instance runs at a time: candidates handed over meanwhile go
//! into its next batch. The instance's next read of the queues and its creations wait
//! for a batch in flight ([`Deactivation::settled`]), so an instance never reads (or
//! creates against) a view the batch is about to change, and only one writer of the
//! instance's pass debt runs at a time ([`Deactivation::writer`]). With a view that has
//! no period ([`QueueView::writes_through`], for tests) the batch runs inline, before
//! the claim returns.
//!
//! Correctness: a queue with a queued task is never left inactive. The batch locks the
//! candidates' rows first (`FOR NO KEY UPDATE SKIP LOCKED`, in (app, scope) order): a
//! creation in flight holds its queue's row to its commit, so its queue is skipped; a
//! creation after the lock waits for the batch's commit and activates the queue again.
//! Only then, in a statement with a fresh snapshot (READ COMMITTED), does it look for
//! queued tasks. A batch that fails changes nothing: a queue left active is checked
//! again the next time it gives a claim nothing, and the debt stays owed.

use super::PostgresStore;
use crate::StoreResult;
use crate::shared::dispatch::{EmptyQueues, QueueView};
use std::collections::BTreeSet;

/// A store instance's deactivation batches (see the module docs).
#[derive(Debug, Default)]
pub(super) struct Deactivation {
    pending: std::sync::Mutex<Pending>,
    /// Woken when a batch run ends.
    settled: tokio::sync::Notify,
    /// Held by whoever writes the instance's pass debt or deactivates its queues (a
    /// batch, or a payment before a read or a creation), so a debt is never paid twice.
    pub(super) writer: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default)]
struct Pending {
    /// Candidates for the next batch, in (app, scope) order.
    queues: BTreeSet<(String, String)>,
    /// Whether a batch run is in flight (from hand-over to its last batch's end).
    running: bool,
}

impl Deactivation {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits until no batch of this instance is in flight (at once when none is).
    pub(super) async fn settled(&self) {
        loop {
            let notified = self.settled.notified();
            tokio::pin!(notified);
            // Registered before the check, so an end between the two is not missed.
            notified.as_mut().enable();
            if !self.lock().running {
                return;
            }
            notified.await;
        }
    }

    /// Ends a batch run: no longer in flight, waiters woken.
    fn end_run(&self) {
        self.lock().running = false;
        self.settled.notify_waiters();
    }
}

/// Ends the run however its task ends (a panic or a dropped runtime too), unless the
/// run ended itself.
struct RunGuard<'a> {
    deactivation: &'a Deactivation,
    armed: bool,
}

impl Drop for RunGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.deactivation.end_run();
        }
    }
}

impl PostgresStore {
    /// Hands the queues that gave a claim nothing to this instance's background batch
    /// (started when none is in flight) and returns at once.
    pub(super) fn deactivate_later(&self, queues: EmptyQueues) {
        {
            let mut pending = self.deactivation.lock();
            pending.queues.extend(queues);
            if pending.running {
                return;
            }
            pending.running = true;
        }
        let store = self.clone();
        tokio::spawn(async move {
            let deactivation = &store.deactivation;
            let mut guard = RunGuard {
                deactivation,
                armed: true,
            };
            loop {
                let batch: EmptyQueues = {
                    let mut pending = deactivation.lock();
                    if pending.queues.is_empty() {
                        // Ended under the same lock that a hand-over checks.
                        pending.running = false;
                        break;
                    }
                    std::mem::take(&mut pending.queues).into_iter().collect()
                };
                if let Err(e) = deactivate_empty(&store, &batch).await {
                    tracing::warn!(
                        error = %e,
                        queues = batch.len(),
                        "deactivating empty queues failed (they stay active and are checked again)"
                    );
                }
            }
            guard.armed = false;
            deactivation.settled.notify_waiters();
        });
    }
}

/// One batch: in one transaction, pays the instance's pass debt, locks the candidates'
/// rows (skipping rows others hold), deactivates those with no queued task (a fresh
/// snapshot, after the locks), then drops from the view the queues it left inactive.
pub(super) async fn deactivate_empty(
    store: &PostgresStore,
    queues: &EmptyQueues,
) -> StoreResult<()> {
    let view: &QueueView = &store.queue_view;
    let _writer = store.deactivation.writer.lock().await;
    let mut tx = store.begin().await?;
    let debt = view.debt();
    let paid = if debt.is_empty() {
        Vec::new()
    } else {
        super::dispatch::write_pass_debt(&mut *tx, &debt).await?
    };
    let apps: Vec<&str> = queues.iter().map(|q| q.0.as_str()).collect();
    let scopes: Vec<&str> = queues.iter().map(|q| q.1.as_str()).collect();
    let locked: Vec<(String, String, bool)> = sqlx::query_as(
        "SELECT d.app, d.scope, d.active FROM dispatch_queues d \
         JOIN UNNEST($1::TEXT[], $2::TEXT[]) AS c(app, scope) \
           ON d.app = c.app AND d.scope = c.scope \
         ORDER BY d.app, d.scope FOR NO KEY UPDATE OF d SKIP LOCKED",
    )
    .bind(&apps)
    .bind(&scopes)
    .fetch_all(&mut *tx)
    .await?;
    let mut inactive: Vec<(String, String)> = Vec::new();
    let (mut apps, mut scopes): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
    for (app, scope, active) in &locked {
        if *active {
            apps.push(app);
            scopes.push(scope);
        } else {
            inactive.push((app.clone(), scope.clone()));
        }
    }
    if !apps.is_empty() {
        // A statement of its own: its snapshot is taken after the locks, so it sees the
        // task of every creation that held one of these rows.
        let gone: Vec<(String, String)> = sqlx::query_as(
            "UPDATE dispatch_queues d SET active = FALSE \
             FROM UNNEST($1::TEXT[], $2::TEXT[]) AS c(app, scope) \
             WHERE d.app = c.app AND d.scope = c.scope AND d.active \
             AND NOT EXISTS (SELECT 1 FROM tasks t WHERE t.app = d.app AND t.scope = d.scope \
               AND t.status = 'queued') \
             RETURNING d.app, d.scope",
        )
        .bind(&apps)
        .bind(&scopes)
        .fetch_all(&mut *tx)
        .await?;
        inactive.extend(gone);
    }
    tx.commit().await?;
    view.paid(&paid);
    for (app, scope) in &inactive {
        view.forget(app, scope);
    }
    Ok(())
}
