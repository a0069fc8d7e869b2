//! apalis-postgres, measured the way `tollgate bench peer` measures Tollgate.
//!
//! 1. Resets apalis's schema in `--database-url` (`DROP SCHEMA apalis CASCADE`: its jobs,
//!    workers and migration history), then runs `PostgresStorage::setup` (its migrations).
//! 2. Enqueues N no-op jobs through `apalis_postgres::queries::push_tasks` (the crate's
//!    batch insert: one SQL statement per batch of `--batch`, in one transaction):
//!    enqueue/s = N ÷ (first batch sent → last batch committed).
//! 3. Starts one worker built the crate's documented way (`WorkerBuilder` with
//!    `.concurrency(W).parallelize(tokio::spawn)` over a `PostgresStorage` whose `Config`
//!    fetches `--fetch-batch` jobs per poll, with `LISTEN/NOTIFY` wake-ups and polling):
//!    process/s = N ÷ (worker start → every job row `Done`, i.e. every completion
//!    committed). apalis keeps a row per job (its status and result), as Tollgate does.
//! 4. burn-down/s = N ÷ (enqueue start → every job row `Done`).
//!
//! Output: a small table, or with `--json` one JSON object on stdout.
//!
//! This project is not a member of Tollgate's workspace: it is built on its own
//! (`cargo build --release --manifest-path bench/apalis-peer/Cargo.toml`) and never
//! compiled by `cargo test --workspace`.

use anyhow::{Context, bail, ensure};
use apalis::prelude::*;
use apalis_postgres::{Config, PgTask, PostgresStorage};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: apalis-peer --database-url URL [options]

  --database-url URL       PostgreSQL database to run in (its `apalis` schema is reset)
  --jobs N                 no-op jobs to enqueue and run [default: 20000]
  --workers N              the worker's concurrency [default: 32]
  --batch N                jobs per push_tasks call [default: 1000]
  --fetch-batch N          jobs one poll fetches (Config::batch_size) [default: the workers]
  --max-connections N      the pool's connections [default: 10, sqlx's]
  --json                   one JSON object on stdout instead of the table
";

/// The queue (apalis's `job_type`) the jobs go to.
const QUEUE: &str = "noop";

/// The command line, with the defaults filled in.
#[derive(Debug, Clone)]
struct Args {
    database_url: String,
    jobs: u64,
    workers: usize,
    batch: usize,
    fetch_batch: Option<usize>,
    max_connections: u32,
    json: bool,
}

impl Args {
    fn parse(mut argv: impl Iterator<Item = String>) -> anyhow::Result<Args> {
        let mut database_url = None;
        let mut args = Args {
            database_url: String::new(),
            jobs: 20_000,
            workers: 32,
            batch: 1_000,
            fetch_batch: None,
            max_connections: 10,
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
                "--jobs" => args.jobs = number(&flag, &value()?)?,
                "--workers" => args.workers = number(&flag, &value()?)?,
                "--batch" => args.batch = number(&flag, &value()?)?,
                "--fetch-batch" => args.fetch_batch = Some(number(&flag, &value()?)?),
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
            args.fetch_batch != Some(0),
            "--fetch-batch must be positive"
        );
        ensure!(
            args.max_connections > 0,
            "--max-connections must be positive"
        );
        Ok(args)
    }

    fn fetch_batch(&self) -> usize {
        self.fetch_batch.unwrap_or(self.workers)
    }
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> anyhow::Result<T> {
    value
        .parse()
        .map_err(|_| anyhow::anyhow!("{flag}: {value:?} is not a number"))
}

/// The version of `name` this binary was built with, read from its Cargo.lock.
fn locked_version(name: &str) -> &'static str {
    let lock = include_str!("../Cargo.lock");
    let wanted = format!("name = \"{name}\"");
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line.trim() == wanted
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

/// The no-op job.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Noop {
    i: u64,
}

/// The no-op handler: it only counts.
async fn noop(_job: Noop, progress: Data<Progress>) -> Result<(), BoxDynError> {
    progress.first_start.get_or_init(Instant::now);
    progress.ran.fetch_add(1, Ordering::Relaxed);
    Ok(())
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
    sqlx::raw_sql("DROP SCHEMA IF EXISTS apalis CASCADE")
        .execute(&pool)
        .await
        .context("cannot reset apalis's schema")?;
    PostgresStorage::setup(&pool)
        .await
        .context("apalis-postgres setup (migrations) failed")?;

    // Enqueue: one push_tasks call (one INSERT … SELECT unnest(…)) per batch.
    let start = Instant::now();
    let mut next = 0u64;
    while next < args.jobs {
        let end = (next + args.batch as u64).min(args.jobs);
        let mut tasks: Vec<PgTask> = Vec::with_capacity((end - next) as usize);
        for i in next..end {
            tasks.push(TaskBuilder::new(serde_json::to_vec(&Noop { i })?).build());
        }
        let mut tx = pool.begin().await?;
        apalis_postgres::queries::push_tasks(&mut *tx, QUEUE, tasks)
            .await
            .context("push_tasks failed")?;
        tx.commit().await?;
        next = end;
    }
    let enqueued = Instant::now();
    let (pending, _) = job_rows(&pool).await?;
    ensure!(
        pending == args.jobs,
        "{pending} job rows to do after enqueuing {}",
        args.jobs
    );

    // Process: start the worker, wait until the handler ran every job, then until every
    // row is `Done` (apalis acknowledges completions in batches).
    let progress = Progress::default();
    let config = Config::default()
        .queue(QUEUE)
        .batch_size(args.fetch_batch());
    let backend = PostgresStorage::<Noop>::new(&pool)
        .with_config(config)
        .with_pubsub();
    let worker = WorkerBuilder::new("apalis-peer")
        .backend(backend)
        .concurrency(args.workers)
        .parallelize(tokio::spawn)
        .data(progress.clone())
        .build(noop);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let worker_start = Instant::now();
    let runner = tokio::spawn(worker.run_until(async move {
        let _ = stop_rx.await;
        Ok::<(), std::io::Error>(())
    }));
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
            let (left, failed) = job_rows(&pool).await?;
            ensure!(failed == 0, "{failed} jobs did not end `Done`");
            if left == 0 {
                return anyhow::Ok(Instant::now());
            }
            ensure!(
                Instant::now() < deadline,
                "{left} job rows not `Done` after every job ran"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    .await;
    let _ = stop_tx.send(());
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

/// The queue's job rows not yet `Done` (pending, running, or run but not yet
/// acknowledged), and those of them that ended otherwise (failed or killed).
async fn job_rows(pool: &sqlx::PgPool) -> anyhow::Result<(u64, u64)> {
    let (left, failed): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE status <> 'Done'), \
                count(*) FILTER (WHERE status IN ('Failed', 'Killed')) \
         FROM apalis.jobs WHERE job_type = $1",
    )
    .bind(QUEUE)
    .fetch_one(pool)
    .await
    .context("cannot count apalis's job rows")?;
    Ok((left as u64, failed as u64))
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
                "peer": "apalis-postgres",
                "version": locked_version("apalis-postgres"),
                "apalis_version": locked_version("apalis"),
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
                    "fetch_batch": args.fetch_batch(),
                    "pubsub": true,
                    "max_connections": args.max_connections,
                },
            })
        );
    } else {
        println!(
            "apalis-postgres {} (jobs={n}, workers={}, batch={}, fetch_batch={}, max_connections={})",
            locked_version("apalis-postgres"),
            args.workers,
            args.batch,
            args.fetch_batch(),
            args.max_connections
        );
        println!("  {:<28} {:>12}", "", "per s");
        println!("  {:<28} {enqueue:>12.1}", "enqueue (push_tasks batches)");
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
            (a.jobs, a.workers, a.batch, a.fetch_batch(), a.json),
            (20_000, 32, 1_000, 32, false)
        );
        let a = parse(&["--database-url=postgres://x/y", "--jobs", "5", "--json"]).expect("args");
        assert_eq!((a.jobs, a.json), (5, true));
        let a = parse(&["--database-url=u", "--fetch-batch", "7"]).expect("args");
        assert_eq!(a.fetch_batch(), 7);
        assert!(parse(&["--jobs", "5"]).is_err());
        assert!(parse(&["--database-url", "u", "--fetch-batch", "0"]).is_err());
    }

    #[test]
    fn the_version_comes_from_the_lock() {
        assert!(locked_version("apalis-postgres").starts_with("1."));
    }
}
