//! Live streams readable from any replica (issue 30; docs/api.md "Streaming a task"): two
//! real `tollgate serve` processes on one database (SQLite file, PostgreSQL schema) — A
//! runs the tasks, B has no workers (`--workers 0`) — and a scripted OpenAI-compatible
//! fake in this process that holds its last pieces until the test releases them, so "B
//! got a piece before the provider finished" is observed, not inferred from timing. On
//! PostgreSQL the replicas hint each other with `LISTEN/NOTIFY`; on SQLite they only
//! poll.
//!
//! - B's `GET /v1/tasks/{id}/events` of a task A runs gets its pieces from the stream's
//!   start while the fake still holds the rest, then the rest and `end` with the task;
//! - B's door replay (`stream: true`, the same `Idempotency-Key`) of the running call
//!   streams it incrementally, then closes with the usage and `[DONE]`;
//! - a reader on B that goes away cancels nothing: the fake was called once;
//! - the provider's stream breaking off mid-answer (asked again by the provider) is seen
//!   on B as a `restart` before the new pieces, which alone are the answer.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

#[macro_use]
mod common;
use common::{Events, Server};

const ACME: &str = "acme-key-0123456789abcdef";

/// The fake's script: the calls it got, and the gate holding its last pieces.
#[derive(Default)]
struct Script {
    calls: Mutex<Vec<Value>>,
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
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

/// Streams "Hello " and "streaming " at once; a `breakonce` message's first call then
/// ends, the answer unfinished; a `hold` message's call holds until released; then "world", the finish, the
/// usage (11 prompt, 3 completion tokens) and `[DONE]`.
async fn fake_stream(State(script): State<Arc<Script>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap();
    let first_call = {
        let mut calls = script.calls.lock().unwrap();
        calls.push(body.clone());
        calls.len() == 1
    };
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let (tx, rx) = mpsc::channel::<Result<String, std::io::Error>>(16);
    tokio::spawn(async move {
        let send = |text: String| {
            let tx = tx.clone();
            async move {
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
        if last.contains("breakonce") && first_call {
            // The body ends before the answer does: the provider asks again.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return;
        }
        if last.contains("hold") {
            script.release.notified().await;
        }
        send(chunk(json!({"content": "world"}), Value::Null)).await;
        send(chunk(json!({}), json!("stop"))).await;
        let usage = json!({"id": "x", "object": "chat.completion.chunk", "choices": [],
                           "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}});
        send(format!("data: {usage}\n\n")).await;
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

fn config_text(backend: &str, database_url: &str, provider_url: &str) -> String {
    let transport = if backend == "postgres" {
        "postgres"
    } else {
        "local"
    };
    format!(
        r#"
[server]
max_wait = "20s"

[database]
url = "{database_url}"

[notifications]
transport = "{transport}"
poll_interval = "200ms"

[models.default]
provider = "fake"
model = "fake-model"
max_output_tokens = 50
max_attempts = 1
prices = {{ input_per_million = 1.0, output_per_million = 2.0 }}

[providers.fake]
kind = "openai"
base_url = "{provider_url}/v1"
max_retries = 1
retry_backoff = "10ms"

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

/// A (runs tasks) and B (`--workers 0`) on one fresh database; `None` when the Postgres
/// half is skipped.
fn replicas(backend: &str, fake: &Fake) -> Option<(Server, Server)> {
    let url = fake.url.clone();
    let a = common::start(backend, "xr", |db| config_text(backend, db, &url))?;
    let b = common::replica(&a, &["--workers", "0"]);
    Some((a, b))
}

/// The events of a streaming answer, which must be a 200.
fn ok_events(response: reqwest::Response) -> Events {
    assert_eq!(response.status(), 200);
    Events::of(response)
}

impl Server {
    async fn stream_chat(&self, message: &str, key: &str) -> reqwest::Response {
        self.http
            .post(format!("{}/openai/v1/chat/completions", self.base))
            .bearer_auth(ACME)
            .header("Idempotency-Key", key)
            .json(&json!({"model": "default", "stream": true,
                          "stream_options": {"include_usage": true},
                          "messages": [{"role": "user", "content": message}]}))
            .send()
            .await
            .expect("the server answers")
    }

    async fn events(&self, id: &str) -> reqwest::Response {
        self.http
            .get(format!("{}/v1/tasks/{id}/events", self.base))
            .bearer_auth(ACME)
            .send()
            .await
            .expect("the server answers")
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

/// The content pieces of door chunks, in order.
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

/// The next `delta` event's text (panics on another event).
async fn delta(events: &mut Events) -> String {
    let (name, data) = events.next().await.expect("an event");
    assert_eq!(name, "delta", "{data}");
    let data: Value = serde_json::from_str(&data).unwrap();
    data["text"].as_str().expect("a text delta").to_string()
}

on_both_backends!(
    another_replica_streams_a_running_task_from_its_start,
    a_restart_is_seen_on_another_replica,
);

async fn another_replica_streams_a_running_task_from_its_start(backend: &str) {
    let fake = Fake::start().await;
    let Some((a, b)) = replicas(backend, &fake) else {
        return;
    };
    let response = a.stream_chat("hold: say hello", "xr-1").await;
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-tollgate-task-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mut on_a = ok_events(response);
    let _role = on_a.next().await.unwrap();
    assert_eq!(content(&[on_a.next().await.unwrap()]), "Hello ");

    // B runs nothing; it reads A's pieces from the log, from the start, while the fake
    // still holds the rest.
    let mut on_b = ok_events(b.events(&id).await);
    assert_eq!(delta(&mut on_b).await, "Hello ");
    assert_eq!(delta(&mut on_b).await, "streaming ");

    // B's door replay of the running call streams it as it comes, too.
    let mut replay = ok_events(b.stream_chat("hold: say hello", "xr-1").await);
    let (_, role) = replay.next().await.unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&role).unwrap()["choices"][0]["delta"]["role"],
        "assistant"
    );
    assert_eq!(content(&[replay.next().await.unwrap()]), "Hello ");
    assert_eq!(content(&[replay.next().await.unwrap()]), "streaming ");

    // A reader on B that goes away mid-stream cancels nothing.
    let mut quitter = ok_events(b.events(&id).await);
    assert_eq!(delta(&mut quitter).await, "Hello ");
    drop(quitter);
    assert_eq!(fake.calls(), 1, "the fake still holds its only call");

    fake.script.release.notify_one();
    let rest = on_b.rest().await;
    let (last, end) = rest.split_last().unwrap();
    assert_eq!(last.0, "end", "{rest:?}");
    let texts: String = end
        .iter()
        .map(|(name, data)| {
            assert_eq!(name, "delta", "{rest:?}");
            serde_json::from_str::<Value>(data).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(texts, "world", "the rest, once: {rest:?}");
    let ended: Value = serde_json::from_str(&last.1).unwrap();
    assert_eq!(ended["status"], "succeeded", "{ended}");
    assert_eq!(ended["output"]["text"], "Hello streaming world");

    let replayed = replay.rest().await;
    assert_eq!(content(&replayed), "world");
    let (done, before) = replayed.split_last().unwrap();
    assert_eq!(done.1, "[DONE]");
    let usage: Value = serde_json::from_str(&before.last().unwrap().1).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 3, "{usage}");
    assert_eq!(content(&on_a.rest().await), "streaming world");

    let task = b.task(&id).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["output"]["text"], "Hello streaming world");
    assert_eq!(fake.calls(), 1, "B's readers made no call");
}

async fn a_restart_is_seen_on_another_replica(backend: &str) {
    let fake = Fake::start().await;
    let Some((a, b)) = replicas(backend, &fake) else {
        return;
    };
    let response = a.stream_chat("breakonce hold: say hello", "xr-2").await;
    assert_eq!(response.status(), 200);
    let id = response.headers()["x-tollgate-task-id"]
        .to_str()
        .unwrap()
        .to_string();
    let mut on_a = ok_events(response);
    let _role = on_a.next().await.unwrap();
    assert_eq!(content(&[on_a.next().await.unwrap()]), "Hello ");

    let mut on_b = ok_events(b.events(&id).await);
    assert_eq!(delta(&mut on_b).await, "Hello ");
    assert_eq!(delta(&mut on_b).await, "streaming ");
    // The provider's stream breaks off; the provider asks again, from the start: B is
    // told before the new pieces — all while the second call is held.
    let (name, data) = on_b.next().await.unwrap();
    assert_eq!(name, "restart", "{data}");
    assert_eq!(delta(&mut on_b).await, "Hello ");
    assert_eq!(delta(&mut on_b).await, "streaming ");
    assert_eq!(fake.calls(), 2);

    fake.script.release.notify_one();
    let rest = on_b.rest().await;
    assert_eq!(rest.len(), 2, "{rest:?}");
    assert_eq!(rest[0].1, r#"{"text":"world"}"#);
    assert_eq!(rest[1].0, "end");
    let ended: Value = serde_json::from_str(&rest[1].1).unwrap();
    assert_eq!(ended["status"], "succeeded", "{ended}");
    assert_eq!(ended["output"]["text"], "Hello streaming world");
    // A's door could not take its text back: it ended with an error event.
    let on_a = on_a.rest().await;
    let error: Value = serde_json::from_str(&on_a.last().unwrap().1).unwrap();
    assert_eq!(error["error"]["code"], "stream_restarted", "{error}");
}
