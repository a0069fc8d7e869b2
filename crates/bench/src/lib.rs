//! `tollgate bench`: Tollgate's speed measured side by side with a baseline, in the same
//! run and on the same database, so a ratio holds on a noisy machine.
//!
//! Every scenario creates a fresh database (SQLite: a temporary folder; PostgreSQL:
//! `CREATE DATABASE` with a random name) and drops it at the end. Tollgate's side goes
//! through the public facade ([`Tollgate`]) — and, in `latency` and `peer`, also over HTTP,
//! through the product's own server started in-process (`http`); the baselines are the SQL
//! of [`baseline`].
//! Sides alternate in rounds, so a burst of noise from the rest of the machine hits both.
//! `docs/benchmarks.md` explains every scenario and keeps the latest figures.
//!
//! This crate is the whole benchmark: the `tollgate bench` command of the `tollgate`
//! binary only parses [`BenchArgs`] and calls [`bench`]. Nothing here is linked into the
//! store or the engine.

mod admission;
pub mod baseline;
mod burn_down;
mod cache;
mod counting;
mod database;
mod door;
mod door_peer;
mod fairness;
mod heartbeat;
mod http;
mod latency;
mod measure;
mod peer;
mod peers;
pub use peers::PeerKind;
mod report;
mod steady;
mod ttft;
mod upstream;
mod window;
mod work;

use crate::baseline::Baseline;
use anyhow::Context;
use clap::{Args, ValueEnum};
use counting::CountingStore;
#[cfg(test)]
use database::redact;
use database::{BenchDb, with_database};
pub use door_peer::{DoorPeerArgs, PeerGateway};
use measure::Progress;
use report::ScenarioReport;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Budget, ModelId};
use tollgate_engine::config::{BudgetPolicy, Limit, ModelConfig};
use tollgate_engine::provider::dev::DevProvider;
use tollgate_engine::{
    EngineConfig, Provider, ProviderAnswer, ProviderCall, ProviderError, Tollgate,
};
use tollgate_store::Store;
#[cfg(test)]
use work::classify;
use work::{
    bench_app, scope_ids, scoped, scoped_metered, secs, stored_classify, submit_all, submit_body,
    unscoped, wait_for, wall_clock,
};

/// The database a benchmark runs on when `--database-url` is not given and
/// `TOLLGATE_TEST_DATABASE_URL` is not set.
const DEFAULT_POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The app every benchmark task belongs to.
const BENCH_APP: &str = "bench";
/// The budget policy of every scoped benchmark task: limits that admit everything.
const BENCH_BUDGET: &str = "bench";
/// The same policy with docs/conformance.md#cost-limits's USD and token limits, set high enough to admit
/// everything: what the cost checks add to an admission.
const BENCH_METERED: &str = "bench-metered";
/// The model whose answers wait until the heartbeat scenario lets them go.
const HOLD_MODEL: &str = "hold";
/// The provider of [`HOLD_MODEL`].
const HOLD_PROVIDER: &str = "bench-hold";

/// `tollgate bench` arguments.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// What to measure (`all`: every scenario, one after the other).
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// The backend to measure. Every scenario gets a fresh database, dropped at the end.
    #[arg(long, value_enum, default_value_t = BackendKind::Sqlite)]
    pub backend: BackendKind,
    /// PostgreSQL server (any database on it) to create the fresh databases through
    /// (`--backend postgres`).
    #[arg(
        long,
        env = "TOLLGATE_TEST_DATABASE_URL",
        default_value = DEFAULT_POSTGRES_URL
    )]
    pub database_url: String,
    /// One JSON object per scenario on stdout (JSON Lines) instead of the tables.
    #[arg(long)]
    pub json: bool,
    /// Small sizes: each scenario runs in a few seconds (CI smoke runs).
    #[arg(long)]
    pub quick: bool,
    /// peer: the peers to measure against, comma-separated, each taking its turn every
    /// round (`graphile`: local queue 1000; `graphile-q-workers`: local queue of
    /// `--workers`; `apalis`: apalis-postgres).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "graphile")]
    pub peer: Vec<peer::PeerKind>,
    /// peer: the graphile_worker peer binary, built apart from the workspace with
    /// `cargo build --release --manifest-path bench/graphile-peer/Cargo.toml`.
    #[arg(long, default_value = peer::DEFAULT_GRAPHILE_BIN)]
    pub peer_bin: std::path::PathBuf,
    /// peer: the apalis-postgres peer binary, built apart from the workspace with
    /// `cargo build --release --manifest-path bench/apalis-peer/Cargo.toml`.
    #[arg(long, default_value = peer::DEFAULT_APALIS_BIN)]
    pub apalis_bin: std::path::PathBuf,
    #[command(flatten)]
    pub door_peer: DoorPeerArgs,
    #[command(flatten)]
    pub sizes: SizeArgs,
}

impl BenchArgs {
    /// Where the peer scenario's peer binaries are.
    fn peer_bins(&self) -> peers::PeerBins {
        peers::PeerBins {
            graphile: self.peer_bin.clone(),
            apalis: self.apalis_bin.clone(),
        }
    }
}

/// Size options; each defaults to a run of about a minute per scenario on a 2-core
/// machine, or a few seconds with `--quick`.
#[derive(Debug, Clone, Default, Args)]
pub struct SizeArgs {
    /// burn-down, peer: tasks per side; fairness: scope A's backlog [default: 20000;
    /// quick: 1000].
    #[arg(long)]
    pub tasks: Option<u64>,
    /// burn-down, latency: concurrent executions of Tollgate's worker pool and worker
    /// loops of the baseline [default: 8]; peer: Tollgate's and the peers'
    /// concurrency [default: 32].
    #[arg(long)]
    pub workers: Option<u32>,
    /// admission, admission-window, cache: concurrent clients [default: 8].
    #[arg(long)]
    pub clients: Option<usize>,
    /// admission, cache: scopes the clients spread over [default: 64].
    #[arg(long)]
    pub scopes: Option<usize>,
    /// admission, admission-window, cache, latency: measured time per side (per window
    /// for admission-window), e.g. `30s` [default: 30s; quick: 2s]; door: per phase
    /// (six phases) [default: 10s; quick: 1s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Rounds each side's time (or tasks) is split into; sides alternate round by round
    /// [default: 5; quick: 1; peer: 1].
    #[arg(long)]
    pub rounds: Option<u32>,
    /// admission-window: admission records in the small window [default: 1000].
    #[arg(long)]
    pub small_window: Option<u64>,
    /// admission-window: admission records in the large window [default: 1000000;
    /// quick: 20000].
    #[arg(long)]
    pub large_window: Option<u64>,
    /// heartbeat: running tasks to hold, one measurement each [default: 100,10000;
    /// quick: 100,1000].
    #[arg(long, value_delimiter = ',')]
    pub running: Option<Vec<u64>>,
    /// heartbeat: worker pools holding them (each one process's pool) [default: 4].
    #[arg(long)]
    pub heartbeat_workers: Option<u32>,
    /// heartbeat: how long the tasks are held and heartbeats counted [default: 20s;
    /// quick: 3s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub hold: Option<Duration>,
    /// heartbeat: the pools' heartbeat interval [default: 1s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// ttft: streamed calls per side [default: 200; quick: 20].
    #[arg(long)]
    pub calls: Option<u64>,
    /// steady-state: tasks run through between the fresh and the later burn-down
    /// [default: 100000; quick: 3000].
    #[arg(long)]
    pub history: Option<u64>,
}

/// What to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Submit N unscoped tasks, then W workers run them all (vs the raw SQL lifecycle),
    /// with docs/conformance.md#fair-share fairness on and off.
    BurnDown,
    /// docs/conformance.md#fair-share: scope B's 200 tasks behind scope A's backlog of N vs with no backlog.
    Fairness,
    /// 8 clients admit scoped tasks over 64 scopes (vs the reference design's admission
    /// behind one global lock).
    Admission,
    /// Admissions into ONE scope with a small and a large 24 h window (large / small).
    AdmissionWindow,
    /// Submissions that are all cache hits (vs a raw indexed lookup and insert).
    Cache,
    /// Heartbeat writes while R tasks run on W worker pools.
    Heartbeat,
    /// Submit → result with an instant provider, one client, through the facade and over
    /// HTTP (`POST /v1/tasks?wait=`) (vs the raw SQL lifecycle).
    Latency,
    /// PostgreSQL only: enqueue N with `submit_many`, then W = 32 workers run them, vs
    /// the `--peer` job queues (graphile_worker, apalis-postgres: child processes) on the
    /// same server; and N more
    /// enqueued over HTTP (`POST /v1/tasks/batch`) into a database of their own, never run.
    /// Not part of `all`: the peer binary is built apart from the workspace.
    Peer,
    /// The OpenAI-compatible door over a fake upstream: added p50/p99 at 50 calls/s and
    /// max calls/s at 32 connections, one scope and 64 scopes (vs the direct call).
    Door,
    /// Time to first token of a streamed chat completion through the OpenAI door (a new
    /// durable task each) vs the same call straight to an in-process fake upstream.
    Ttft,
    /// The burn-down rate on a fresh database vs after 100,000 more tasks went through
    /// (PostgreSQL with autovacuum off).
    SteadyState,
    /// Every scenario, one after the other (all but `peer`).
    All,
}

impl Scenario {
    /// What `all` runs: every scenario but `peer`, which needs a binary the workspace
    /// does not build.
    const EACH: [Scenario; 10] = [
        Scenario::BurnDown,
        Scenario::Fairness,
        Scenario::Admission,
        Scenario::AdmissionWindow,
        Scenario::Cache,
        Scenario::Heartbeat,
        Scenario::Latency,
        Scenario::Door,
        Scenario::Ttft,
        Scenario::SteadyState,
    ];

    /// The scenario's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Scenario::BurnDown => "burn-down",
            Scenario::Fairness => "fairness",
            Scenario::Admission => "admission",
            Scenario::AdmissionWindow => "admission-window",
            Scenario::Cache => "cache",
            Scenario::Heartbeat => "heartbeat",
            Scenario::Latency => "latency",
            Scenario::Peer => "peer",
            Scenario::Door => "door",
            Scenario::Ttft => "ttft",
            Scenario::SteadyState => "steady-state",
            Scenario::All => "all",
        }
    }
}

/// A storage backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// Embedded SQLite in a temporary folder.
    Sqlite,
    /// A fresh PostgreSQL database (CREATE DATABASE, dropped at the end).
    Postgres,
}

impl BackendKind {
    /// The backend's name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Sqlite => "sqlite",
            BackendKind::Postgres => "postgres",
        }
    }
}

/// Sizes with the defaults filled in.
#[derive(Debug, Clone)]
pub struct Sizes {
    tasks: u64,
    workers: u32,
    /// `--workers` for the peer scenario (its own default).
    peer_workers: u32,
    /// `--rounds` for the peer scenario (its own default).
    peer_rounds: u32,
    clients: usize,
    scopes: usize,
    duration: Duration,
    /// `--duration` for the door scenario: each of its phases (its own default).
    door_duration: Duration,
    rounds: u32,
    small_window: u64,
    large_window: u64,
    running: Vec<u64>,
    heartbeat_workers: u32,
    hold: Duration,
    heartbeat_interval: Duration,
    calls: u64,
    history: u64,
}

impl Sizes {
    fn resolve(args: &SizeArgs, quick: bool) -> anyhow::Result<Sizes> {
        fn pick<T>(quick: bool, full: T, small: T) -> T {
            if quick { small } else { full }
        }
        let sizes = Sizes {
            tasks: args.tasks.unwrap_or(pick(quick, 20_000, 1_000)),
            workers: args.workers.unwrap_or(8),
            peer_workers: args.workers.unwrap_or(peer::DEFAULT_WORKERS),
            peer_rounds: args.rounds.unwrap_or(1),
            clients: args.clients.unwrap_or(8),
            scopes: args.scopes.unwrap_or(64),
            duration: args.duration.unwrap_or(pick(
                quick,
                Duration::from_secs(30),
                Duration::from_secs(2),
            )),
            door_duration: args.duration.unwrap_or(pick(
                quick,
                Duration::from_secs(10),
                Duration::from_secs(1),
            )),
            rounds: args.rounds.unwrap_or(pick(quick, 5, 1)),
            small_window: args.small_window.unwrap_or(1_000),
            large_window: args.large_window.unwrap_or(pick(quick, 1_000_000, 20_000)),
            running: args
                .running
                .clone()
                .unwrap_or_else(|| pick(quick, vec![100, 10_000], vec![100, 1_000])),
            heartbeat_workers: args.heartbeat_workers.unwrap_or(4),
            hold: args
                .hold
                .unwrap_or(pick(quick, Duration::from_secs(20), Duration::from_secs(3))),
            heartbeat_interval: args.heartbeat_interval.unwrap_or(Duration::from_secs(1)),
            calls: args.calls.unwrap_or(pick(quick, 200, 20)),
            history: args.history.unwrap_or(pick(quick, 100_000, 3_000)),
        };
        anyhow::ensure!(sizes.tasks > 0, "--tasks must be positive");
        anyhow::ensure!(sizes.workers > 0, "--workers must be positive");
        anyhow::ensure!(sizes.clients > 0, "--clients must be positive");
        anyhow::ensure!(sizes.scopes > 0, "--scopes must be positive");
        anyhow::ensure!(sizes.rounds > 0, "--rounds must be positive");
        anyhow::ensure!(sizes.calls > 0, "--calls must be positive");
        anyhow::ensure!(!sizes.duration.is_zero(), "--duration must be positive");
        anyhow::ensure!(sizes.small_window > 0, "--small-window must be positive");
        anyhow::ensure!(
            sizes.large_window >= sizes.small_window,
            "--large-window must be at least --small-window"
        );
        anyhow::ensure!(
            !sizes.running.is_empty() && sizes.running.iter().all(|&r| r > 0),
            "--running must list positive numbers"
        );
        anyhow::ensure!(
            sizes.heartbeat_workers > 0,
            "--heartbeat-workers must be positive"
        );
        anyhow::ensure!(
            !sizes.heartbeat_interval.is_zero() && sizes.hold >= sizes.heartbeat_interval,
            "--hold must be at least one --heartbeat-interval"
        );
        Ok(sizes)
    }

    /// Each side's time of one round.
    fn round_duration(&self) -> Duration {
        self.duration / self.rounds
    }
}

/// Runs `tollgate bench`.
pub async fn bench(args: BenchArgs) -> anyhow::Result<()> {
    let sizes = Sizes::resolve(&args.sizes, args.quick)?;
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => Scenario::EACH.to_vec(),
        one => vec![one],
    };
    let mut reports = Vec::new();
    for scenario in scenarios {
        let report = run_scenario(scenario, &args, &sizes)
            .await
            .with_context(|| format!("bench {} on {}", scenario.name(), args.backend.name()))?;
        if args.json {
            println!("{}", report.to_json());
        } else {
            report.print();
        }
        reports.push(report);
    }
    if !args.json && reports.len() > 1 {
        report::print_summary(&reports);
    }
    Ok(())
}

/// One scenario on a fresh database, dropped afterwards whatever happened.
async fn run_scenario(
    scenario: Scenario,
    args: &BenchArgs,
    sizes: &Sizes,
) -> anyhow::Result<ScenarioReport> {
    if scenario == Scenario::Peer {
        peer::preflight(args.backend, &args.peer, &args.peer_bins())?;
    }
    if scenario == Scenario::Door {
        args.door_peer.preflight()?;
    }
    let progress = Progress::start(format!("{} {}", scenario.name(), args.backend.name()));
    progress.stage("creating a fresh database");
    let db = BenchDb::create(args.backend, &args.database_url).await?;
    let ctx = Ctx {
        backend: args.backend,
        sizes: sizes.clone(),
        progress: progress.clone(),
        db,
        database_url: args.database_url.clone(),
        peers: args.peer.clone(),
        peer_bins: args.peer_bins(),
        door_peer: args.door_peer.clone(),
    };
    let result = match scenario {
        Scenario::BurnDown => burn_down::run(&ctx).await,
        Scenario::Fairness => fairness::run(&ctx).await,
        Scenario::Admission => admission::run(&ctx).await,
        Scenario::AdmissionWindow => window::run(&ctx).await,
        Scenario::Cache => cache::run(&ctx).await,
        Scenario::Heartbeat => heartbeat::run(&ctx).await,
        Scenario::Latency => latency::run(&ctx).await,
        Scenario::Peer => peer::run(&ctx).await,
        Scenario::Door => door::run(&ctx).await,
        Scenario::Ttft => ttft::run(&ctx).await,
        Scenario::SteadyState => steady::run(&ctx).await,
        Scenario::All => Err(anyhow::anyhow!("`all` is not one scenario")),
    };
    progress.stage("dropping the database");
    let dropped = ctx.db.drop().await;
    progress.finish();
    let report = result?;
    dropped?;
    Ok(report)
}

/// What a scenario runs with.
pub(crate) struct Ctx {
    backend: BackendKind,
    sizes: Sizes,
    progress: Progress,
    db: BenchDb,
    /// The PostgreSQL server's URL the fresh databases are created through.
    database_url: String,
    /// The peer scenario's peers (`--peer`).
    peers: Vec<peer::PeerKind>,
    /// The peer scenario's peer binaries.
    peer_bins: peers::PeerBins,
    /// The door scenario's optional peer gateway.
    door_peer: DoorPeerArgs,
}

impl Ctx {
    /// A report of this scenario on this backend.
    fn report(&self, scenario: Scenario) -> ScenarioReport {
        ScenarioReport::new(scenario.name(), self.backend.name())
    }

    /// The raw store with a counting wrapper, for one engine (or several sharing it).
    fn counting_store(&self) -> CountingStore {
        CountingStore::new(self.db.store.clone())
    }

    /// Like [`counting_store`](Self::counting_store), claiming oldest first across
    /// everything (docs/conformance.md#fair-share fairness off), on the same database and pool.
    fn counting_store_oldest_first(&self) -> CountingStore {
        CountingStore::new(self.db.store_ordered(tollgate_store::ClaimOrder::Oldest))
    }

    /// The baseline on the same database.
    fn baseline(&self) -> &Baseline {
        &self.db.baseline
    }

    /// An engine over `store` with the benchmark configuration and `workers` executions.
    fn tollgate(
        &self,
        store: &CountingStore,
        workers: u32,
        hold: Option<Arc<HoldProvider>>,
    ) -> anyhow::Result<Tollgate> {
        self.tollgate_with(store, workers, hold, true)
    }

    /// [`tollgate`](Self::tollgate) with docs/conformance.md#fair-share fairness on or off (`store` must claim
    /// in the matching order).
    fn tollgate_with(
        &self,
        store: &CountingStore,
        workers: u32,
        hold: Option<Arc<HoldProvider>>,
        fair: bool,
    ) -> anyhow::Result<Tollgate> {
        let store: Arc<dyn Store> = Arc::new(store.clone());
        // Engines that hold nothing still know the hold model, answering it at once.
        let hold = hold.unwrap_or_else(|| {
            let released = HoldProvider::new();
            released.release();
            Arc::new(released)
        });
        let mut config = engine_config(workers, &self.sizes);
        config.dispatch.fairness = fair;
        Ok(Tollgate::builder(store, config)
            .provider(HOLD_PROVIDER, hold)
            .build()?)
    }
}

/// The engine configuration of every benchmark: the built-in `dev` provider with no
/// latency (an instant provider) as the default model, a `hold` model for the heartbeat
/// scenario, and a default budget policy that admits everything.
fn engine_config(workers: u32, sizes: &Sizes) -> EngineConfig {
    let mut config = EngineConfig::default();
    let unlimited = Limit::Integer(i64::from(u32::MAX));
    config.budgets.insert(
        BENCH_BUDGET.to_string(),
        BudgetPolicy {
            weight: Limit::Integer(1),
            max_steps_per_source: unlimited,
            sources_per_24_hours: unlimited,
            scope_concurrent: unlimited,
            burst: unlimited,
            tasks_per_minute: unlimited,
            usd_per_24_hours: None,
            tokens_per_minute: None,
            token_burst: None,
        },
    );
    config.budgets.insert(
        BENCH_METERED.to_string(),
        BudgetPolicy {
            max_steps_per_source: unlimited,
            sources_per_24_hours: unlimited,
            scope_concurrent: unlimited,
            burst: unlimited,
            tasks_per_minute: unlimited,
            usd_per_24_hours: Some(1.0e9),
            tokens_per_minute: Some(unlimited),
            token_burst: Some(unlimited),
            weight: Limit::Integer(1),
        },
    );
    config.default_budget = BENCH_BUDGET.to_string();
    config.apps.insert(
        BENCH_APP.to_string(),
        tollgate_engine::config::AppConfig {
            default_budget: Some(BENCH_BUDGET.to_string()),
            allowed_budgets: Some(vec![BENCH_BUDGET.to_string(), BENCH_METERED.to_string()]),
            api_keys: None,
            usd_per_24_hours: None,
            global_concurrent_share: None,
            trace_content: false,
            max_attempts: None,
        },
    );
    // Every scoped task is reserved (priced, bounded), with or without cost limits.
    if let Some(default) = config.models.get_mut(&config.default_model) {
        default.max_output_tokens = Some(64);
        default.prices = Some(tollgate_engine::config::ModelPrices {
            input_per_million: 0.15,
            output_per_million: 0.60,
            cached_input_per_million: None,
            cache_write_input_per_million: None,
        });
    }
    config.admission.global_concurrent = unlimited;
    config.models.insert(
        HOLD_MODEL.to_string(),
        ModelConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            provider: HOLD_PROVIDER.to_string(),
            model: "hold-1".to_string(),
            params: Default::default(),
            prices: None,
            max_output_tokens: None,
            ..ModelConfig::default()
        },
    );
    config.workers.concurrency = workers;
    config.workers.heartbeat_interval = sizes.heartbeat_interval;
    // Heartbeats every interval; a task is declared dead only after several missed.
    config.sweeper.liveness_timeout = (sizes.heartbeat_interval * 10).max(Duration::from_secs(30));
    config
}

/// The budget the baselines admit under: the same limits as [`BENCH_BUDGET`].
fn bench_budget() -> Budget {
    Budget::unlimited()
}

/// The hold model's id.
fn hold_model() -> anyhow::Result<ModelId> {
    Ok(ModelId::new(HOLD_MODEL)?)
}

/// A provider whose answers wait until [`HoldProvider::release`]: it keeps tasks running
/// for as long as the heartbeat scenario needs them to.
#[derive(Debug)]
pub(crate) struct HoldProvider {
    released: tokio::sync::watch::Sender<bool>,
}

impl HoldProvider {
    fn new() -> HoldProvider {
        HoldProvider {
            released: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Lets every held answer (and every later one) go.
    fn release(&self) {
        self.released.send_replace(true);
    }
}

#[async_trait::async_trait]
impl Provider for HoldProvider {
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        let mut released = self.released.subscribe();
        // An error means the sender is gone, which releases too.
        let _ = released.wait_for(|go| *go).await;
        DevProvider::answer(call.model, call.request, call.output_schema)
    }
}

#[cfg(test)]
mod tests;
