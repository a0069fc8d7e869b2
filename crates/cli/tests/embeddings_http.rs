//! Issue 30: the `embed` kind over HTTP — the real `tollgate serve` binary, its
//! embeddings calls going to a scripted fake OpenAI-compatible `/embeddings` endpoint in
//! this process that records every call's texts — on SQLite and (with
//! `TOLLGATE_TEST_DATABASE_URL`) PostgreSQL:
//!
//! - the item cache: a door call of 1,000 inputs of which 990 were embedded before sends
//!   the provider the 10 others only and is charged for those only;
//! - grouped calls: `embed` tasks submitted together share provider calls of at most the
//!   batch size, and each task is charged its own tokens.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

#[macro_use]
mod common;
use common::Server;

const KEY: &str = "acme-key-0123456789abcdef";

on_both_backends!(
    a_thousand_inputs_with_990_cached_call_the_provider_for_10_and_are_charged_for_10,
    embed_tasks_submitted_together_share_calls_and_are_each_charged_their_own,
);

/// Every call's texts, in order.
type Calls = Arc<Mutex<Vec<Vec<String>>>>;

/// A scripted embeddings endpoint: a vector of dimension 3 per text (its length, its
/// first byte, 1), usage one token per byte.
async fn embeddings(State(calls): State<Calls>, Json(body): Json<Value>) -> Json<Value> {
    let texts: Vec<String> = serde_json::from_value(body["input"].clone()).expect("texts");
    let tokens: usize = texts.iter().map(String::len).sum();
    let data: Vec<Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            json!({"object": "embedding", "index": i,
                "embedding": [t.len() as f64, f64::from(t.as_bytes()[0]), 1.0]})
        })
        .collect();
    calls.lock().unwrap().push(texts);
    Json(json!({
        "object": "list", "data": data, "model": body["model"],
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}
    }))
}

async fn fake_provider() -> (String, Calls) {
    let calls: Calls = Arc::default();
    let app = Router::new()
        .route("/v1/embeddings", post(embeddings))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, calls)
}

/// `emb`: the fake's model at $1 per million tokens (one token: 1,000 nano-dollars), at
/// most 6 texts a call; groups gather for 300 ms.
fn config_text(database_url: &str, provider_url: &str) -> String {
    format!(
        r#"
default_model = "big"

[database]
url = "{database_url}"

[models.emb]
provider = "fake"
model = "fake-embed"
params = {{ embed_batch_size = 6 }}
prices = {{ input_per_million = 1.0, output_per_million = 1.0 }}

[models.big]
provider = "fake"
model = "fake-embed-big"
prices = {{ input_per_million = 1.0, output_per_million = 1.0 }}

[providers.fake]
kind = "openai"
base_url = "{provider_url}"
max_retries = 0

[apps.acme]
api_keys = ["{KEY}"]

[workers]
concurrency = 8
heartbeat_interval = "200ms"
embed_gather = "300ms"

[sweeper]
liveness_timeout = "10s"
"#
    )
}

async fn start(backend: &str, url: &str) -> Option<Server> {
    common::start(backend, "embed_http", |db| config_text(db, url))
}

fn bytes(texts: &[String]) -> u64 {
    texts.iter().map(|t| t.len() as u64).sum()
}

async fn get_task(server: &Server, id: &str) -> Value {
    server
        .http
        .get(format!("{}/v1/tasks/{id}", server.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// A door call; the answer and its task.
async fn embed_call(server: &Server, texts: &[String]) -> (Value, Value) {
    let response = server
        .http
        .post(format!("{}/openai/v1/embeddings", server.base))
        .bearer_auth(KEY)
        .json(&json!({"model": "big", "input": texts}))
        .send()
        .await
        .expect("the server answers");
    let status = response.status();
    let id = response.headers()["x-tollgate-task-id"]
        .to_str()
        .unwrap()
        .to_string();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
    let task = get_task(server, &id).await;
    (answer, task)
}

#[track_caller]
fn assert_charged(task: &Value, tokens: u64) {
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["usage"]["input_tokens"], tokens, "{task}");
    assert_eq!(task["usage"]["output_tokens"], 0, "{task}");
    let cost = task["usage"]["cost_usd"].as_f64().unwrap_or(0.0);
    assert!(
        (cost - tokens as f64 * 1e-6).abs() < 1e-12,
        "{tokens} tokens at $1 per million, not {cost}: {task}"
    );
}

async fn a_thousand_inputs_with_990_cached_call_the_provider_for_10_and_are_charged_for_10(
    backend: &str,
) {
    let (url, calls) = fake_provider().await;
    let Some(server) = start(backend, &url).await else {
        return;
    };
    let first: Vec<String> = (0..1000).map(|i| format!("document {i}")).collect();
    let (answer, task) = embed_call(&server, &first).await;
    assert_eq!(answer["data"].as_array().unwrap().len(), 1000);
    assert_eq!(answer["usage"]["prompt_tokens"], bytes(&first));
    assert_charged(&task, bytes(&first));
    let sent: Vec<String> = calls.lock().unwrap().concat();
    assert_eq!(sent, first, "every text embedded once");

    // 990 of the same texts, 10 new ones, in another order.
    let new: Vec<String> = (0..10).map(|i| format!("fresh text {i}")).collect();
    let mut second: Vec<String> = new.clone();
    second.extend(first[..990].iter().rev().cloned());
    let before = calls.lock().unwrap().len();
    let (answer, task) = embed_call(&server, &second).await;
    let sent: Vec<String> = calls.lock().unwrap()[before..].concat();
    assert_eq!(sent, new, "only the 10 new texts reach the provider");
    assert_eq!(answer["usage"]["prompt_tokens"], bytes(&new));
    assert_charged(&task, bytes(&new));
    // The cached items answer the vectors the first call got, in this call's order.
    let vector = |answer: &Value, i: usize| answer["data"][i]["embedding"].clone();
    let (_, again) = embed_call(&server, &first[..3]).await;
    assert_charged(&again, 0);
    assert_eq!(
        vector(&answer, 10 + 989),
        json!([10.0, 100.0, 1.0]),
        "document 0"
    );
    assert_eq!(
        vector(&answer, 0),
        json!([12.0, f64::from(b'f'), 1.0]),
        "fresh text 0"
    );

    // The scope's settled spend is the two charged calls.
    let usage: Value = server
        .http
        .get(format!("{}/v1/usage", server.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let settled = usage["settled_usd"].as_f64().unwrap();
    let expected = (bytes(&first) + bytes(&new)) as f64 * 1e-6;
    assert!((settled - expected).abs() < 1e-12, "{usage}");
    assert_eq!(usage["reserved_usd"].as_f64(), Some(0.0), "{usage}");
}

async fn embed_tasks_submitted_together_share_calls_and_are_each_charged_their_own(backend: &str) {
    let (url, calls) = fake_provider().await;
    let Some(server) = start(backend, &url).await else {
        return;
    };
    let tasks: Vec<Vec<String>> = (0..5)
        .map(|t| {
            (0..3)
                .map(|i| format!("task {t} text {i}{}", "x".repeat(t)))
                .collect()
        })
        .collect();
    let submits = tasks.iter().enumerate().map(|(t, texts)| {
        let (http, base) = (server.http.clone(), server.base.clone());
        let body = json!({"kind": "embed", "scope": "grouped", "model": "emb",
            "request": {"input": texts}});
        async move {
            let task: Value = http
                .post(format!("{base}/v1/tasks?wait=20s"))
                .bearer_auth(KEY)
                .header("Idempotency-Key", format!("grouped-{t}"))
                .json(&body)
                .send()
                .await
                .expect("submit")
                .json()
                .await
                .expect("JSON");
            task
        }
    });
    let submitted = futures::future::join_all(submits).await;
    for (task, texts) in submitted.iter().zip(&tasks) {
        let id = task["id"].as_str().expect("a task id");
        let task = get_task(&server, id).await;
        assert_charged(&task, bytes(texts));
        let vectors = task["output"]["embeddings"].as_array().unwrap();
        assert_eq!(vectors.len(), 3);
        for (v, text) in vectors.iter().zip(texts) {
            assert_eq!(
                v[0],
                json!(text.len() as f64),
                "each task gets its own vectors"
            );
        }
    }
    let calls = calls.lock().unwrap().clone();
    let mut sent: Vec<String> = calls.concat();
    sent.sort();
    let mut all: Vec<String> = tasks.concat();
    all.sort();
    assert_eq!(sent, all, "every text embedded exactly once");
    assert!(calls.iter().all(|c| c.len() <= 6), "{calls:?}");
    assert!(
        calls.len() < tasks.len(),
        "tasks share calls: {} calls for {} tasks",
        calls.len(),
        tasks.len()
    );
}
