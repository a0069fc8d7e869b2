//! The peers `tollgate bench peer` measures Tollgate against: PostgreSQL job queues
//! whose side is a binary of its own, built apart from the workspace (`bench/<peer>`,
//! each its own cargo project), run as a child process that prints one JSON object.
//!
//! - [`PeerKind::Graphile`]: graphile_worker with its throughput settings (a local queue
//!   of 1,000 jobs), `bench/graphile-peer`.
//! - [`PeerKind::GraphileQueueWorkers`]: the same peer with a local queue no larger than
//!   the worker count (`--local-queue-size W`): a claim no larger than the workers, which
//!   is what Tollgate may claim.
//! - [`PeerKind::Apalis`]: apalis-postgres 1.0 (a worker of concurrency W, fetching W
//!   jobs per poll, a row kept per job), `bench/apalis-peer`.

use super::measure::Phase;
use anyhow::Context;
use clap::ValueEnum;
use serde::Deserialize;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where `cargo build --release --manifest-path bench/graphile-peer/Cargo.toml` puts the
/// graphile_worker peer, relative to the repository's root.
pub(super) const DEFAULT_GRAPHILE_BIN: &str = "bench/graphile-peer/target/release/graphile-peer";

/// Where `cargo build --release --manifest-path bench/apalis-peer/Cargo.toml` puts the
/// apalis-postgres peer, relative to the repository's root.
pub(super) const DEFAULT_APALIS_BIN: &str = "bench/apalis-peer/target/release/apalis-peer";

/// A peer `tollgate bench peer` can measure Tollgate against (`--peer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PeerKind {
    /// graphile_worker with a local queue of 1,000 jobs (its throughput setting).
    Graphile,
    /// graphile_worker with a local queue of `--workers` jobs (a claim no larger than the
    /// workers, as Tollgate's).
    #[value(name = "graphile-q-workers")]
    GraphileQueueWorkers,
    /// apalis-postgres 1.0: one worker of concurrency `--workers` fetching as many jobs
    /// per poll.
    Apalis,
}

impl PeerKind {
    /// The `--peer` value, also the key of the report's `peers` object.
    pub fn name(self) -> &'static str {
        match self {
            PeerKind::Graphile => "graphile",
            PeerKind::GraphileQueueWorkers => "graphile-q-workers",
            PeerKind::Apalis => "apalis",
        }
    }

    /// What the report's rows call it.
    pub(super) fn label(self, workers: u32) -> String {
        match self {
            PeerKind::Graphile => "graphile_worker (local queue 1000)".into(),
            PeerKind::GraphileQueueWorkers => format!("graphile_worker (local queue {workers})"),
            PeerKind::Apalis => "apalis-postgres".into(),
        }
    }

    /// The `peer` field its binary's JSON carries.
    fn json_name(self) -> &'static str {
        match self {
            PeerKind::Graphile | PeerKind::GraphileQueueWorkers => "graphile_worker",
            PeerKind::Apalis => "apalis-postgres",
        }
    }

    /// How to build its binary, for messages.
    fn build_hint(self) -> &'static str {
        match self {
            PeerKind::Graphile | PeerKind::GraphileQueueWorkers => {
                "build it with `cargo build --release --manifest-path \
                 bench/graphile-peer/Cargo.toml` (from the repository's root), or point \
                 --peer-bin at it"
            }
            PeerKind::Apalis => {
                "build it with `cargo build --release --manifest-path \
                 bench/apalis-peer/Cargo.toml` (from the repository's root), or point \
                 --apalis-bin at it"
            }
        }
    }

    /// Its settings, for the report's notes.
    pub(super) fn settings(self, workers: u32) -> String {
        match self {
            PeerKind::Graphile => "graphile_worker: no-op handler, local queue of 1000, \
                 completions and failures batched every 5 ms, 10 ms poll, 20 connections"
                .into(),
            PeerKind::GraphileQueueWorkers => format!(
                "graphile_worker (local queue {workers}): as above with a local queue of \
                 {workers} jobs"
            ),
            PeerKind::Apalis => format!(
                "apalis-postgres: no-op handler, WorkerBuilder .concurrency({workers}) \
                 .parallelize(tokio::spawn), Config::batch_size({workers}), LISTEN/NOTIFY \
                 (with_pubsub), completions acknowledged in batches, 10 connections"
            ),
        }
    }
}

/// Where the peers' binaries are.
#[derive(Debug, Clone)]
pub(super) struct PeerBins {
    /// graphile_worker's (`--peer-bin`).
    pub graphile: PathBuf,
    /// apalis-postgres's (`--apalis-bin`).
    pub apalis: PathBuf,
}

impl PeerBins {
    fn of(&self, kind: PeerKind) -> &Path {
        match kind {
            PeerKind::Graphile | PeerKind::GraphileQueueWorkers => &self.graphile,
            PeerKind::Apalis => &self.apalis,
        }
    }

    /// Fails early when a peer's binary is missing.
    pub(super) fn check(&self, peers: &[PeerKind]) -> anyhow::Result<()> {
        anyhow::ensure!(!peers.is_empty(), "--peer names no peer");
        for &kind in peers {
            let bin = self.of(kind);
            anyhow::ensure!(
                bin.is_file(),
                "the {} peer's binary {} is missing: {}",
                kind.name(),
                bin.display(),
                kind.build_hint()
            );
        }
        Ok(())
    }
}

/// A peer's `--json` object (fields this scenario reads).
#[derive(Debug, Clone, Deserialize)]
pub(super) struct PeerRun {
    pub peer: String,
    pub version: String,
    pub jobs: u64,
    pub workers: u32,
    pub batch: u64,
    pub enqueue_per_s: f64,
    pub process_per_s: f64,
    pub burn_down_per_s: f64,
}

/// One side's three rates, added up over rounds.
#[derive(Debug, Default)]
pub(super) struct Side {
    pub enqueue: Phase,
    pub process: Phase,
    pub burn_down: Phase,
}

impl Side {
    pub(super) fn add(&mut self, n: u64, enqueue: Duration, process: Duration, burn: Duration) {
        for (phase, elapsed) in [
            (&mut self.enqueue, enqueue),
            (&mut self.process, process),
            (&mut self.burn_down, burn),
        ] {
            phase.add(Phase {
                ops: n,
                elapsed,
                latencies_us: Vec::new(),
            });
        }
    }

    pub(super) fn add_peer(&mut self, run: &PeerRun) {
        let took = |per_s: f64| {
            Duration::from_secs_f64(if per_s > 0.0 {
                run.jobs as f64 / per_s
            } else {
                0.0
            })
        };
        self.add(
            run.jobs,
            took(run.enqueue_per_s),
            took(run.process_per_s),
            took(run.burn_down_per_s),
        );
    }
}

/// Runs a peer's binary once on `url` (a database of its own: each peer resets its own
/// schema) and parses its JSON object.
pub(super) async fn run_peer(
    kind: PeerKind,
    bins: &PeerBins,
    url: &str,
    n: u64,
    workers: u32,
    batch: u64,
    timeout: Duration,
) -> anyhow::Result<(PeerRun, Value)> {
    let bin = bins.of(kind).to_path_buf();
    let mut command = std::process::Command::new(&bin);
    command
        .arg("--database-url")
        .arg(url)
        .args(["--jobs", &n.to_string()])
        .args(["--workers", &workers.to_string()])
        .args(["--batch", &batch.to_string()])
        .arg("--json");
    match kind {
        PeerKind::Graphile => {}
        PeerKind::GraphileQueueWorkers => {
            command.args(["--local-queue-size", &workers.to_string()]);
        }
        PeerKind::Apalis => {
            command.args(["--fetch-batch", &workers.to_string()]);
        }
    }
    let output = tokio::time::timeout(
        timeout,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .with_context(|| format!("the {} peer did not finish within {timeout:?}", kind.name()))?
    .context("the peer's runner panicked")?
    .with_context(|| format!("cannot run {} ({})", bin.display(), kind.build_hint()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "{} failed ({}): {}",
        bin.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'))
        .with_context(|| format!("the peer printed no JSON object: {stdout:?}"))?;
    let raw: Value = serde_json::from_str(line).context("the peer's JSON does not parse")?;
    let run: PeerRun =
        serde_json::from_value(raw.clone()).context("the peer's JSON lacks a field")?;
    anyhow::ensure!(
        run.peer == kind.json_name()
            && run.jobs == n
            && run.workers == workers
            && run.batch == batch,
        "the peer ran something else than asked: {line}"
    );
    Ok((run, raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_says_how_to_build_it() {
        let bins = PeerBins {
            graphile: "/nonexistent/graphile-peer".into(),
            apalis: "/nonexistent/apalis-peer".into(),
        };
        let e = bins.check(&[PeerKind::Apalis]).expect_err("missing");
        assert!(e.to_string().contains("bench/apalis-peer/Cargo.toml"));
        let e = bins
            .check(&[PeerKind::GraphileQueueWorkers])
            .expect_err("missing");
        assert!(e.to_string().contains("bench/graphile-peer/Cargo.toml"));
        assert!(bins.check(&[]).is_err());
    }

    #[test]
    fn peer_rounds_add_up_by_time() {
        let run = |jobs, per_s| PeerRun {
            peer: "graphile_worker".into(),
            version: "0.0.0".into(),
            jobs,
            workers: 32,
            batch: 1000,
            enqueue_per_s: per_s,
            process_per_s: per_s,
            burn_down_per_s: per_s / 2.0,
        };
        let mut side = Side::default();
        side.add_peer(&run(1000, 1000.0));
        side.add_peer(&run(1000, 500.0));
        assert!((side.process.per_s() - 2000.0 / 3.0).abs() < 1e-6);
        assert!((side.burn_down.per_s() - 1000.0 / 3.0).abs() < 1e-6);
    }

    #[test]
    fn peer_names_are_the_cli_values() {
        for kind in PeerKind::value_variants() {
            let value = kind.to_possible_value().expect("value");
            assert_eq!(value.get_name(), kind.name());
        }
    }
}
