//! `graphile-peer`: graphile_worker (the Rust crate) measured the way `tollgate bench peer`
//! measures Tollgate, so the two can be compared in the same run on the same server.
//!
//! 1. Resets its schema in the given database (`DROP SCHEMA … CASCADE`), then lets the
//!    worker's `init()` run graphile_worker's migrations.
//! 2. Enqueues N no-op jobs through `WorkerUtils::add_jobs` (one SQL call per batch of
//!    `--batch`): enqueue/s = N ÷ (first batch sent → last batch answered).
//! 3. Starts one worker with the crate's throughput settings (a local queue that
//!    batch-fetches jobs, batched completions and failures, a short poll interval) and
//!    concurrency `--workers`: process/s = N ÷ (worker start → no job row left, i.e. every
//!    completion committed).
//! 4. burn-down/s = N ÷ (enqueue start → no job row left).
//!
//! Output: a small table, or with `--json` one JSON object on stdout.
//!
//! This project is not a member of Tollgate's workspace: it is built on its own
//! (`cargo build --release --manifest-path bench/graphile-peer/Cargo.toml`) and never
//! compiled by `cargo test --workspace`.

use anyhow::{Context, bail, ensure};
use graphile_worker::{
    IntoTaskHandlerResult, JobSpec, LocalQueueConfig, TaskHandler, WorkerContext, WorkerOptions,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: graphile-peer --database-url URL [options]

  --database-url URL       PostgreSQL database to run in (its schema is reset)
  --schema NAME            graphile_worker's schema [default: graphile_worker]
  --jobs N                 no-op jobs to enqueue and run [default: 20000]
  --workers N              the worker's concurrency [default: 32]
  --batch N                jobs per add_jobs call [default: 1000]
  --local-queue-size N     jobs the local queue fetches at once [default: 1000]
  --poll-interval-ms N     the worker's poll interval [default: 10]
  --batch-delay-ms N       completion/failure batching delay [default: 5]
  --max-connections N      the worker's connection pool [default: 20, the crate's]
  --json                   one JSON object on stdout instead of the table
";

/// The command line, with the defaults filled in.
#[derive(Debug, Clone)]
struct Args {
    database_url: String,
    schema: String,
    jobs: u64,
    workers: usize,
    batch: usize,
    local_queue_size: usize,
    poll_interval: Duration,
    batch_delay: Duration,
    max_connections: u32,
    json: bool,
}

impl Args {
    fn parse(mut argv: impl Iterator<Item = String>) -> anyhow::Result<Args> {
        let mut database_url = None;
        let mut args = Args {
            database_url: String::new(),
            schema: "graphile_worker".to_string(),
            jobs: 20_000,
            workers: 32,
            batch: 1_000,
            local_queue_size: 1_000,
            poll_interval: Duration::from_millis(10),
            batch_delay: Duration::from_millis(5),
            max_connections: 20,
            json: false,
        };
        while let Some(arg) = argv.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = || -> anyhow::Result<String> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => argv
                        .next()
                        .with_context(|| format!("{flag} needs a value\n\n{USAGE}")),
                }
            };
            match flag.as_str() {
                "--database-url" => database_url = Some(value()?),
                "--schema" => args.schema = value()?,
                "--jobs" => args.jobs = number(&flag, &value()?)?,
                "--workers" => args.workers = number(&flag, &value()?)?,
                "--batch" => args.batch = number(&flag, &value()?)?,
                "--local-queue-size" => args.local_queue_size = number(&flag, &value()?)?,
                "--poll-interval-ms" => {
                    args.poll_interval = Duration::from_millis(number(&flag, &value()?)?)
                }
                "--batch-delay-ms" => {
                    args.batch_delay = Duration::from_millis(number(&flag, &value()?)?)
                }
                "--max-connections" => args.max_connections = number(&flag, &value()?)?,
                "--json" => args.json = true,
                "-h" | "--help" => {
                    print!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other}\n\n{USAGE}"),
            }
        }
        args.database_url =
            database_url.with_context(|| format!("--database-url is required\n\n{USAGE}"))?;
        ensure!(args.jobs > 0, "--jobs must be positive");
        ensure!(args.workers > 0, "--workers must be positive");
        ensure!(args.batch > 0, "--batch must be positive");
        ensure!(
            args.local_queue_size > 0,
            "--local-queue-size must be positive"
        );
        ensure!(
            !args.poll_interval.is_zero(),
            "--poll-interval-ms must be positive"
        );
        ensure!(
            args.max_connections > 0,
            "--max-connections must be positive"
        );
        ensure!(
            !args.schema.is_empty()
                && args
                    .schema
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                && !args.schema.starts_with(|c: char| c.is_ascii_digit()),
            "--schema must be a plain lowercase identifier"
        );
        Ok(args)
    }
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> anyhow::Result<T> {
    value
        .parse()
        .map_err(|_| anyhow::anyhow!("{flag}: {value:?} is not a number"))
}

/// The graphile_worker version this binary was built with, read from its Cargo.lock.
fn graphile_worker_version() -> &'static str {
    let lock = include_str!("../Cargo.lock");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == r#"name = "graphile_worker""#
            && let Some(version) = lines
                .next()
                .and_then(|v| v.trim().strip_prefix("version = \""))
                .and_then(|v| v.strip_suffix('"'))
        {
            return version;
        }
    }
    "unknown"
}

/// What the handler counts: jobs run, and when the first one started.
#[derive(Debug, Clone, Default)]
struct Progress {
    ran: Arc<AtomicU64>,
    first_start: Arc<OnceLock<Instant>>,
}

/// The no-op job: its handler only counts.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Noop {
    i: u64,
}

impl TaskHandler for Noop {
    const IDENTIFIER: &'static str = "noop";

    async fn run(self, ctx: WorkerContext) -> impl IntoTaskHandlerResult {
        if let Some(progress) = ctx.get_ext::<Progress>() {
            progress.first_start.get_or_init(Instant::now);
            progress.ran.fetch_add(1, Ordering::Relaxed);
        }
        Ok::<(), String>(())
    }
}

/// What one run measured.
struct Figures {
    enqueue: Duration,
    process: Duration,
    burn_down: Duration,
    first_job_after_start: Option<Duration>,
}

fn per_s(n: u64, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 { n as f64 / s } else { 0.0 }
}

/// Generous: a run that stalls fails rather than hangs.
fn timeout_for(n: u64) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(n.saturating_mul(20))
}

async fn measure(args: &Args) -> anyhow::Result<Figures> {
    let pool = PgPoolOptions::new()
        .max_connections(args.max_connections)
        .connect(&args.database_url)
        .await
        .context("cannot connect to --database-url")?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{}\" CASCADE",
        args.schema
    )))
    .execute(&pool)
    .await
    .context("cannot reset the schema")?;

    let progress = Progress::default();
    // init() runs graphile_worker's migrations and registers the task; nothing runs yet.
    let worker = WorkerOptions::default()
        .pg_pool(pool.clone())
        .schema(&args.schema)
        .concurrency(args.workers)
        .poll_interval(args.poll_interval)
        .complete_job_batch_delay(args.batch_delay)
        .fail_job_batch_delay(args.batch_delay)
        .local_queue(LocalQueueConfig::default().with_size(args.local_queue_size))
        .add_extension(progress.clone())
        .define_job::<Noop>()
        .init()
        .await
        .context("graphile_worker init (migrations) failed")?;
    let worker = Arc::new(worker);
    let utils = worker.create_utils();

    // Enqueue: one add_jobs call (one SQL statement) per batch.
    let spec = JobSpec::default();
    let start = Instant::now();
    let mut next = 0u64;
    while next < args.jobs {
        let end = (next + args.batch as u64).min(args.jobs);
        let batch: Vec<(Noop, &JobSpec)> = (next..end).map(|i| (Noop { i }, &spec)).collect();
        let added = utils
            .add_jobs::<Noop>(&batch)
            .await
            .context("add_jobs failed")?;
        ensure!(
            added.len() == batch.len(),
            "add_jobs added {} of {}",
            added.len(),
            batch.len()
        );
        next = end;
    }
    let enqueued = Instant::now();
    let rows = job_rows(&pool, &args.schema).await?;
    ensure!(
        rows == args.jobs,
        "{rows} job rows after enqueuing {}",
        args.jobs
    );

    // Process: start the worker, wait until the handler ran every job, then until every
    // completion is committed (graphile_worker deletes a job row when it completes it).
    let worker_start = Instant::now();
    let runner = {
        let worker = worker.clone();
        tokio::spawn(async move { worker.run().await })
    };
    let deadline = worker_start + timeout_for(args.jobs);
    let waited = async {
        while progress.ran.load(Ordering::Relaxed) < args.jobs {
            ensure!(
                Instant::now() < deadline,
                "only {} of {} jobs ran",
                progress.ran.load(Ordering::Relaxed),
                args.jobs
            );
            ensure!(!runner.is_finished(), "the worker stopped early");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        loop {
            let left = job_rows(&pool, &args.schema).await?;
            if left == 0 {
                return anyhow::Ok(Instant::now());
            }
            ensure!(
                Instant::now() < deadline,
                "{left} job rows left after every job ran"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    .await;
    worker.request_shutdown();
    let stopped = tokio::time::timeout(Duration::from_secs(30), runner).await;
    let done = waited?;
    match stopped {
        Ok(joined) => joined
            .context("the worker panicked")?
            .context("the worker failed")?,
        Err(_) => bail!("the worker did not shut down within 30 s"),
    }
    let ran = progress.ran.load(Ordering::Relaxed);
    ensure!(
        ran == args.jobs,
        "{ran} jobs ran for {} enqueued",
        args.jobs
    );
    pool.close().await;
    Ok(Figures {
        enqueue: enqueued - start,
        process: done - worker_start,
        burn_down: done - start,
        first_job_after_start: progress.first_start.get().map(|t| *t - worker_start),
    })
}

/// Rows in graphile_worker's jobs table (queued, running, or completed but not yet
/// deleted by a completion batch).
async fn job_rows(pool: &sqlx::PgPool, schema: &str) -> anyhow::Result<u64> {
    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM \"{schema}\"._private_jobs"
    )))
    .fetch_one(pool)
    .await
    .context("cannot count graphile_worker's job rows")?;
    Ok(n as u64)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse(std::env::args().skip(1))?;
    let figures = measure(&args).await?;
    let n = args.jobs;
    let (enqueue, process, burn_down) = (
        per_s(n, figures.enqueue),
        per_s(n, figures.process),
        per_s(n, figures.burn_down),
    );
    if args.json {
        println!(
            "{}",
            json!({
                "peer": "graphile_worker",
                "version": graphile_worker_version(),
                "jobs": n,
                "workers": args.workers,
                "batch": args.batch,
                "enqueue_per_s": enqueue,
                "process_per_s": process,
                "burn_down_per_s": burn_down,
                "enqueue_s": figures.enqueue.as_secs_f64(),
                "process_s": figures.process.as_secs_f64(),
                "first_job_after_start_s": figures.first_job_after_start.map(|d| d.as_secs_f64()),
                "settings": {
                    "local_queue_size": args.local_queue_size,
                    "poll_interval_ms": args.poll_interval.as_millis() as u64,
                    "complete_job_batch_delay_ms": args.batch_delay.as_millis() as u64,
                    "fail_job_batch_delay_ms": args.batch_delay.as_millis() as u64,
                    "max_connections": args.max_connections,
                },
            })
        );
    } else {
        println!(
            "graphile_worker {} (jobs={n}, workers={}, batch={}, local_queue_size={}, poll_interval={:?}, batch_delay={:?}, max_connections={})",
            graphile_worker_version(),
            args.workers,
            args.batch,
            args.local_queue_size,
            args.poll_interval,
            args.batch_delay,
            args.max_connections
        );
        println!("  {:<28} {:>12}", "", "per s");
        println!("  {:<28} {enqueue:>12.1}", "enqueue (add_jobs batches)");
        println!("  {:<28} {process:>12.1}", "process (start → all done)");
        println!("  {:<28} {burn_down:>12.1}", "burn-down (enqueue → done)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Args> {
        Args::parse(args.iter().map(|s| s.to_string()))
    }

    #[test]
    fn defaults_and_flags() {
        let a = parse(&["--database-url", "postgres://x/y"]).expect("args");
        assert_eq!(
            (a.jobs, a.workers, a.batch, a.json),
            (20_000, 32, 1_000, false)
        );
        let a = parse(&["--database-url=postgres://x/y", "--jobs", "5", "--json"]).expect("args");
        assert_eq!((a.jobs, a.json), (5, true));
        assert!(parse(&["--jobs", "5"]).is_err());
        assert!(parse(&["--database-url", "u", "--schema", "x; drop"]).is_err());
    }

    #[test]
    fn the_version_comes_from_the_lock() {
        assert!(graphile_worker_version().starts_with("0."));
    }
}
