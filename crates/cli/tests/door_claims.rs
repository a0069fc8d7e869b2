//! The OpenAI door's calls start on their hint alone (issue 30's time to first token):
//! the real `tollgate serve` (SQLite and PostgreSQL) with `notifications.poll_interval`
//! at one hour, so a call whose task a worker did not claim on the submission's hint
//! would wait for the poll (the test's timeout first). Calls go one after another, each
//! with its own `Idempotency-Key`, over several scopes, sourced and not, streamed and
//! not; every one must answer within seconds.
//!
//! Also: a door task is released by the write that creates it (a sourced call leaves no
//! unreleased source behind, where a `POST /v1/tasks` task of the same scope does), and
//! a replay of a key answers the same task without a second provider call. With the
//! pool idle, the calls' tasks are created claimed (they need no hint at all), as are
//! `POST /v1/tasks?wait=` tasks; a `POST /v1/tasks` task nobody waits for is created
//! queued. Without a free slot a call's task is queued instead, and claimed from the
//! queue once a slot frees.

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

#[macro_use]
mod common;

const ACME: &str = "acme-key-0123456789abcdef";
/// Longest a call may take: far below the poll interval, far above a claim.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Calls per backend (half streamed).
const CALLS: usize = 16;

/// An OpenAI-compatible fake: streams "Hello " and "world" at once when asked to
/// stream, answers whole otherwise; counts its calls.
async fn start_fake() -> (String, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route("/v1/chat/completions", post(answer))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, calls)
}

/// The fakes' answer to a call that does not stream.
fn whole_answer() -> Value {
    json!({
        "id": "x", "object": "chat.completion", "created": 1, "model": "fake-model",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "Hello world"}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    })
}

async fn answer(State(calls): State<Arc<AtomicUsize>>, body: Bytes) -> Response {
    calls.fetch_add(1, Ordering::SeqCst);
    let body: Value = serde_json::from_slice(&body).unwrap();
    let usage = whole_answer()["usage"].clone();
    if body["stream"] != true {
        return axum::Json(whole_answer()).into_response();
    }
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": "x", "object": "chat.completion.chunk", "created": 1,
                       "model": "fake-model",
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        format!("data: {c}\n\n")
    };
    let last = json!({"id": "x", "object": "chat.completion.chunk", "created": 1,
                      "model": "fake-model", "choices": [], "usage": usage});
    let pieces = [
        chunk(
            json!({"role": "assistant", "content": "Hello "}),
            Value::Null,
        ),
        chunk(json!({"content": "world"}), Value::Null),
        chunk(json!({}), json!("stop")),
        format!("data: {last}\n\n"),
        "data: [DONE]\n\n".to_string(),
    ];
    let (tx, rx) = mpsc::channel::<Result<String, std::io::Error>>(8);
    tokio::spawn(async move {
        for piece in pieces {
            let _ = tx.send(Ok(piece)).await;
        }
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
max_wait = "30s"

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
max_steps_per_source = 1000
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 1000
tasks_per_minute = 6000

[apps.acme]
api_keys = ["{ACME}"]
default_budget = "standard"

[notifications]
poll_interval = "1h"

[workers]
concurrency = 4
"#
    )
}

/// One door call: its answer's text (streamed or not) and task id, within
/// [`CALL_TIMEOUT`].
async fn door_call(
    server: &common::Server,
    key: &str,
    scope: &str,
    source: Option<&str>,
    stream: bool,
) -> (String, String) {
    let mut request = server
        .http
        .post(format!("{}/openai/v1/chat/completions", server.base))
        .bearer_auth(ACME)
        .header("Idempotency-Key", key)
        .header("X-Tollgate-Scope", scope)
        .json(&json!({"model": "default", "stream": stream,
                      "messages": [{"role": "user", "content": format!("call {key}")}]}));
    if let Some(source) = source {
        request = request.header("X-Tollgate-Source", source);
    }
    let call = async {
        let response = request.send().await.expect("the server answers");
        assert_eq!(response.status(), 200, "call {key}");
        let task = response.headers()["x-tollgate-task-id"]
            .to_str()
            .unwrap()
            .to_string();
        let text = response.text().await.expect("the whole answer");
        (text, task)
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(answered) => answered,
        Err(_) => panic!(
            "call {key} (scope {scope}, stream {stream}) did not answer within {CALL_TIMEOUT:?}: \
             its task was not claimed on its hint"
        ),
    }
}

/// `POST /v1/tasks{query}` of a `generate_text` task of scope `s2` with effect key `key`.
async fn post_task(server: &common::Server, query: &str, key: &str) -> reqwest::Response {
    server
        .http
        .post(format!("{}/v1/tasks{query}", server.base))
        .bearer_auth(ACME)
        .json(
            &json!({"kind": "generate_text", "scope": "s2", "step": "api",
                      "effect_key": key, "request": {"prompt": "Say hello"}}),
        )
        .send()
        .await
        .unwrap()
}

async fn door_calls_start_on_their_hint_alone(backend: &str) {
    let (fake, provider_calls) = start_fake().await;
    let Some(server) = common::start(backend, "door_claims", |db| config_text(db, &fake)) else {
        return;
    };
    let run = uuid::Uuid::new_v4().simple().to_string();
    let mut tasks = Vec::new();
    for i in 0..CALLS {
        let key = format!("{run}-{i}");
        let scope = format!("s{}", i % 3);
        let source = (i % 4 == 1).then(|| format!("doc-{i}"));
        let stream = i % 2 == 0;
        let (text, task) = door_call(&server, &key, &scope, source.as_deref(), stream).await;
        if stream {
            assert!(text.contains("Hello "), "{text}");
            assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
        } else {
            let body: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(body["choices"][0]["message"]["content"], "Hello world");
        }
        tasks.push(task);
    }
    assert_eq!(provider_calls.load(Ordering::SeqCst), CALLS);

    // One call at a time on an idle pool: the calls' tasks were created claimed by this
    // replica's worker (docs/engine.md, "Tasks claimed at creation"), not claimed
    // from the queue.
    let at_creation = server
        .metric("tollgate_claims_total{via=\"creation\"}")
        .await;
    assert!(
        at_creation >= (CALLS / 2) as f64,
        "{at_creation} of {CALLS} calls claimed at creation"
    );

    // A replay answers the same task; the provider is not called again.
    let (_, again) = door_call(&server, &format!("{run}-0"), "s0", None, true).await;
    assert_eq!(again, tasks[0]);
    assert_eq!(provider_calls.load(Ordering::SeqCst), CALLS);

    // Door tasks are released at creation: no sourced door call left an unreleased
    // source; a task of the same scope through POST /v1/tasks did.
    let task = server
        .http
        .post(format!("{}/v1/tasks?wait=20s", server.base))
        .bearer_auth(ACME)
        .json(
            &json!({"kind": "generate_text", "scope": "s1", "step": "api",
                      "effect_key": format!("{run}-api"),
                      "source": {"id": "doc-api", "revision": "1"},
                      "request": {"prompt": "Say hello"}}),
        )
        .send()
        .await
        .unwrap();
    assert!(task.status().is_success(), "{}", task.text().await.unwrap());
    let unreleased: Value = server
        .http
        .get(format!("{}/v1/scopes/s1/unreleased-sources", server.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        unreleased["sources"],
        json!([{"scope": "s1", "source": "doc-api"}]),
        "{unreleased}"
    );

    // POST /v1/tasks: a task its caller waits for is created claimed on the idle pool too;
    // one it does not wait for is created queued, as docs/conformance.md#creating-a-task
    // inserts it, and answered so.
    const WAITED: usize = 6;
    let before = server
        .metric("tollgate_claims_total{via=\"creation\"}")
        .await;
    for i in 0..WAITED {
        let answer: Value = post_task(&server, "?wait=20s", &format!("{run}-waited-{i}"))
            .await
            .json()
            .await
            .unwrap();
        assert_eq!(answer["status"], "succeeded", "{answer}");
    }
    let waited = server
        .metric("tollgate_claims_total{via=\"creation\"}")
        .await
        - before;
    assert!(
        waited >= (WAITED / 2) as f64,
        "{waited} of {WAITED} waited tasks claimed at creation"
    );
    let created = post_task(&server, "", &format!("{run}-unwaited")).await;
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    assert_eq!(created["status"], "queued", "{created}");
    assert_eq!(
        server
            .metric("tollgate_claims_total{via=\"creation\"}")
            .await,
        before + waited,
        "a task nobody waits for is never created claimed"
    );
}

/// A fake that holds every call until the test lets it answer (one permit of `gate` a
/// call); counts the calls it has begun.
async fn start_held_fake() -> (String, Arc<AtomicUsize>, Arc<tokio::sync::Semaphore>) {
    let begun = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let state = (begun.clone(), gate.clone());
    let app = Router::new()
        .route("/v1/chat/completions", post(held_answer))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, begun, gate)
}

async fn held_answer(
    State((begun, gate)): State<(Arc<AtomicUsize>, Arc<tokio::sync::Semaphore>)>,
) -> Response {
    begun.fetch_add(1, Ordering::SeqCst);
    gate.acquire().await.unwrap().forget();
    axum::Json(whole_answer()).into_response()
}

/// docs/engine.md, "Tasks claimed at creation": only with an execution slot free.
/// With one slot, held by a first call's execution, a second call's task is queued (its
/// provider call does not begin while the first holds the slot) and is claimed from the
/// queue once the slot is free: at most the first was claimed at its creation.
async fn a_door_call_without_a_free_slot_is_queued(backend: &str) {
    let (fake, begun, gate) = start_held_fake().await;
    let Some(server) = common::start(backend, "door_busy", |db| {
        config_text(db, &fake).replace("concurrency = 4", "concurrency = 1")
    }) else {
        return;
    };
    let server = Arc::new(server);
    let run = uuid::Uuid::new_v4().simple().to_string();
    let call = |n: u32| {
        let (server, key) = (server.clone(), format!("{run}-{n}"));
        tokio::spawn(async move { door_call(&server, &key, "s", None, false).await })
    };
    let first = call(1);
    let deadline = tokio::time::Instant::now() + CALL_TIMEOUT;
    while begun.load(Ordering::SeqCst) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first call never began"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let second = call(2);
    // Long enough for the second call's task to be created and, were it claimed, to
    // reach the provider.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        begun.load(Ordering::SeqCst),
        1,
        "the second call's task started while the only slot was held"
    );
    gate.add_permits(2);
    first.await.unwrap();
    second.await.unwrap();
    assert_eq!(begun.load(Ordering::SeqCst), 2);
    let at_creation = server
        .metric("tollgate_claims_total{via=\"creation\"}")
        .await;
    let from_queue = server.metric("tollgate_claims_total{via=\"hint\"}").await
        + server.metric("tollgate_claims_total{via=\"poll\"}").await;
    assert!(
        at_creation <= 1.0,
        "{at_creation} calls claimed at creation"
    );
    assert!(
        from_queue >= 1.0,
        "the second call was not claimed from the queue"
    );
}

on_both_backends!(
    door_calls_start_on_their_hint_alone,
    a_door_call_without_a_free_slot_is_queued
);
