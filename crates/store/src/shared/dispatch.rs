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
