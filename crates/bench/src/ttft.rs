//! `ttft`: time to first token of a streamed chat completion (issue 30), through the
//! OpenAI door and directly.
//!
//! An OpenAI-compatible fake upstream runs in this process ([`FakeUpstream`]): it sends
//! the role and the first piece of its answer at once, the rest [`REST_AFTER`] later
//! (then the usage chunk and `[DONE]`). The product's HTTP server runs in-process too
//! ([`HttpServer`]), over an engine whose default model is an `openai` provider pointed
//! at the fake (streaming on, its default).
//!
//! Two sides, one call at a time, alternating call by call so noise hits both:
//! - door: `POST /openai/v1/chat/completions` with `stream: true`, a body of its own, an
//!   `Idempotency-Key` and an `X-Tollgate-Scope` — a new durable task each (admission,
//!   queue, claim, the provider call, the live stream hub, server-sent events);
//! - direct: the same streamed call to the fake itself.
//!
//! Measured per call: from sending the request to receiving the first piece of text
//! (each side reads its answer to the end before the next call). Reported: p50/p99 of
//! each side and the door's added milliseconds (door − direct, at p50 and p99).
//! Target: the door's p50 adds at most [`ADDED_P50_TARGET_MS`].

use super::http::HttpServer;
use super::measure::Phase;
use super::report::ScenarioReport;
use super::{Ctx, HOLD_MODEL, Scenario, engine_config};
use anyhow::Context;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tollgate_engine::Tollgate;
use tollgate_engine::config::{ModelConfig, ModelPrices, ProviderConfig};
use tollgate_store::Store;

/// How long after the first piece the fake sends the rest of its answer.
const REST_AFTER: Duration = Duration::from_millis(20);
/// Longest one call may take before the scenario fails.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The first piece of every answer; its arrival is the first token.
const FIRST_PIECE: &str = "Hello";
/// The model the door is asked for (an `openai` provider pointed at the fake).
const MODEL: &str = "stream";
/// The fake's provider in the engine configuration.
const PROVIDER: &str = "bench-stream";
/// The target: the door's p50 time to first token at most this many ms over the direct call's.
const ADDED_P50_TARGET_MS: f64 = 10.0;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let calls = ctx.sizes.calls;
    let fake = FakeUpstream::start().await?;
    let counting = ctx.counting_store();
    let store: Arc<dyn Store> = Arc::new(counting.clone());
    let mut config = engine_config(ctx.sizes.workers, &ctx.sizes);
    // The heartbeat scenario's held model needs a provider this engine does not have.
    config.models.remove(HOLD_MODEL);
    config.providers.insert(
        PROVIDER.to_string(),
        serde_json::from_value::<ProviderConfig>(json!({
            "kind": "openai",
            "base_url": format!("{}/v1", fake.base),
            "max_retries": 0,
        }))
        .context("the fake's provider configuration")?,
    );
    config.models.insert(
        MODEL.to_string(),
        ModelConfig {
            provider: PROVIDER.to_string(),
            model: "fake-model".to_string(),
            max_output_tokens: Some(64),
            prices: Some(ModelPrices {
                input_per_million: 0.15,
                output_per_million: 0.60,
                cached_input_per_million: None,
                cache_write_input_per_million: None,
            }),
            ..ModelConfig::default()
        },
    );
    let tollgate = Tollgate::builder(store, config).build()?;
    let engine = tollgate.start().await?;
    let measured = match HttpServer::start(&tollgate).await {
        Ok(server) => {
            let measured = measure(ctx, &server, &fake, calls).await;
            let stopped = server.shutdown().await;
            measured.and_then(|sides| stopped.map(|()| sides))
        }
        Err(e) => Err(e),
    };
    engine.shutdown(Duration::from_secs(30)).await;
    fake.stop();
    let (door, direct) = measured?;

    let door_p = door
        .percentiles()
        .context("the door side measured no call")?;
    let direct_p = direct
        .percentiles()
        .context("the direct side measured no call")?;
    let added_p50 = door_p.p50_ms - direct_p.p50_ms;
    let added_p99 = door_p.p99_ms - direct_p.p99_ms;
    let mut report = ctx.report(Scenario::Ttft);
    report
        .param("calls_per_side", calls)
        .param("workers", ctx.sizes.workers)
        .param("rest_after_ms", REST_AFTER.as_millis() as u64)
        .tollgate("door (stream: true, new task)", door.per_s(), Some(door_p))
        .baseline("direct call to the fake", direct.per_s(), Some(direct_p))
        .extra("added_p50_ms", added_p50)
        .extra("added_p99_ms", added_p99)
        .target(
            format!("door p50 ≤ direct p50 + {ADDED_P50_TARGET_MS} ms (+{added_p50:.2} ms; p99 +{added_p99:.2} ms)"),
            added_p50 <= ADDED_P50_TARGET_MS,
        )
        .note("time to first token: request sent → first piece of text received")
        // One caller at a time: each store call's time is its own, not a queue's.
        .store_profile(&counting.counts().profile());
    Ok(report)
}

/// `calls` door calls and `calls` direct calls, alternating.
async fn measure(
    ctx: &Ctx,
    server: &HttpServer,
    fake: &FakeUpstream,
    calls: u64,
) -> anyhow::Result<(Phase, Phase)> {
    let client = server.client();
    let direct_client = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .build()
        .context("cannot build the HTTP client")?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let (mut door, mut direct) = (Phase::default(), Phase::default());
    // One unmeasured call each first: connections open, caches warm.
    for i in 0..=calls {
        ctx.progress.stage(format!("call {i} of {calls}"));
        let body = chat_body(&format!("ttft {run} {i}"));
        let both = [true, false];
        let order = if i % 2 == 0 { both } else { [false, true] };
        for to_door in order {
            let started = Instant::now();
            let request = if to_door {
                client
                    .stream_request("/openai/v1/chat/completions")
                    .header("Idempotency-Key", format!("ttft-{run}-{i}"))
                    .header("X-Tollgate-Scope", format!("ttft-{}", i % 8))
            } else {
                direct_client.post(format!("{}/v1/chat/completions", fake.base))
            };
            let response = request
                .json(&body)
                .timeout(CALL_TIMEOUT)
                .send()
                .await
                .context("a streamed call failed")?;
            let first = first_piece(started, response, to_door).await?;
            if i == 0 {
                continue;
            }
            let side = if to_door { &mut door } else { &mut direct };
            side.ops += 1;
            side.elapsed += first;
            side.latencies_us.push(first.as_micros() as u64);
        }
    }
    Ok((door, direct))
}

/// A streamed chat completion's body asking `text`.
fn chat_body(text: &str) -> Value {
    json!({"model": MODEL, "stream": true, "stream_options": {"include_usage": true},
           "messages": [{"role": "user", "content": text}]})
}

/// Reads a streamed answer: the time from `started` to the first piece of text, after
/// reading the answer to its end (which must be `[DONE]`).
async fn first_piece(
    started: Instant,
    mut response: reqwest::Response,
    door: bool,
) -> anyhow::Result<Duration> {
    let side = if door { "the door" } else { "the fake" };
    let status = response.status();
    anyhow::ensure!(
        status == reqwest::StatusCode::OK,
        "{side} answered {status}: {}",
        response.text().await.unwrap_or_default()
    );
    let mut seen = String::new();
    let mut first = None;
    while let Some(chunk) = response
        .chunk()
        .await
        .with_context(|| format!("{side}'s stream was cut"))?
    {
        seen.push_str(&String::from_utf8_lossy(&chunk));
        if first.is_none() && seen.contains(FIRST_PIECE) {
            first = Some(started.elapsed());
        }
    }
    anyhow::ensure!(
        seen.trim_end().ends_with("data: [DONE]"),
        "{side}'s stream did not end with [DONE]: {seen}"
    );
    first.with_context(|| format!("{side}'s stream had no {FIRST_PIECE:?}: {seen}"))
}

/// The OpenAI-compatible fake upstream: `POST /v1/chat/completions` streams
/// [`FIRST_PIECE`] at once and the rest [`REST_AFTER`] later.
struct FakeUpstream {
    base: String,
    stop: oneshot::Sender<()>,
}

impl FakeUpstream {
    async fn start() -> anyhow::Result<FakeUpstream> {
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(|body: Bytes| async move { stream_answer(&body) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot listen on 127.0.0.1")?;
        let base = format!("http://{}", listener.local_addr()?);
        // Pieces leave as they are written (no Nagle delay behind the headers), as from
        // a real provider's streaming endpoint.
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(FakeUpstream { base, stop })
    }

    fn stop(self) {
        let _ = self.stop.send(());
    }
}

/// One chunk of a streamed chat completion.
fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id": "bench", "object": "chat.completion.chunk", "created": 1,
                   "model": "fake-model",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

fn stream_answer(body: &[u8]) -> Response {
    if serde_json::from_slice::<Value>(body).map_or(true, |b| b["stream"] != true) {
        return (axum::http::StatusCode::BAD_REQUEST, "stream: true expected").into_response();
    }
    let (tx, rx) = mpsc::channel::<Result<String, std::io::Error>>(8);
    tokio::spawn(async move {
        let first = chunk(
            json!({"role": "assistant", "content": format!("{FIRST_PIECE} ")}),
            Value::Null,
        );
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        tokio::time::sleep(REST_AFTER).await;
        let usage = json!({"id": "bench", "object": "chat.completion.chunk", "created": 1,
                           "model": "fake-model", "choices": [],
                           "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}});
        let rest = [
            chunk(json!({"content": "world"}), Value::Null),
            chunk(json!({}), json!("stop")),
            format!("data: {usage}\n\n"),
            "data: [DONE]\n\n".to_string(),
        ];
        let _ = tx.send(Ok(rest.concat())).await;
    });
    let stream =
        futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|i| (i, rx)) });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    response
}
