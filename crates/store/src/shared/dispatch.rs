//! SPEC §14 fair claiming, the dialect-free part both backends call: the queue rows a
//! claim reads and the plan of how many tasks to take from each (core's stride
//! schedule), and how far each queue's virtual time then moves.

use tollgate_core::{QueueShare, Weight, allocate_claims, stride};

/// An active (app, scope) queue as a claim reads it.
#[derive(sqlx::FromRow, Debug, Clone)]
pub(crate) struct QueueRow {
    pub(crate) app: String,
    pub(crate) scope: String,
    pub(crate) weight: i64,
    pub(crate) pass: i64,
}

impl QueueRow {
    fn weight(&self) -> Weight {
        // Rows are written from a checked weight; a corrupt one counts as the default.
        Weight::new(self.weight).unwrap_or_default()
    }

    /// How far the queue's pass moves for `claimed` tasks.
    pub(crate) fn advance(&self, claimed: u32) -> i64 {
        stride(self.weight()).saturating_mul(i64::from(claimed))
    }
}

/// One queue's share of a claim.
#[derive(Debug, Clone)]
pub(crate) struct QueueTake {
    pub(crate) queue: QueueRow,
    pub(crate) take: u32,
}

/// SPEC §14: splits `n` claim slots across the queues (least virtual time first) by the
/// stride schedule; queues that get nothing are left out.
pub(crate) fn plan_claim(queues: Vec<QueueRow>, n: u32) -> Vec<QueueTake> {
    let shares: Vec<QueueShare> = queues
        .iter()
        .map(|q| QueueShare {
            pass: q.pass,
            weight: q.weight(),
        })
        .collect();
    let takes = allocate_claims(&shares, n);
    queues
        .into_iter()
        .zip(takes)
        .filter(|(_, take)| *take > 0)
        .map(|(queue, take)| QueueTake { queue, take })
        .collect()
}

/// How long a store instance reuses its last read of the active queues (SPEC §14).
/// Within it, a claim is one statement instead of two; the view is moved by this
/// instance's own claims, dropped by its own creations and whenever a claim comes up
/// short, so it only misses other replicas' claims and new queues for this long.
pub(crate) const QUEUE_VIEW_TTL: std::time::Duration = std::time::Duration::from_millis(50);

/// A store instance's recent view of the active queues (see [`QUEUE_VIEW_TTL`]).
#[derive(Debug, Default)]
pub(crate) struct QueueView {
    seen: std::sync::Mutex<Option<(std::time::Instant, Vec<QueueRow>)>>,
}

impl QueueView {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<(std::time::Instant, Vec<QueueRow>)>> {
        self.seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The least-pass queues of a view younger than the TTL, in claim order.
    pub(crate) fn fresh(&self, n: usize) -> Option<Vec<QueueRow>> {
        let seen = self.lock();
        let (at, rows) = seen.as_ref()?;
        if at.elapsed() > QUEUE_VIEW_TTL || rows.is_empty() {
            return None;
        }
        let mut rows = rows.clone();
        rows.sort_by(|a, b| (a.pass, &a.app, &a.scope).cmp(&(b.pass, &b.app, &b.scope)));
        rows.truncate(n);
        Some(rows)
    }

    /// Keeps a fresh read.
    pub(crate) fn keep(&self, rows: &[QueueRow]) {
        *self.lock() = Some((std::time::Instant::now(), rows.to_vec()));
    }

    /// Moves a queue's pass as this instance's claim moved it in the database.
    pub(crate) fn advance(&self, app: &str, scope: &str, by: i64) {
        if let Some((_, rows)) = self.lock().as_mut()
            && let Some(q) = rows.iter_mut().find(|q| q.app == app && q.scope == scope)
        {
            q.pass = q.pass.saturating_add(by);
        }
    }

    /// Forgets the view (a creation, or a claim that came up short).
    pub(crate) fn clear(&self) {
        *self.lock() = None;
    }
}
