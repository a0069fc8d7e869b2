//! CPU-heavy work (building a `dev` output, validating or parsing a large output) runs
//! here, never on the async runtime's threads: on tokio's blocking pool, at most one job
//! per core at once, so the runtime keeps answering HTTP, heartbeats and signals
//! whatever the jobs do.
//!
//! A small job ([`is_small`]: not `extract_data`, whose caller-given schema can make any
//! output expensive, and at most [`INLINE_BYTES`] of request and output) runs on the
//! calling thread instead ([`inline`]): it takes microseconds, less than
//! handing it to another thread and waking the caller again.
//!
//! A job gets a [`Halt`] to check in its loops: it says stop once the job's caller is
//! gone (the future was dropped: the task was canceled, interrupted at shutdown, or the
//! process is stopping) or its time limit has passed. Nothing waits for a job at
//! shutdown: its future is dropped and the job stops at its next check.

use serde_json::Value;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tollgate_core::{TaskKind, TaskRequest, check_output_size};

/// Bytes of JSON (request and output together) up to which a job on a task runs on the
/// calling thread.
pub(crate) const INLINE_BYTES: usize = 16 * 1024;

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

/// Whether a job over this request (and output) is small enough to run inline: not
/// `extract_data` nor a `chat` offering tools (both build instances of a caller's schema),
/// and at most [`INLINE_BYTES`] of JSON in all (measuring stops there).
pub(crate) fn is_small(request: &TaskRequest, output: Option<&Value>) -> bool {
    if request.kind() == TaskKind::ExtractData {
        return false;
    }
    if let TaskRequest::Chat(chat) = request
        && chat.tools.is_some()
    {
        return false;
    }
    let Some(used) = request.size_within(INLINE_BYTES) else {
        return false;
    };
    output.is_none_or(|o| check_output_size(o, INLINE_BYTES - used).is_ok())
}

/// A small job (see [`is_small`]) at once on the calling thread, with [`run`]'s answers
/// (its time limit applies, `Err` carries a panic's message). It borrows what it needs:
/// nothing is copied for another thread.
pub(crate) fn inline<T>(
    time_limit: Option<Duration>,
    job: impl FnOnce(&Halt) -> T,
) -> Result<T, String> {
    let halt = Halt {
        abandoned: Arc::new(AtomicBool::new(false)),
        deadline: time_limit.map(|t| Instant::now() + t),
    };
    catch_unwind(AssertUnwindSafe(|| job(&halt))).map_err(|panic| panic_message(&*panic))
}

/// A panic's message, as [`run`] reports it.
/// A panic payload's message.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
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
        Ok(panic) => panic_message(&*panic),
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
    async fn a_small_job_runs_on_the_calling_thread_with_the_same_answers() {
        let caller = std::thread::current().id();
        let ran_on = inline(None, |_| std::thread::current().id());
        assert_eq!(ran_on, Ok(caller));
        let elsewhere = run(None, |_| std::thread::current().id()).await;
        assert_ne!(elsewhere, Ok(caller));
        let panicked = inline(None, |_| -> () { panic!("boom") });
        assert_eq!(panicked, Err("boom".to_string()));
        let limit = inline(Some(Duration::ZERO), |halt| halt.check());
        assert_eq!(limit, Ok(Some(Stop::TimedOut)));
    }

    #[test]
    fn only_small_requests_and_outputs_of_the_fixed_kinds_are_small() {
        let classify = TaskRequest::parse(
            TaskKind::Classify,
            &serde_json::json!({"input": "hi", "labels": ["a", "b"]}),
        )
        .unwrap();
        assert!(is_small(&classify, None));
        assert!(is_small(
            &classify,
            Some(&serde_json::json!({"label": "a"}))
        ));
        let big = serde_json::json!({"text": "x".repeat(INLINE_BYTES)});
        assert!(!is_small(&classify, Some(&big)));
        let long = TaskRequest::parse(
            TaskKind::GenerateText,
            &serde_json::json!({"prompt": "y".repeat(INLINE_BYTES)}),
        )
        .unwrap();
        assert!(!is_small(&long, None));
        let extract = TaskRequest::parse(
            TaskKind::ExtractData,
            &serde_json::json!({"input": "hi", "schema": {"type": "object"}}),
        )
        .unwrap();
        assert!(!is_small(&extract, None));
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
