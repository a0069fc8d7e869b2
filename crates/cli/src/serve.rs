//! `serve`, `worker`, `migrate`: running Tollgate.

use crate::{DatabaseArgs, ServeArgs, WorkerArgs};
use anyhow::{Context, bail};
use metrics_exporter_prometheus::PrometheusBuilder;
use tollgate_core::AppId;
use tollgate_engine::Tollgate;
use tollgate_server::telemetry::TraceExport;
use tollgate_server::{AppState, Auth, BatchLimits, KeyConfig, MetricsAccess, TollgateConfig};

/// The development app `serve` runs when no API key is configured.
pub const DEV_APP: &str = "dev";

/// Where the development app's key is kept in the database.
const DEV_KEY_SETTING: &str = "dev_api_key";

fn load(args: &DatabaseArgs) -> anyhow::Result<TollgateConfig> {
    let mut config = TollgateConfig::load(args.config.as_deref())?;
    if let Some(url) = &args.database_url {
        config.database.url = url.clone();
    }
    Ok(config)
}

/// Opens the database and the notifier, saying which of the three failed: invalid
/// configuration, the database, or the notification transport.
async fn open(config: &TollgateConfig) -> anyhow::Result<Tollgate> {
    open_traced(config, None).await
}

/// Starts trace export when `[telemetry]` or the `OTEL_*` variables ask for it
/// (docs/telemetry.md), then [`open`]s with its tracer. The export is flushed by
/// [`TraceExport::shutdown`] when the process stops.
async fn open_with_traces(
    config: &TollgateConfig,
) -> anyhow::Result<(Tollgate, Option<TraceExport>)> {
    let settings = config
        .telemetry
        .resolve(|name| std::env::var(name).ok())
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
    let Some(settings) = settings else {
        return Ok((open(config).await?, None));
    };
    let (export, tracer) = TraceExport::start(&settings).map_err(anyhow::Error::msg)?;
    tracing::info!(endpoint = %settings.endpoint, protocol = ?settings.protocol, "exporting traces");
    let tollgate = open_traced(config, Some(tracer)).await?;
    Ok((tollgate, Some(export)))
}

async fn open_traced(
    config: &TollgateConfig,
    tracer: Option<opentelemetry::global::BoxedTracer>,
) -> anyhow::Result<Tollgate> {
    use tollgate_engine::EngineError;
    match Tollgate::open_traced(&config.database.url, config.engine.clone(), tracer).await {
        Ok(tollgate) => Ok(tollgate),
        Err(e @ (EngineError::Config(_) | EngineError::Invalid(_))) => {
            bail!("invalid configuration: {e}")
        }
        Err(e @ EngineError::Notify(_)) => bail!("{e}"),
        Err(e) => Err(anyhow::Error::new(e))
            .with_context(|| format!("cannot open the database {}", redact(&config.database.url))),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}

/// Shows where the database is without any password in the URL.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = load(&args.database)?;
    if let Some(addr) = args.addr {
        config.server.addr = addr;
    }
    if let Some(w) = args.workers {
        config.engine.workers.concurrency = w;
    }
    let addr = config.server.addr;
    if !config.has_keys() && !addr.ip().is_loopback() {
        bail!(
            "no API keys are configured, so Tollgate only serves its development app on \
             127.0.0.1; refusing to listen on {addr}. Configure [apps.<app>] api_keys \
             (see docs/api.md) or bind to 127.0.0.1."
        );
    }
    // docs/api.md, "Waiting": every waiting call holds a connection.
    match raise_open_files_limit() {
        Ok(Some((from, to))) => tracing::info!(from, to, "raised the open files limit"),
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open files limit"),
    }
    tollgate_engine::metrics::set_app_labels(config.metrics.app_labels);
    let metrics = PrometheusBuilder::new().install_recorder().ok();
    let (tollgate, traces) = open_with_traces(&config).await?;
    let (auth, dev_key) = if config.has_keys() {
        (
            Auth::new(&config.api_keys).map_err(anyhow::Error::msg)?,
            None,
        )
    } else {
        // The development key is kept in the database, so a restart (or a second
        // replica of the same database) accepts the key the user exported.
        let fresh = format!("tg_dev_{}", uuid::Uuid::new_v4().simple());
        let key = tollgate
            .keep_setting(DEV_KEY_SETTING, &fresh)
            .await
            .context("cannot read or keep the development API key")?;
        let app = AppId::new(DEV_APP).map_err(anyhow::Error::msg)?;
        (
            Auth::new(&[(app, vec![KeyConfig::Plain(key.clone())])]).map_err(anyhow::Error::msg)?,
            Some(key),
        )
    };
    if metrics.is_some() {
        // Every series from the first scrape, with its HELP and TYPE (docs/conformance.md#http-shapes /metrics).
        tollgate_engine::metrics::describe();
        let models = tollgate.models();
        let providers: Vec<String> = models
            .ids()
            .iter()
            .filter_map(|id| models.resolve(Some(id)).ok())
            .map(|m| m.model_ref.provider.clone())
            .collect();
        tollgate_engine::metrics::register(providers.iter().map(String::as_str));
    }
    let workers = config.engine.workers.concurrency;
    // Always: an API-only replica runs no tasks but still sweeps (docs/conformance.md#sweeps: every replica
    // sweeps), and drives pipeline runs when `[pipelines] drive_without_workers` says so.
    let engine = tollgate.start().await.context("cannot start the workers")?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?;
    let local = listener.local_addr()?;
    println!("Tollgate listening on http://{local}");
    println!(
        "  database: {}   workers: {}   backend: {}   notifications: {}",
        redact(&config.database.url),
        if workers == 0 {
            "none (API only)".to_string()
        } else {
            workers.to_string()
        },
        tollgate.backend(),
        tollgate.notifier().transport()
    );
    println!("  dashboard: http://{local}/ui");
    if let Some(key) = &dev_key {
        println!("  no API keys configured: development app `{DEV_APP}` (127.0.0.1 only)");
        println!("  API key: {key}");
        println!(
            "  try: curl -s http://{local}/v1/tasks -H 'Authorization: Bearer {key}' \
             -H 'Idempotency-Key: hello-1' -H 'Content-Type: application/json' \
             -d '{{\"kind\":\"classify\",\"scope\":\"demo\",\"request\":{{\"input\":\"Win a free cruise!\",\"labels\":[\"spam\",\"ham\"]}}}}'"
        );
    }
    let state = AppState {
        tollgate: tollgate.clone(),
        auth,
        max_wait: config.server.max_wait,
        body_read_timeout: config.server.body_read_timeout,
        metrics,
        metrics_access: MetricsAccess {
            token: config.metrics_token.as_deref().map(Into::into),
            elsewhere: config.metrics.addr.is_some(),
        },
        batches: BatchLimits::new(
            config.server.max_batch_body_bytes,
            config.server.batches_per_app,
        ),
    };
    let grace = config.server.shutdown_grace;
    let timeouts = tollgate_server::ConnectionTimeouts {
        header_read: config.server.header_read_timeout,
        idle: config.server.idle_timeout,
    };
    // `/metrics` on its own address (`[metrics] addr`), stopped with the process.
    if let Some(metrics_addr) = config.metrics.addr {
        let listener = tokio::net::TcpListener::bind(metrics_addr)
            .await
            .with_context(|| format!("cannot listen on {metrics_addr} ([metrics] addr)"))?;
        println!(
            "Tollgate metrics on http://{}/metrics",
            listener.local_addr()?
        );
        tokio::spawn(tollgate_server::serve(
            listener,
            tollgate_server::metrics_router(state.clone()),
            timeouts,
            std::future::pending::<()>(),
        ));
    }
    let (stop_http, http_stopped) = tokio::sync::oneshot::channel::<()>();
    let mut http = tokio::spawn(tollgate_server::serve(
        listener,
        tollgate_server::router(state),
        timeouts,
        async move {
            let _ = http_stopped.await;
        },
    ));
    tokio::select! {
        () = shutdown_signal() => {}
        served = &mut http => {
            // The server ended without a signal: that is a failure.
            engine.shutdown(grace).await;
            served
                .context("the HTTP server failed")?
                .context("the HTTP server failed")?;
            bail!("the HTTP server stopped unexpectedly");
        }
    }
    println!(
        "shutting down: no new tasks are claimed; in-flight tasks get {}",
        humantime::format_duration(grace)
    );
    let _ = stop_http.send(());
    // Open requests (a long `?wait=`) and in-flight tasks get the same grace, at once;
    // requests still open then are cut. Nothing waits for CPU work: its tasks are
    // interrupted and their jobs stop on their own.
    let drain_http = async {
        if tokio::time::timeout(grace, &mut http).await.is_err() {
            http.abort();
            println!("open HTTP requests were cut after the grace period");
        }
    };
    let ((), report) = tokio::join!(drain_http, engine.shutdown(grace));
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    println!(
        "stopped (in-flight finished: {}, interrupted: {})",
        report.drained, report.interrupted
    );
    Ok(())
}

/// Raises this process's soft limit of open files to its hard limit (docs/api.md,
/// "Waiting": each waiting call holds a connection). `Some((from, to))` when raised.
#[cfg(unix)]
fn raise_open_files_limit() -> std::io::Result<Option<(libc::rlim_t, libc::rlim_t)>> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one `rlimit` through a valid pointer.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if limit.rlim_cur >= limit.rlim_max {
        return Ok(None);
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: setrlimit reads one `rlimit` through a valid pointer.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(Some((limit.rlim_cur, limit.rlim_max)))
}

#[cfg(not(unix))]
fn raise_open_files_limit() -> std::io::Result<Option<(u64, u64)>> {
    Ok(None)
}

pub async fn worker(args: WorkerArgs) -> anyhow::Result<()> {
    let mut config = load(&args.database)?;
    if let Some(w) = args.workers {
        config.engine.workers.concurrency = w;
    }
    if config.engine.workers.concurrency == 0 {
        bail!("a worker needs --workers 1 or more ([workers] concurrency)");
    }
    let (tollgate, traces) = open_with_traces(&config).await?;
    let engine = tollgate.start().await.context("cannot start the workers")?;
    println!(
        "Tollgate worker {} running {} executions on {}",
        engine.worker_id(),
        config.engine.workers.concurrency,
        redact(&config.database.url)
    );
    shutdown_signal().await;
    let report = engine.shutdown(config.server.shutdown_grace).await;
    if let Some(traces) = traces {
        traces.shutdown().await;
    }
    println!(
        "stopped (in-flight finished: {}, interrupted: {})",
        report.drained, report.interrupted
    );
    Ok(())
}

pub async fn migrate(args: DatabaseArgs) -> anyhow::Result<()> {
    let config = load(&args)?;
    let tollgate = open(&config).await?;
    tollgate.ping().await?;
    println!(
        "{} is migrated ({} backend)",
        redact(&config.database.url),
        tollgate.backend()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_never_print() {
        assert_eq!(
            redact("postgres://app:secret@db:5432/t"),
            "postgres://app:***@db:5432/t"
        );
        assert_eq!(redact("postgres://app@db/t"), "postgres://app@db/t");
        assert_eq!(redact("sqlite://./x.db"), "sqlite://./x.db");
    }
}
