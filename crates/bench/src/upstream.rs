//! The `door` scenario's fake OpenAI-compatible upstream, started in-process: `POST
//! /v1/chat/completions` answers one fixed completion at once, whatever it is asked. It
//! is both the model behind the door (a `kind = "openai"` provider at its `/v1`) and the
//! direct call the door's added latency is measured against.
//!
//! Also here: the door scenario's load at a fixed rate ([`run_at_rate`]), an open loop
//! (each call starts at its scheduled time, whether or not the ones before it answered,
//! and its latency counts from that time, so a stall is not hidden by calls that were
//! never sent).

use crate::measure::{Phase, Progress};
use anyhow::Context;
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

/// What the fake upstream answers to every call: a chat completion with a short text.
const COMPLETION: &str = r#"{"id":"chatcmpl-upstream","object":"chat.completion","created":0,"model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":8,"completion_tokens":1,"total_tokens":9}}"#;

/// The fake upstream, serving until [`FakeUpstream::shutdown`].
pub(crate) struct FakeUpstream {
    base: String,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl FakeUpstream {
    /// Serves on `127.0.0.1` with a port the system picks.
    pub(crate) async fn start() -> anyhow::Result<FakeUpstream> {
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(|_body: axum::body::Bytes| async {
                (
                    [(axum::http::header::CONTENT_TYPE, "application/json")],
                    COMPLETION,
                )
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot listen on 127.0.0.1 for the fake upstream")?;
        let addr = listener.local_addr()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(FakeUpstream {
            base: format!("http://{addr}/v1"),
            stop,
            task,
        })
    }

    /// The API root, as an `openai` provider's `base_url` names it.
    pub(crate) fn base_url(&self) -> &str {
        &self.base
    }

    /// Stops serving (open connections are closed once idle).
    pub(crate) async fn shutdown(self) -> anyhow::Result<()> {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(30), self.task).await {
            Ok(joined) => joined
                .context("the fake upstream panicked")?
                .context("the fake upstream failed"),
            Err(_) => anyhow::bail!("the fake upstream did not stop within 30 s"),
        }
    }
}

/// One call of a load: its sequence number; resolves when the answer is read and checked.
pub(crate) type Call = Arc<dyn Fn(u64) -> BoxFuture<'static, anyhow::Result<()>> + Send + Sync>;

/// Starts `call` `per_s` times a second for `duration`, each at its scheduled time (an
/// open loop), and waits for every one. Each latency counts from the call's scheduled
/// start. The first failure is returned (a benchmark never counts failures as work).
pub(crate) async fn run_at_rate(
    progress: &Progress,
    per_s: u32,
    duration: Duration,
    call: Call,
) -> anyhow::Result<Phase> {
    let interval = Duration::from_secs(1) / per_s.max(1);
    let count = (duration.as_secs_f64() * f64::from(per_s)).ceil().max(1.0) as u64;
    let start = Instant::now();
    let counter = progress.counter();
    let mut set = JoinSet::new();
    for seq in 0..count {
        let at = start + interval * u32::try_from(seq).unwrap_or(u32::MAX);
        tokio::time::sleep_until(at.into()).await;
        let (call, counter) = (call.clone(), counter.clone());
        set.spawn(async move {
            call(seq).await?;
            counter.fetch_add(1, Ordering::Relaxed);
            anyhow::Ok((at.elapsed().as_micros() as u64, Instant::now()))
        });
    }
    let mut phase = Phase::default();
    let mut end = start;
    while let Some(joined) = set.join_next().await {
        match joined {
            Ok(Ok((latency, finished))) => {
                phase.ops += 1;
                phase.latencies_us.push(latency);
                end = end.max(finished);
            }
            Ok(Err(e)) => {
                set.abort_all();
                return Err(e);
            }
            Err(e) => {
                set.abort_all();
                anyhow::bail!("a benchmark call panicked: {e}");
            }
        }
    }
    phase.elapsed = end - start;
    Ok(phase)
}
