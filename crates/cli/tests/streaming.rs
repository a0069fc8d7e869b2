//! Real streaming (issue 30; docs/openai.md "Streaming", docs/api.md "Streaming a
//! task"): the real `tollgate serve` (SQLite and PostgreSQL) calls a scripted
//! OpenAI-compatible fake in this process that streams its answer and holds its last
//! pieces until the test releases them, so "arrived before the provider finished" is
//! observed, not inferred from timing.
//!
//! - the door's `stream: true` forwards the first piece while the fake still holds the
//!   rest; the task records the stream's usage (priced, never $0);
//! - a second reader (`GET /v1/tasks/{id}/events`) joining mid-stream gets it from its
//!   start, then the `end` event with the task;
//! - a client that disconnects mid-stream does not cancel the task;
//! - a replay of the finished call's `Idempotency-Key` streams the stored answer;
//! - a provider stream that breaks off mid-answer ends the door's stream with an error
//!   event, fails the task (`max_attempts = 1`; the attempt `unavailable`) and charges
//!   the call's bound;
//! - a stream without a usage chunk is charged its bound, never $0.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

mod common;
use common::{Events, Server};

const ACME: &str = "acme-key-0123456789abcdef";

/// The fake's script: what it was asked, and the gate holding its last pieces.
#[derive(Default)]
struct Script {
    calls: Mutex<Vec<Value>>,
    /// Pieces sent so far (all calls).
    sent: Mutex<u32>,
    release: Notify,
}

struct Fake {
    url: String,
    script: Arc<Script>,
}

impl Fake {
    async fn start() -> Fake {
        let script = Arc::new(Script::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(fake_stream))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Fake { url, script }
    }

    fn calls(&self) -> usize {
        self.script.calls.lock().unwrap().len()
    }

    fn sent(&self) -> u32 {
        *self.script.sent.lock().unwrap()
    }
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

/// Streams "Hello " and "streaming " at once, then holds until released (`hold`
/// messages), then "world", the finish and — unless the message says `nousage` — the
/// usage (11 prompt, 3 completion tokens) and `[DONE]`. A `break` message's stream dies
/// after its first pieces.
async fn fake_stream(State(script): State<Arc<Script>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    script.calls.lock().unwrap().push(body.clone());
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    assert_eq!(body["stream"], true, "{body}");
    assert_eq!(body["stream_options"]["include_usage"], true, "{body}");
    let (tx, rx) = mpsc::channel::<Result<String, std::io::Error>>(16);
    tokio::spawn(async move {
        let send = |text: String| {
            let tx = tx.clone();
            let script = script.clone();
            async move {
                *script.sent.lock().unwrap() += 1;
                let _ = tx.send(Ok(text)).await;
            }
        };
        send(chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        ))
        .await;
        send(chunk(json!({"content": "Hello "}), Value::Null)).await;
        send(chunk(json!({"content": "streaming "}), Value::Null)).await;
        if last.contains("break") {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx
                .send(Err(std::io::Error::other("the fake dies mid-answer")))
                .await;
            return;
        }
        if last.contains("hold") {
            script.release.notified().await;
        }
        if last.contains("ttft") {
            tokio::time::sleep(Duration::from_millis(1000)).await;
        }
        send(chunk(json!({"content": "world"}), Value::Null)).await;
        send(chunk(json!({}), json!("stop"))).await;
        if !last.contains("nousage") {
            let usage = json!({"id": "x", "object": "chat.completion.chunk", "choices": [],
                               "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}});
            send(format!("data: {usage}\n\n")).await;
        }
        send("data: [DONE]\n\n".to_string()).await;
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

fn config_text(database_url: &str, provider_url: &str) -> String {
    format!(
        r#"
[server]
max_wait = "20s"

[database]
url = "{database_url}"

[models.default]
provider = "fake"
model = "fake-model"
max_output_tokens = 50
max_attempts = 1
prices = {{ input_per_million = 1.0, output_per_million = 2.0 }}

[providers.fake]
kind = "openai"
base_url = "{provider_url}/v1"
max_retries = 0

[budgets.standard]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 100
tasks_per_minute = 600

[apps.acme]
api_keys = ["{ACME}"]
default_budget = "standard"

[workers]
concurrency = 4
heartbeat_interval = "200ms"
"#
    )
}

impl Server {
    async fn stream_chat(&self, message: &str, key: Option<&str>) -> reqwest::Response {
        let mut rb = self
            .http
            .post(format!("{}/openai/v1/chat/completions", self.base))
            .bearer_auth(ACME)
            .json(&json!({"model": "default", "stream": true,
                          "stream_options": {"include_usage": true},
                          "messages": [{"role": "user", "content": message}]}));
        if let Some(k) = key {
            rb = rb.header("Idempotency-Key", k);
        }
        let response = rb.send().await.expect("the server answers");
        assert_eq!(response.status(), 200);
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/event-stream")
        );
        response
    }

    async fn task(&self, id: &str) -> Value {
        self.http
            .get(format!("{}/v1/tasks/{id}?wait=20", self.base))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn task_id(response: &reqwest::Response) -> String {
    response.headers()["x-tollgate-task-id"]
        .to_str()
        .unwrap()
        .to_string()
}

/// The content pieces of chunks, in order.
fn content(events: &[(String, String)]) -> String {
    events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect()
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name("sqlite").await; }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() { super::$name("postgres").await; }
            )*
        }
    };
}

on_both_backends!(
    the_door_streams_as_the_provider_sends_and_records_the_usage,
    a_broken_provider_stream_ends_with_an_error_event_and_settles,
    time_to_first_token_is_near_the_direct_call,
);

/// Time from sending a request to its first content piece, reading `response`.
async fn first_piece(started: std::time::Instant, response: reqwest::Response) -> Duration {
    let mut events = Events::of(response);
    while let Some((_, data)) = events.next().await {
        if !content(&[(String::new(), data)]).is_empty() {
            let elapsed = started.elapsed();
            let _ = events.rest().await;
            return elapsed;
        }
    }
    panic!("no content piece");
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

/// Issue 30's measure: time to the first piece through the door (a new durable task
/// each: admission, claim, the provider call, the live stream) against the direct call
/// to the same fake, whose first piece leaves at once and the rest 1 s later. Printed
/// as medians of 9 calls each; the door must stay within 500 ms of the direct call even
/// in a debug build on a busy machine (the test fails if pieces were held until the end:
/// that is 1 s more).
async fn time_to_first_token_is_near_the_direct_call(backend: &str) {
    let fake = Fake::start().await;
    let url = fake.url.clone();
    let Some(server) = common::start(backend, "stream", |db| config_text(db, &url)) else {
        return;
    };
    let (mut direct, mut door) = (Vec::new(), Vec::new());
    for i in 0..9 {
        let started = std::time::Instant::now();
        let response = server
            .http
            .post(format!("{}/v1/chat/completions", fake.url))
            .json(&json!({"model": "fake-model", "stream": true,
                          "stream_options": {"include_usage": true},
                          "messages": [{"role": "user", "content": format!("ttft {i}")}]}))
            .send()
            .await
            .unwrap();
        direct.push(first_piece(started, response).await);
        let started = std::time::Instant::now();
        let response = server.stream_chat(&format!("ttft {i}"), None).await;
        door.push(first_piece(started, response).await);
    }
    let (direct, door) = (median(direct), median(door));
    println!(
        "time to first token ({backend}): direct {:.1} ms, through the door {:.1} ms \
         (+{:.1} ms, ×{:.1})",
        direct.as_secs_f64() * 1e3,
        door.as_secs_f64() * 1e3,
        (door.saturating_sub(direct)).as_secs_f64() * 1e3,
        door.as_secs_f64() / direct.as_secs_f64().max(1e-6),
    );
    assert!(
        door < direct + Duration::from_millis(500),
        "{door:?} vs {direct:?}"
    );
}

async fn the_door_streams_as_the_provider_sends_and_records_the_usage(backend: &str) {
    let fake = Fake::start().await;
    let url = fake.url.clone();
    let Some(server) = common::start(backend, "stream", |db| config_text(db, &url)) else {
        return;
    };
    let response = server.stream_chat("hold: say hello", Some("s-1")).await;
    let id = task_id(&response);
    let mut door = Events::of(response);
    // The role chunk, then "Hello " — while the fake still holds "world" and the rest.
    let (_, role) = door.next().await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&role).unwrap()["choices"][0]["delta"]["role"],
        "assistant"
    );
    let (_, first) = door.next().await.unwrap();
    assert_eq!(content(&[("".into(), first)]), "Hello ");
    assert!(fake.sent() <= 3, "the fake holds its last pieces");

    // A second reader joins mid-stream and gets it from its start.
    let events = server
        .http
        .get(format!("{}/v1/tasks/{id}/events", server.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    assert_eq!(events.status(), 200);
    let mut second = Events::of(events);
    let (name, data) = second.next().await.unwrap();
    assert_eq!(
        (name.as_str(), data.as_str()),
        ("delta", r#"{"text":"Hello "}"#)
    );
    let (_, data) = second.next().await.unwrap();
    assert_eq!(data, r#"{"text":"streaming "}"#);

    // A third reader that goes away mid-stream cancels nothing.
    let mut quitter = Events::of(server.stream_chat("hold: say hello", Some("s-1")).await);
    let _ = quitter.next().await.unwrap();
    drop(quitter);

    fake.script.release.notify_one();
    let rest = door.rest().await;
    assert_eq!(content(&rest), "streaming world");
    let last_two: Vec<&str> = rest.iter().rev().take(2).map(|(_, d)| d.as_str()).collect();
    assert_eq!(last_two[0], "[DONE]");
    let usage: Value = serde_json::from_str(last_two[1]).unwrap();
    assert_eq!(
        usage["usage"],
        json!({"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14})
    );
    let second_rest = second.rest().await;
    let (name, end) = second_rest.last().unwrap();
    assert_eq!(name, "end");
    let end: Value = serde_json::from_str(end).unwrap();
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["output"]["text"], "Hello streaming world");

    let task = server.task(&id).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["output"]["text"], "Hello streaming world");
    assert_eq!(task["usage"]["input_tokens"], 11, "{task}");
    assert_eq!(task["usage"]["output_tokens"], 3, "{task}");
    assert!(task["usage"]["cost_usd"].as_f64().unwrap() > 0.0, "{task}");
    assert_eq!(fake.calls(), 1, "the replay and the quitter made no call");

    // A replay of the finished call streams the stored answer.
    let mut replay = Events::of(server.stream_chat("hold: say hello", Some("s-1")).await);
    let all = replay.rest().await;
    assert_eq!(content(&all), "Hello streaming world");
    assert_eq!(all.last().unwrap().1, "[DONE]");
    assert_eq!(fake.calls(), 1);

    // A finished task's events: its answer as one delta, then its end.
    let events = server
        .http
        .get(format!("{}/v1/tasks/{id}/events", server.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    let all = Events::of(events).rest().await;
    assert_eq!(all.len(), 2, "{all:?}");
    assert_eq!(all[0].1, r#"{"text":"Hello streaming world"}"#);
    assert_eq!(all[1].0, "end");
}

async fn a_broken_provider_stream_ends_with_an_error_event_and_settles(backend: &str) {
    let fake = Fake::start().await;
    let url = fake.url.clone();
    let Some(server) = common::start(backend, "stream", |db| config_text(db, &url)) else {
        return;
    };
    let response = server.stream_chat("break: say hello", None).await;
    let id = task_id(&response);
    let all = Events::of(response).rest().await;
    assert_eq!(content(&all), "Hello streaming ");
    let (_, last) = all.last().unwrap();
    let error: Value = serde_json::from_str(last).unwrap();
    assert_eq!(error["error"]["code"], "provider_error", "{error}");
    assert_eq!(error["error"]["type"], "server_error", "{error}");
    let task = server.task(&id).await;
    assert_eq!(task["status"], "failed", "{task}");
    // A dropped connection is a transient failure (`unavailable`: with tries left, the
    // next attempt would follow). The broken call may have been billed: it is counted at
    // its bound (docs/routes.md, "What is charged when"), never $0.
    assert_eq!(task["attempts"][0]["outcome"], "unavailable", "{task}");
    assert_eq!(task["usage"]["output_tokens"], 50, "{task}");
    assert_eq!(task["usage"]["estimated"], true, "{task}");
    let charged = task["attempts"][0]["cost_usd"].as_f64();
    assert!(charged.is_some_and(|c| c > 0.0), "{task}");
    assert_eq!(task["usage"]["cost_usd"].as_f64(), charged, "{task}");

    // A stream without a usage chunk is charged its bound too.
    let response = server.stream_chat("nousage: say hello", None).await;
    let id = task_id(&response);
    let all = Events::of(response).rest().await;
    assert_eq!(content(&all), "Hello streaming world");
    let task = server.task(&id).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["usage"]["output_tokens"], 50, "{task}");
    assert_eq!(task["usage"]["estimated"], true, "{task}");
    assert!(task["usage"]["cost_usd"].as_f64().unwrap() > 0.0, "{task}");
}
