//! `peer` (PostgreSQL only): Tollgate against graphile_worker, the Rust PostgreSQL job
//! queue, in the same run on the same server.
//!
//! graphile_worker's side is a separate binary (`bench/graphile-peer`, its own cargo
//! project outside the workspace, so the product never compiles graphile_worker), run as
//! a child process with `--json` on a fresh database of its own. It enqueues N no-op jobs
//! with `add_jobs`, 1000 per call, then runs them with one worker of concurrency W and the
//! crate's throughput settings (local queue, batched completions, 10 ms poll).
//!
//! Tollgate's side, on the scenario's fresh database: N unscoped tasks through the
//! facade's batch call (`submit_many`, [`MAX_BATCH`] = 1000 per call) with the instant
//! provider, then W workers run them all — the burn-down scenario's own code
//! ([`tollgate_burn_down`]).
//!
//! Tollgate's HTTP enqueue, a phase of its own after the two systems' turns in each round:
//! N more unscoped tasks (fresh effect keys) through `POST /v1/tasks/batch`,
//! [`MAX_BATCH`] = 1000 per call (the route's limit), one call at a time from one
//! keep-alive HTTP/1.1 client, to the product's server started in-process
//! ([`HttpServer`]) over a second Tollgate on a second fresh database whose workers are
//! never started: its tasks stay queued and are dropped with the database, so the
//! processing measurement never sees them.
//!
//! Rates: enqueue/s = N ÷ (first batch → last batch answered), over HTTP too (the
//! answers' items are checked to be created tasks once the clock has stopped); process/s =
//! N ÷ (workers started → last committed completion); burn-down/s = N ÷ (first batch →
//! last committed completion). The systems alternate order round by round. Targets:
//! processing ≥ 1.0× and enqueue ≥ 1.0× graphile_worker; HTTP enqueue ≥ 1.0×
//! graphile_worker's enqueue is reported apart (`http_enqueue_target_met`).
//!
//! Not part of `all` (the peer binary may not be built).

use super::burn_down::{SUBMIT_SCOPES, Timed, timeout_for, tollgate_burn_down};
use super::counting::CountingStore;
use super::http::{HttpClient, HttpServer, check_batch};
use super::measure::Phase;
use super::report::ScenarioReport;
use super::{BackendKind, BenchDb, Ctx, Scenario, scope_ids, submit_body, with_database};
use crate::baseline::{create_postgres_database, drop_postgres_database};
use anyhow::Context;
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tollgate_core::ScopeId;
use tollgate_engine::MAX_BATCH;

/// Where `cargo build --release --manifest-path bench/graphile-peer/Cargo.toml` puts the
/// peer, relative to the repository's root.
pub(super) const DEFAULT_PEER_BIN: &str = "bench/graphile-peer/target/release/graphile-peer";

/// The scenario's `--workers` default (both systems).
pub(super) const DEFAULT_WORKERS: u32 = 32;

/// How to build the peer, for messages.
const BUILD_HINT: &str = "build it with `cargo build --release --manifest-path \
     bench/graphile-peer/Cargo.toml` (from the repository's root), or point --peer-bin at it";

/// Fails early, before any database is created, when the scenario cannot run.
pub(super) fn preflight(backend: BackendKind, peer_bin: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        backend == BackendKind::Postgres,
        "the peer scenario runs on PostgreSQL only: add --backend postgres"
    );
    anyhow::ensure!(
        peer_bin.is_file(),
        "graphile_worker's peer binary {} is missing: {BUILD_HINT}",
        peer_bin.display()
    );
    Ok(())
}

/// The peer's `--json` object (fields this scenario reads).
#[derive(Debug, Clone, Deserialize)]
struct PeerRun {
    peer: String,
    version: String,
    jobs: u64,
    workers: u32,
    batch: u64,
    enqueue_per_s: f64,
    process_per_s: f64,
    burn_down_per_s: f64,
}

/// One side's three rates, added up over rounds.
#[derive(Debug, Default)]
struct Side {
    enqueue: Phase,
    process: Phase,
    burn_down: Phase,
}

impl Side {
    fn add(&mut self, n: u64, enqueue: Duration, process: Duration, burn_down: Duration) {
        for (phase, elapsed) in [
            (&mut self.enqueue, enqueue),
            (&mut self.process, process),
            (&mut self.burn_down, burn_down),
        ] {
            phase.add(Phase {
                ops: n,
                elapsed,
                latencies_us: Vec::new(),
            });
        }
    }

    fn add_peer(&mut self, run: &PeerRun) {
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

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    preflight(ctx.backend, &ctx.peer_bin)?;
    let name = format!("tollgate_bench_peer_{}", uuid::Uuid::new_v4().simple());
    ctx.progress
        .stage("creating graphile_worker's fresh database");
    create_postgres_database(&ctx.database_url, &name)
        .await
        .with_context(|| format!("cannot create graphile_worker's database {name}"))?;
    let peer_url = with_database(&ctx.database_url, &name);
    let result = match peer_url {
        Ok(url) => with_http_database(ctx, &url).await,
        Err(e) => Err(e),
    };
    ctx.progress.stage("dropping graphile_worker's database");
    let dropped = drop_postgres_database(&ctx.database_url, &name)
        .await
        .with_context(|| format!("cannot drop graphile_worker's database {name}"));
    let report = result?;
    dropped?;
    Ok(report)
}

/// The rounds with the HTTP enqueue's own fresh database, dropped afterwards whatever
/// happened.
async fn with_http_database(ctx: &Ctx, peer_url: &str) -> anyhow::Result<ScenarioReport> {
    ctx.progress
        .stage("creating the HTTP enqueue's fresh database");
    let db = BenchDb::create(ctx.backend, &ctx.database_url)
        .await
        .context("cannot create the HTTP enqueue's database")?;
    let result = rounds(ctx, peer_url, &db).await;
    ctx.progress.stage("dropping the HTTP enqueue's database");
    let dropped = db.drop().await;
    let report = result?;
    dropped?;
    Ok(report)
}

/// The alternating rounds (the HTTP enqueue's server over a Tollgate on `http_db`, its
/// workers never started) and the report.
async fn rounds(ctx: &Ctx, peer_url: &str, http_db: &BenchDb) -> anyhow::Result<ScenarioReport> {
    let http_tollgate = ctx.tollgate(
        &CountingStore::new(http_db.store.clone()),
        ctx.sizes.peer_workers,
        None,
    )?;
    let server = HttpServer::start(&http_tollgate).await?;
    let measured = measure(ctx, peer_url, server.client()).await;
    let stopped = server.shutdown().await;
    let report = measured?;
    stopped?;
    Ok(report)
}

/// Every round's turns, then the report.
async fn measure(ctx: &Ctx, peer_url: &str, http: &HttpClient) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let workers = sizes.peer_workers;
    let rounds = u64::from(sizes.peer_rounds).min(sizes.tasks).max(1);
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, workers, None)?;
    let scopes = scope_ids("peer", SUBMIT_SCOPES)?;
    let mut ours = Side::default();
    let mut theirs = Side::default();
    let mut http_enqueue = Phase::default();
    let mut peer_runs = Vec::new();
    let mut version = String::new();
    for round in 0..rounds {
        let n = sizes.tasks / rounds + u64::from(round < sizes.tasks % rounds);
        let label = format!("round {}/{rounds}", round + 1);
        for tollgate_turn in [round % 2 == 0, round % 2 == 1] {
            if tollgate_turn {
                let Timed {
                    submit,
                    process,
                    total,
                } = tollgate_burn_down(
                    ctx,
                    &tollgate,
                    &counting,
                    &scopes,
                    &format!("peer-{round}"),
                    n,
                    &format!("tollgate ({workers} workers) {label}"),
                )
                .await?;
                ours.add(n, submit, process, total);
            } else {
                ctx.progress.stage(format!(
                    "graphile_worker ({workers} workers) {label}: {n} jobs (child process)"
                ));
                let (run, raw) = run_peer(&ctx.peer_bin, peer_url, n, workers).await?;
                theirs.add_peer(&run);
                version = run.version.clone();
                peer_runs.push(raw);
            }
        }
        let elapsed = enqueue_over_http(
            ctx,
            http,
            &scopes,
            &format!("http-{round}"),
            n,
            &format!("tollgate over HTTP {label}"),
        )
        .await?;
        http_enqueue.add(Phase {
            ops: n,
            elapsed,
            latencies_us: Vec::new(),
        });
    }

    let ratio = |t: &Phase, b: &Phase| t.per_s() / b.per_s().max(f64::MIN_POSITIVE);
    let process_ratio = ratio(&ours.process, &theirs.process);
    let enqueue_ratio = ratio(&ours.enqueue, &theirs.enqueue);
    let burn_down_ratio = ratio(&ours.burn_down, &theirs.burn_down);
    let http_enqueue_ratio = ratio(&http_enqueue, &theirs.enqueue);
    let (process_met, enqueue_met) = (process_ratio >= 1.0, enqueue_ratio >= 1.0);
    let http_enqueue_met = http_enqueue_ratio >= 1.0;
    let met = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut report = ctx.report(Scenario::Peer);
    report
        .param("tasks", sizes.tasks)
        .param("workers", workers)
        .param("batch", MAX_BATCH as u64)
        .param("rounds", rounds)
        .param("peer", format!("graphile_worker {version}"))
        .row(
            &format!("tollgate enqueue (submit_many, {MAX_BATCH}/call)"),
            Some(ours.enqueue.per_s()),
            None,
        )
        .row(
            &format!("tollgate enqueue over HTTP (POST /v1/tasks/batch, {MAX_BATCH}/call)"),
            Some(http_enqueue.per_s()),
            None,
        )
        .row(
            &format!("graphile_worker enqueue (add_jobs, {MAX_BATCH}/call)"),
            Some(theirs.enqueue.per_s()),
            None,
        )
        .tollgate(
            &format!("tollgate process ({workers} workers)"),
            ours.process.per_s(),
            None,
        )
        .baseline(
            &format!("graphile_worker process ({workers} workers)"),
            theirs.process.per_s(),
            None,
        )
        .row(
            "tollgate burn-down (enqueue → all done)",
            Some(ours.burn_down.per_s()),
            None,
        )
        .row(
            "graphile_worker burn-down (enqueue → all done)",
            Some(theirs.burn_down.per_s()),
            None,
        )
        .ratio_at_least(1.0)
        .target(
            "processing ≥ 1.0× graphile_worker, enqueue ≥ 1.0× graphile_worker",
            process_met && enqueue_met,
        )
        .extra("graphile_worker_version", version.clone())
        .extra("process_ratio", process_ratio)
        .extra("enqueue_ratio", enqueue_ratio)
        .extra("burn_down_ratio", burn_down_ratio)
        .extra("process_target_met", process_met)
        .extra("enqueue_target_met", enqueue_met)
        .extra("http_enqueue_vs_peer", http_enqueue_ratio)
        .extra("http_enqueue_target_met", http_enqueue_met)
        .extra("tollgate_enqueue_per_s", ours.enqueue.per_s())
        .extra("tollgate_http_enqueue_per_s", http_enqueue.per_s())
        .extra("graphile_worker_enqueue_per_s", theirs.enqueue.per_s())
        .extra("tollgate_burn_down_per_s", ours.burn_down.per_s())
        .extra("graphile_worker_burn_down_per_s", theirs.burn_down.per_s())
        .extra("graphile_worker_runs", Value::Array(peer_runs))
        .note(format!(
            "processing: {process_ratio:.2}× graphile_worker (target ≥ 1.0×: {})",
            met(process_met)
        ))
        .note(format!(
            "enqueue: {enqueue_ratio:.2}× graphile_worker (target ≥ 1.0×: {})",
            met(enqueue_met)
        ))
        .note(format!(
            "enqueue over HTTP: {http_enqueue_ratio:.2}× graphile_worker's enqueue \
             (target ≥ 1.0×: {})",
            met(http_enqueue_met)
        ))
        .note(format!("burn-down: {burn_down_ratio:.2}× graphile_worker"))
        .note(
            "graphile_worker: no-op handler, local queue of 1000, completions and failures \
             batched every 5 ms, 10 ms poll, 20 connections; tollgate: instant provider, \
             16 connections",
        )
        .note(
            "HTTP enqueue: one keep-alive HTTP/1.1 client, one call at a time, to an \
             in-process server over a second fresh database with no workers (its tasks \
             are never run)",
        );
    report.store_profile(&counting.counts().profile());
    Ok(report)
}

/// Enqueues `n` unscoped tasks (spread over `scopes`, effect keys `burn-<tag>-<i>`, the
/// burn-down's requests) through `POST /v1/tasks/batch`, [`MAX_BATCH`] per call, one call
/// at a time; returns first call → last answer. The bodies are written before the clock
/// starts (as the facade's submissions are built before theirs); the answers are checked
/// after it stops, and every item must be a created task.
async fn enqueue_over_http(
    ctx: &Ctx,
    http: &HttpClient,
    scopes: &[ScopeId],
    tag: &str,
    n: u64,
    stage: &str,
) -> anyhow::Result<Duration> {
    ctx.progress
        .stage(format!("{stage}: POST /v1/tasks/batch × {n}"));
    let mut bodies = Vec::new();
    let mut items = Vec::with_capacity(MAX_BATCH);
    for i in 0..n {
        let scope = &scopes[i as usize % scopes.len()];
        items.push(submit_body(
            scope,
            &format!("burn-{tag}-{i}"),
            &format!("burn {tag} {i}"),
        ));
        if items.len() == MAX_BATCH || i + 1 == n {
            let count = items.len();
            let body = serde_json::to_vec(&json!({ "tasks": std::mem::take(&mut items) }))?;
            anyhow::ensure!(
                body.len() <= tollgate_server::DEFAULT_BATCH_BODY_LIMIT,
                "a batch body of {} bytes is over the server's {} byte limit",
                body.len(),
                tollgate_server::DEFAULT_BATCH_BODY_LIMIT
            );
            bodies.push((count, body));
        }
    }
    let timeout = timeout_for(MAX_BATCH as u64);
    let mut answers = Vec::with_capacity(bodies.len());
    let mut sent = 0u64;
    let start = Instant::now();
    for (count, body) in bodies {
        let (status, answer) = http.post("/v1/tasks/batch", body, timeout).await?;
        sent += count as u64;
        ctx.progress.set(sent);
        answers.push((count, status, answer));
    }
    let elapsed = start.elapsed();
    for (count, status, answer) in answers {
        check_batch(status, &answer, count)?;
    }
    Ok(elapsed)
}

/// Runs the peer binary once on `url` and parses its JSON object.
async fn run_peer(bin: &Path, url: &str, n: u64, workers: u32) -> anyhow::Result<(PeerRun, Value)> {
    let mut command = std::process::Command::new(bin);
    command
        .arg("--database-url")
        .arg(url)
        .args(["--jobs", &n.to_string()])
        .args(["--workers", &workers.to_string()])
        .args(["--batch", &MAX_BATCH.to_string()])
        .arg("--json");
    let timeout = timeout_for(n) * 2;
    let output = tokio::time::timeout(
        timeout,
        tokio::task::spawn_blocking(move || command.output()),
    )
    .await
    .with_context(|| format!("graphile_worker's peer did not finish within {timeout:?}"))?
    .context("the peer's runner panicked")?
    .with_context(|| format!("cannot run {} ({BUILD_HINT})", bin.display()))?;
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
        run.peer == "graphile_worker"
            && run.jobs == n
            && run.workers == workers
            && run.batch == MAX_BATCH as u64,
        "the peer ran something else than asked: {line}"
    );
    Ok((run, raw))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_refuses_sqlite_and_a_missing_binary() {
        let missing = Path::new("/nonexistent/graphile-peer");
        let sqlite = preflight(BackendKind::Sqlite, missing).expect_err("sqlite");
        assert!(sqlite.to_string().contains("--backend postgres"));
        let absent = preflight(BackendKind::Postgres, missing).expect_err("missing");
        assert!(
            absent
                .to_string()
                .contains("cargo build --release --manifest-path")
        );
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
}
