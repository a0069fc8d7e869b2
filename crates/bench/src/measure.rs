//! Timing: clients that run an operation until a deadline, latency percentiles, and the
//! progress line on stderr that shows a long run is alive.

use futures::future::BoxFuture;
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

/// One operation of a client: `(client index, sequence number within the client)`.
pub type Op = Arc<dyn Fn(usize, u64) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// What one side did over one or more timed phases.
#[derive(Debug, Clone, Default)]
pub struct Phase {
    /// Operations completed.
    pub ops: u64,
    /// Wall time the operations took (summed over phases).
    pub elapsed: Duration,
    /// Latency of every operation, in microseconds.
    pub latencies_us: Vec<u64>,
}

impl Phase {
    /// Adds another phase of the same side.
    pub fn add(&mut self, other: Phase) {
        self.ops += other.ops;
        self.elapsed += other.elapsed;
        self.latencies_us.extend(other.latencies_us);
    }

    /// Operations a second.
    pub fn per_s(&self) -> f64 {
        per_s(self.ops, self.elapsed)
    }

    /// Latency percentiles, when operations were timed one by one.
    pub fn percentiles(&self) -> Option<Percentiles> {
        Percentiles::of(&self.latencies_us)
    }
}

/// `count` per second over `elapsed`.
pub fn per_s(count: u64, elapsed: Duration) -> f64 {
    let secs = elapsed.as_secs_f64();
    if secs > 0.0 { count as f64 / secs } else { 0.0 }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Percentiles {
    /// Operations measured.
    pub samples: u64,
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Percentiles {
    /// Percentiles of latencies in microseconds (nearest rank); `None` when empty.
    pub fn of(latencies_us: &[u64]) -> Option<Percentiles> {
        if latencies_us.is_empty() {
            return None;
        }
        let mut sorted = latencies_us.to_vec();
        sorted.sort_unstable();
        let rank = |p: f64| {
            let i = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            sorted[i.clamp(1, sorted.len()) - 1] as f64 / 1000.0
        };
        let sum: u128 = sorted.iter().map(|&v| u128::from(v)).sum();
        Some(Percentiles {
            samples: sorted.len() as u64,
            mean_ms: sum as f64 / sorted.len() as f64 / 1000.0,
            p50_ms: rank(50.0),
            p90_ms: rank(90.0),
            p99_ms: rank(99.0),
            max_ms: rank(100.0),
        })
    }
}

/// Runs `clients` concurrent clients, each calling `op` again and again until `duration`
/// has passed (an operation in flight at the deadline finishes and counts). The first
/// error stops every client and is returned: a benchmark never counts failures as work.
pub async fn run_timed(
    progress: &Progress,
    clients: usize,
    duration: Duration,
    op: Op,
) -> anyhow::Result<Phase> {
    let start = Instant::now();
    let deadline = start + duration;
    let mut set = JoinSet::new();
    for client in 0..clients.max(1) {
        let op = op.clone();
        let counter = progress.counter();
        set.spawn(async move {
            let mut latencies = Vec::new();
            let mut seq = 0u64;
            while Instant::now() < deadline {
                let t = Instant::now();
                op(client, seq).await?;
                latencies.push(t.elapsed().as_micros() as u64);
                counter.fetch_add(1, Ordering::Relaxed);
                seq += 1;
            }
            anyhow::Ok((latencies, Instant::now()))
        });
    }
    let mut phase = Phase::default();
    let mut end = start;
    while let Some(joined) = set.join_next().await {
        let (latencies, finished) = match joined {
            Ok(Ok(done)) => done,
            Ok(Err(e)) => {
                set.abort_all();
                return Err(e);
            }
            Err(e) => {
                set.abort_all();
                anyhow::bail!("a benchmark client panicked: {e}");
            }
        };
        phase.ops += latencies.len() as u64;
        phase.latencies_us.extend(latencies);
        end = end.max(finished);
    }
    phase.elapsed = end - start;
    Ok(phase)
}

/// The progress line on stderr: the scenario, what it is doing, how many operations so
/// far and how fast, and for how long. On a terminal it is rewritten in place every
/// second; otherwise (CI logs) a line is printed every five seconds.
#[derive(Debug, Clone)]
pub struct Progress {
    inner: Arc<ProgressInner>,
}

#[derive(Debug)]
struct ProgressInner {
    scenario: String,
    stage: Mutex<(String, Instant)>,
    ops: Arc<AtomicU64>,
    done: AtomicBool,
    tty: bool,
}

impl Progress {
    /// Starts the progress line of a scenario; it ends with [`Progress::finish`].
    pub fn start(scenario: String) -> Progress {
        let inner = Arc::new(ProgressInner {
            scenario,
            stage: Mutex::new(("starting".to_string(), Instant::now())),
            ops: Arc::new(AtomicU64::new(0)),
            done: AtomicBool::new(false),
            tty: std::io::stderr().is_terminal(),
        });
        // The ticker holds a weak reference: it stops when the scenario drops its
        // progress, whatever path it took out.
        let ticker = Arc::downgrade(&inner);
        let every = if inner.tty {
            Duration::from_secs(1)
        } else {
            Duration::from_secs(5)
        };
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(inner) = ticker.upgrade() else {
                    return;
                };
                if inner.done.load(Ordering::Relaxed) {
                    return;
                }
                inner.print();
            }
        });
        Progress { inner }
    }

    /// Names what the scenario does now and resets the operation count.
    pub fn stage(&self, stage: impl Into<String>) {
        let stage = stage.into();
        self.inner.ops.store(0, Ordering::Relaxed);
        *self
            .inner
            .stage
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = (stage, Instant::now());
        if !self.inner.tty {
            self.inner.print();
        }
    }

    /// The counter of operations done in the current stage.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.inner.ops.clone()
    }

    /// Sets the number of operations done in the current stage.
    pub fn set(&self, ops: u64) {
        self.inner.ops.store(ops, Ordering::Relaxed);
    }

    /// Stops the ticker and clears the line.
    pub fn finish(&self) {
        self.inner.done.store(true, Ordering::Relaxed);
        if self.inner.tty {
            eprint!("\r\x1b[K");
            let _ = std::io::stderr().flush();
        }
    }
}

impl ProgressInner {
    fn print(&self) {
        let (stage, since) = self
            .stage
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let elapsed = since.elapsed();
        let ops = self.ops.load(Ordering::Relaxed);
        let rate = if ops > 0 {
            format!(": {ops} ops, {:.0}/s", per_s(ops, elapsed))
        } else {
            String::new()
        };
        let line = format!(
            "[bench {}] {stage}{rate} ({:.0} s)",
            self.scenario,
            elapsed.as_secs_f64()
        );
        if self.tty {
            eprint!("\r\x1b[K{line}");
            let _ = std::io::stderr().flush();
        } else {
            eprintln!("{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let lat: Vec<u64> = (1..=100).map(|ms| ms * 1000).collect();
        let p = Percentiles::of(&lat).expect("samples");
        assert_eq!(p.samples, 100);
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p90_ms, 90.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(p.max_ms, 100.0);
        assert!((p.mean_ms - 50.5).abs() < 1e-9);
        assert!(Percentiles::of(&[]).is_none());
    }

    #[test]
    fn rate_of_nothing_is_zero() {
        assert_eq!(per_s(10, Duration::ZERO), 0.0);
        assert_eq!(per_s(10, Duration::from_secs(2)), 5.0);
    }
}
