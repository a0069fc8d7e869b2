//! CPU-heavy work (building a `dev` output, validating or parsing a large output) runs
//! here, never on the async runtime's threads: on tokio's blocking pool, at most one job
//! per core at once, so the runtime keeps answering HTTP, heartbeats and signals
//! whatever the jobs do.
//!
//! A job gets a [`Halt`] to check in its loops: it says stop once the job's caller is
//! gone (the future was dropped: the task was canceled, interrupted at shutdown, or the
//! process is stopping) or its time limit has passed. Nothing waits for a job at
//! shutdown: its future is dropped and the job stops at its next check.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

/// One permit per core: CPU jobs never oversubscribe the machine.
static SLOTS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    Arc::new(Semaphore::new(cores.max(1)))
});

/// Why a job should stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// Nobody waits for the result any more.
    Abandoned,
    /// The job's time limit passed.
    TimedOut,
}

/// What a job checks to know it should stop.
#[derive(Debug, Clone)]
pub(crate) struct Halt {
    abandoned: Arc<AtomicBool>,
    deadline: Option<Instant>,
}

impl Halt {
    /// A halt that never says stop (for synchronous callers).
    pub(crate) fn never() -> Halt {
        Halt {
            abandoned: Arc::new(AtomicBool::new(false)),
            deadline: None,
        }
    }

    /// `Some` once the job should stop.
    pub(crate) fn check(&self) -> Option<Stop> {
        if self.abandoned.load(Ordering::Relaxed) {
            return Some(Stop::Abandoned);
        }
        match self.deadline {
            Some(d) if Instant::now() >= d => Some(Stop::TimedOut),
            _ => None,
        }
    }
}

/// Sets the flag when the caller's future goes away (or the job is done).
struct AbandonOnDrop(Arc<AtomicBool>);

impl Drop for AbandonOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs `job` on the blocking pool (waiting for a free core first) and returns its
/// result. The time limit starts when the job starts. Dropping the returned future tells
/// the job to stop; nothing waits for it. `Err` carries a panic's message.
pub(crate) async fn run<T, F>(time_limit: Option<Duration>, job: F) -> Result<T, String>
where
    T: Send + 'static,
    F: FnOnce(&Halt) -> T + Send + 'static,
{
    let abandoned = Arc::new(AtomicBool::new(false));
    let _abandon = AbandonOnDrop(abandoned.clone());
    let permit = SLOTS
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| "the CPU pool is closed".to_string())?;
    let handle = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let halt = Halt {
            abandoned,
            deadline: time_limit.map(|t| Instant::now() + t),
        };
        job(&halt)
    });
    handle.await.map_err(|e| match e.try_into_panic() {
        Ok(panic) => panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a CPU job panicked".to_string()),
        Err(e) => format!("a CPU job did not finish: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_caller_stops_the_job() {
        let (tx, rx) = std::sync::mpsc::channel();
        let job = run(None, move |halt| {
            while halt.check().is_none() {
                std::thread::sleep(Duration::from_millis(1));
            }
            let _ = tx.send(halt.check());
        });
        // The job spins until its caller goes away.
        let _ = tokio::time::timeout(Duration::from_millis(100), job).await;
        let stopped = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(20)))
            .await
            .unwrap();
        assert_eq!(stopped, Ok(Some(Stop::Abandoned)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_time_limit_stops_the_job() {
        let stop = run(Some(Duration::from_millis(50)), |halt| {
            loop {
                if let Some(stop) = halt.check() {
                    return stop;
                }
                std::hint::spin_loop();
            }
        })
        .await;
        assert_eq!(stop, Ok(Stop::TimedOut));
    }
}
