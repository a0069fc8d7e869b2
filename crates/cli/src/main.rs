//! `tollgate`: run the service (`serve`, `worker`, `migrate`), talk to a running one
//! (`submit`, `task`, `run`, `pipeline`), see it work (`demo`), measure it (`bench`).

mod client;
mod demo;
mod serve;

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about = "Durable, budgeted AI tasks: admission, exactly-once effects, caching, workers."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP API, the workers and the sweeper (embedded SQLite and the built-in dev
    /// provider unless configured otherwise).
    Serve(ServeArgs),
    /// Run workers and the sweeper without HTTP (a scale-out replica).
    Worker(WorkerArgs),
    /// Apply database migrations and exit.
    Migrate(DatabaseArgs),
    /// Submit a task to a running server (request JSON from a file or stdin).
    Submit(Box<client::SubmitArgs>),
    /// Read, wait for or cancel a task on a running server.
    #[command(subcommand)]
    Task(client::TaskCommand),
    /// Create, read or cancel a workflow run on a running server.
    #[command(subcommand)]
    Run(client::RunCommand),
    /// Register, read and run pipelines (durable DAGs of AI steps) on a running server.
    #[command(subcommand)]
    Pipeline(client::PipelineCommand),
    /// Show spend and tokens in the 24 h window: the app's, or one scope's (see
    /// docs/budgets.md, "Reading the usage endpoints").
    Usage(client::UsageArgs),
    /// Walk through Tollgate's guarantees on an embedded instance in a temporary folder.
    Demo,
    /// Measure Tollgate against baselines on a fresh database (see docs/benchmarks.md).
    #[cfg(feature = "bench")]
    Bench(Box<tollgate_bench::BenchArgs>),
}

/// Where configuration and the database come from.
#[derive(Debug, Clone, Args)]
struct DatabaseArgs {
    /// Configuration file (TOML). Every key can also be set as a TOLLGATE_* environment
    /// variable, with `__` between levels (TOLLGATE_WORKERS__CONCURRENCY=16).
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Database: sqlite://path (embedded) or postgres://user@host/db. Overrides
    /// [database] url.
    #[arg(long)]
    database_url: Option<String>,
}

#[derive(Debug, Clone, Args)]
struct ServeArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Listen address. Overrides [server] addr (default 127.0.0.1:8080).
    #[arg(long)]
    addr: Option<SocketAddr>,
    /// Concurrent task executions in this process; 0 runs the API only (tasks stay
    /// queued for other replicas). Overrides [workers] concurrency.
    #[arg(long)]
    workers: Option<u32>,
}

#[derive(Debug, Clone, Args)]
struct WorkerArgs {
    #[command(flatten)]
    database: DatabaseArgs,
    /// Concurrent task executions. Overrides [workers] concurrency.
    #[arg(long)]
    workers: Option<u32>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // A benchmark loads the database on purpose: sqlx's slow-statement and slow-acquire
    // warnings would bury the progress line.
    init_tracing(match cli.command {
        #[cfg(feature = "bench")]
        Command::Bench(_) => "warn,sqlx=error",
        _ => "warn",
    });
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Serve(args) => serve::serve(args).await,
            Command::Worker(args) => serve::worker(args).await,
            Command::Migrate(args) => serve::migrate(args).await,
            Command::Submit(args) => client::submit(*args).await,
            Command::Task(cmd) => client::task(cmd).await,
            Command::Run(cmd) => client::run(cmd).await,
            Command::Pipeline(cmd) => client::pipeline(cmd).await,
            Command::Usage(args) => client::usage(args).await,
            Command::Demo => demo::demo().await,
            #[cfg(feature = "bench")]
            Command::Bench(args) => tollgate_bench::bench(*args).await,
        }
    });
    // Blocking work still running (a CPU job told to stop, a stuck file read) must not
    // keep the process alive: the command is done.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_tracing(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TOLLGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
