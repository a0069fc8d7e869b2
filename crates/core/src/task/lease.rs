//! A worker's lease on a task (docs/conformance.md#heartbeat): which worker holds it and
//! by which claim. Every write a worker makes about a task it executes is fenced by its
//! lease: it applies only while the task runs under that worker *and* that claim.

use super::Task;
use crate::ids::WorkerId;

/// A worker's hold on a running task: the worker that claimed it and the number of that
/// claim ([`Task::attempt`] of the claimed copy). A task that went back to the queue
/// (the sweep found it silent, its worker handed it back) and was claimed again — by
/// another worker or by the same one — runs under a later claim, so a stale execution
/// holding the earlier lease changes nothing: its heartbeat, attempts, reservations,
/// hand-back, failure and completion are all refused.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// The worker that claimed the task.
    pub worker: WorkerId,
    /// The claim's number: the task's `attempt` as the claim set it (1 for the first
    /// claim, growing with every later one).
    pub claim: u32,
}

impl Lease {
    /// The lease of `worker` by its claim number `claim`.
    pub fn new(worker: WorkerId, claim: u32) -> Lease {
        Lease { worker, claim }
    }
}

impl Task {
    /// The lease of the worker that claimed this copy (`None` for a task never claimed,
    /// or one back in the queue).
    pub fn lease(&self) -> Option<Lease> {
        self.worker
            .as_ref()
            .filter(|_| self.attempt > 0)
            .map(|w| Lease::new(w.clone(), self.attempt))
    }
}
