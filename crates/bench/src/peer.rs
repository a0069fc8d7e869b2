//! `peer` (PostgreSQL only): Tollgate against PostgreSQL job queues in Rust —
//! graphile_worker and apalis-postgres ([`PeerKind`], `--peer`) — in the same run on the
//! same server.
//!
//! Each peer's side is a separate binary (`bench/graphile-peer`, `bench/apalis-peer`: cargo
//! projects of their own outside the workspace, so the product never compiles them), run
//! as a child process with `--json` on a fresh database of its own ([`super::peers`]). It
//! enqueues N no-op jobs, 1000 per call, then runs them with W concurrent executions.
//!
//! Tollgate's side, on the scenario's fresh database: N unscoped tasks through the
//! facade's batch call (`submit_many`, [`MAX_BATCH`] = 1000 per call) with the instant
//! provider, then W workers run them all — the burn-down scenario's own code
//! ([`tollgate_burn_down`]).
//!
//! Tollgate's HTTP enqueue, a phase of its own after the systems' turns in each round:
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
//! last committed completion). The systems take turns round by round, each round starting
//! with the next one. Targets, for every peer: processing ≥ 1.0× and enqueue ≥ 1.0×; HTTP
//! enqueue ≥ 1.0× the first peer's enqueue is reported apart (`http_enqueue_target_met`).
//!
//! Not part of `all` (the peer binaries may not be built).

use super::burn_down::{SUBMIT_SCOPES, Timed, timeout_for, tollgate_burn_down};
use super::counting::CountingStore;
use super::http::{HttpClient, HttpServer, check_batch};
use super::measure::Phase;
pub use super::peers::PeerKind;
use super::peers::{PeerBins, Side, run_peer};
use super::report::ScenarioReport;
use super::{BackendKind, BenchDb, Ctx, Scenario, scope_ids, submit_body, with_database};
use crate::baseline::{create_postgres_database, drop_postgres_database};
use anyhow::Context;
use serde_json::{Map, Value, json};
use std::time::{Duration, Instant};
use tollgate_core::ScopeId;
use tollgate_engine::MAX_BATCH;

pub(super) use super::peers::{DEFAULT_APALIS_BIN, DEFAULT_GRAPHILE_BIN};

/// The scenario's `--workers` default (every system).
pub(super) const DEFAULT_WORKERS: u32 = 32;

/// Fails early, before any database is created, when the scenario cannot run.
pub(super) fn preflight(
    backend: BackendKind,
    peers: &[PeerKind],
    bins: &PeerBins,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        backend == BackendKind::Postgres,
        "the peer scenario runs on PostgreSQL only: add --backend postgres"
    );
    bins.check(peers)
}

/// The peers asked for, each once, in the order given.
fn distinct(peers: &[PeerKind]) -> Vec<PeerKind> {
    let mut out: Vec<PeerKind> = Vec::new();
    for &p in peers {
        if !out.contains(&p) {
            out.push(p);
        }
    }
    out
}

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let peers = distinct(&ctx.peers);
    preflight(ctx.backend, &peers, &ctx.peer_bins)?;
    // A fresh database per peer, all dropped at the end whatever happened.
    let mut names = Vec::new();
    let mut urls = Vec::new();
    let mut failed: Option<anyhow::Error> = None;
    for kind in &peers {
        let name = format!("tollgate_bench_peer_{}", uuid::Uuid::new_v4().simple());
        ctx.progress.stage(format!(
            "creating the {} peer's fresh database",
            kind.name()
        ));
        if let Err(e) = create_postgres_database(&ctx.database_url, &name).await {
            failed = Some(
                anyhow::Error::new(e).context(format!("cannot create the peer database {name}")),
            );
            break;
        }
        names.push(name.clone());
        match with_database(&ctx.database_url, &name) {
            Ok(url) => urls.push(url),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    let result = match failed {
        None => with_http_database(ctx, &peers, &urls).await,
        Some(e) => Err(e),
    };
    ctx.progress.stage("dropping the peers' databases");
    let mut dropped = Ok(());
    for name in names {
        if let Err(e) = drop_postgres_database(&ctx.database_url, &name).await {
            dropped =
                Err(anyhow::Error::new(e).context(format!("cannot drop the peer database {name}")));
        }
    }
    let report = result?;
    dropped?;
    Ok(report)
}

/// The rounds with the HTTP enqueue's own fresh database, dropped afterwards whatever
/// happened.
async fn with_http_database(
    ctx: &Ctx,
    peers: &[PeerKind],
    peer_urls: &[String],
) -> anyhow::Result<ScenarioReport> {
    ctx.progress
        .stage("creating the HTTP enqueue's fresh database");
    let db = BenchDb::create(ctx.backend, &ctx.database_url)
        .await
        .context("cannot create the HTTP enqueue's database")?;
    let result = rounds(ctx, peers, peer_urls, &db).await;
    ctx.progress.stage("dropping the HTTP enqueue's database");
    let dropped = db.drop().await;
    let report = result?;
    dropped?;
    Ok(report)
}

/// The alternating rounds (the HTTP enqueue's server over a Tollgate on `http_db`, its
/// workers never started) and the report.
async fn rounds(
    ctx: &Ctx,
    peers: &[PeerKind],
    peer_urls: &[String],
    http_db: &BenchDb,
) -> anyhow::Result<ScenarioReport> {
    let http_tollgate = ctx.tollgate(
        &CountingStore::new(http_db.store.clone()),
        ctx.sizes.peer_workers,
        None,
    )?;
    let server = HttpServer::start(&http_tollgate).await?;
    let measured = measure(ctx, peers, peer_urls, server.client()).await;
    let stopped = server.shutdown().await;
    let report = measured?;
    stopped?;
    Ok(report)
}

/// One peer's measurements over the rounds.
struct PeerSide {
    kind: PeerKind,
    side: Side,
    version: String,
    runs: Vec<Value>,
}

/// Every round's turns, then the report.
async fn measure(
    ctx: &Ctx,
    peers: &[PeerKind],
    peer_urls: &[String],
    http: &HttpClient,
) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let workers = sizes.peer_workers;
    let rounds = u64::from(sizes.peer_rounds).min(sizes.tasks).max(1);
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, workers, None)?;
    let scopes = scope_ids("peer", SUBMIT_SCOPES)?;
    let mut ours = Side::default();
    let mut theirs: Vec<PeerSide> = peers
        .iter()
        .map(|&kind| PeerSide {
            kind,
            side: Side::default(),
            version: String::new(),
            runs: Vec::new(),
        })
        .collect();
    let mut http_enqueue = Phase::default();
    let mut per_round = Vec::new();
    // Turn 0 is Tollgate's, turn i + 1 the i-th peer's; each round starts one further on.
    let turns = peers.len() + 1;
    for round in 0..rounds {
        let n = sizes.tasks / rounds + u64::from(round < sizes.tasks % rounds);
        let label = format!("round {}/{rounds}", round + 1);
        let mut this_round = Map::new();
        this_round.insert("round".into(), json!(round + 1));
        let mut ours_now = 0.0;
        for step in 0..turns {
            let turn = (step + round as usize) % turns;
            if turn == 0 {
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
                ours_now = measure_per_s(n, process);
                this_round.insert("tollgate_process_per_s".into(), json!(ours_now));
            } else {
                let peer = &mut theirs[turn - 1];
                ctx.progress.stage(format!(
                    "{} ({workers} workers) {label}: {n} jobs (child process)",
                    peer.kind.label(workers)
                ));
                let timeout = timeout_for(n) * 2;
                let (run, raw) = run_peer(
                    peer.kind,
                    &ctx.peer_bins,
                    &peer_urls[turn - 1],
                    n,
                    workers,
                    MAX_BATCH as u64,
                    timeout,
                )
                .await?;
                peer.side.add_peer(&run);
                peer.version = run.version.clone();
                this_round.insert(
                    format!("{}_process_per_s", peer.kind.name()),
                    json!(run.process_per_s),
                );
                peer.runs.push(raw);
            }
        }
        for peer in &theirs {
            let key = format!("{}_process_per_s", peer.kind.name());
            if let Some(theirs_now) = this_round.get(&key).and_then(Value::as_f64) {
                this_round.insert(
                    format!("process_ratio_vs_{}", peer.kind.name()),
                    json!(ours_now / theirs_now.max(f64::MIN_POSITIVE)),
                );
            }
        }
        per_round.push(Value::Object(this_round));
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
    Ok(report(
        ctx,
        rounds,
        &ours,
        &theirs,
        &http_enqueue,
        per_round,
        &counting,
    ))
}

fn measure_per_s(n: u64, elapsed: Duration) -> f64 {
    super::measure::per_s(n, elapsed)
}

/// The scenario's report: a row per rate, the ratios against every peer.
fn report(
    ctx: &Ctx,
    rounds: u64,
    ours: &Side,
    theirs: &[PeerSide],
    http_enqueue: &Phase,
    per_round: Vec<Value>,
    counting: &CountingStore,
) -> ScenarioReport {
    let sizes = &ctx.sizes;
    let workers = sizes.peer_workers;
    let ratio = |t: &Phase, b: &Phase| t.per_s() / b.per_s().max(f64::MIN_POSITIVE);
    let met = |ok: bool| if ok { "met" } else { "MISSED" };
    let mut report = ctx.report(Scenario::Peer);
    let names: Vec<&str> = theirs.iter().map(|p| p.kind.name()).collect();
    report
        .param("tasks", sizes.tasks)
        .param("workers", workers)
        .param("batch", MAX_BATCH as u64)
        .param("rounds", rounds)
        .param("peers", names.join(","))
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
        .tollgate(
            &format!("tollgate process ({workers} workers)"),
            ours.process.per_s(),
            None,
        )
        .row(
            "tollgate burn-down (enqueue → all done)",
            Some(ours.burn_down.per_s()),
            None,
        );
    let mut peers_json = Map::new();
    let (mut process_min, mut enqueue_min, mut burn_down_min) = (f64::MAX, f64::MAX, f64::MAX);
    let mut notes = Vec::new();
    for (i, peer) in theirs.iter().enumerate() {
        let label = peer.kind.label(workers);
        let process_ratio = ratio(&ours.process, &peer.side.process);
        let enqueue_ratio = ratio(&ours.enqueue, &peer.side.enqueue);
        let burn_down_ratio = ratio(&ours.burn_down, &peer.side.burn_down);
        process_min = process_min.min(process_ratio);
        enqueue_min = enqueue_min.min(enqueue_ratio);
        burn_down_min = burn_down_min.min(burn_down_ratio);
        if i == 0 {
            report.baseline(
                &format!("{label} process ({workers} workers)"),
                peer.side.process.per_s(),
                None,
            );
        } else {
            report.row(
                &format!("{label} process ({workers} workers)"),
                Some(peer.side.process.per_s()),
                None,
            );
        }
        report
            .row(
                &format!("{label} enqueue ({MAX_BATCH}/call)"),
                Some(peer.side.enqueue.per_s()),
                None,
            )
            .row(
                &format!("{label} burn-down (enqueue → all done)"),
                Some(peer.side.burn_down.per_s()),
                None,
            );
        peers_json.insert(
            peer.kind.name().into(),
            json!({
                "version": peer.version,
                "process_per_s": peer.side.process.per_s(),
                "enqueue_per_s": peer.side.enqueue.per_s(),
                "burn_down_per_s": peer.side.burn_down.per_s(),
                "process_ratio": process_ratio,
                "enqueue_ratio": enqueue_ratio,
                "burn_down_ratio": burn_down_ratio,
                "process_target_met": process_ratio >= 1.0,
                "enqueue_target_met": enqueue_ratio >= 1.0,
                "runs": peer.runs,
            }),
        );
        notes.push(format!(
            "processing: {process_ratio:.2}× {label} (target ≥ 1.0×: {}); enqueue:              {enqueue_ratio:.2}× (target ≥ 1.0×: {}); burn-down: {burn_down_ratio:.2}×",
            met(process_ratio >= 1.0),
            met(enqueue_ratio >= 1.0)
        ));
        notes.push(peer.kind.settings(workers));
    }
    let first_enqueue = theirs.first().map(|p| &p.side.enqueue);
    let http_enqueue_ratio = first_enqueue.map_or(0.0, |b| ratio(http_enqueue, b));
    let (process_met, enqueue_met) = (process_min >= 1.0, enqueue_min >= 1.0);
    let http_enqueue_met = http_enqueue_ratio >= 1.0;
    report
        .ratio_at_least(1.0)
        .target(
            "processing ≥ 1.0× and enqueue ≥ 1.0× every peer",
            process_met && enqueue_met,
        )
        .extra("peers", Value::Object(peers_json))
        .extra("per_round", Value::Array(per_round))
        .extra("process_ratio", process_min)
        .extra("enqueue_ratio", enqueue_min)
        .extra("burn_down_ratio", burn_down_min)
        .extra("process_target_met", process_met)
        .extra("enqueue_target_met", enqueue_met)
        .extra("http_enqueue_vs_peer", http_enqueue_ratio)
        .extra("http_enqueue_target_met", http_enqueue_met)
        .extra("tollgate_enqueue_per_s", ours.enqueue.per_s())
        .extra("tollgate_http_enqueue_per_s", http_enqueue.per_s())
        .extra("tollgate_burn_down_per_s", ours.burn_down.per_s());
    for note in notes {
        report.note(note);
    }
    report
        .note(format!(
            "enqueue over HTTP: {http_enqueue_ratio:.2}× the first peer's enqueue              (target ≥ 1.0×: {})",
            met(http_enqueue_met)
        ))
        .note("tollgate: instant provider, 16 connections")
        .note(
            "HTTP enqueue: one keep-alive HTTP/1.1 client, one call at a time, to an              in-process server over a second fresh database with no workers (its tasks              are never run)",
        );
    report.store_profile(&counting.counts().profile());
    report
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scenario_refuses_sqlite_and_a_missing_binary() {
        let bins = PeerBins {
            graphile: "/nonexistent/graphile-peer".into(),
            apalis: "/nonexistent/apalis-peer".into(),
        };
        let sqlite =
            preflight(BackendKind::Sqlite, &[PeerKind::Graphile], &bins).expect_err("sqlite");
        assert!(sqlite.to_string().contains("--backend postgres"));
        let absent =
            preflight(BackendKind::Postgres, &[PeerKind::Graphile], &bins).expect_err("missing");
        assert!(
            absent
                .to_string()
                .contains("cargo build --release --manifest-path")
        );
    }

    #[test]
    fn each_peer_runs_once_in_the_order_given() {
        use PeerKind::*;
        assert_eq!(
            distinct(&[Apalis, Graphile, Apalis, GraphileQueueWorkers]),
            vec![Apalis, Graphile, GraphileQueueWorkers]
        );
    }
}
