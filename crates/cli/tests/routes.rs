//! docs/routes.md over HTTP: the real `tollgate serve` binary with a `fallback` route of
//! two deployments on scripted OpenAI-compatible providers in this process (the first
//! answers 500, the second answers), on SQLite and (with `TOLLGATE_TEST_DATABASE_URL`)
//! PostgreSQL:
//!
//! - `GET /v1/models` lists the route (strategy, deployments with prices, cooldown,
//!   attempt timeout) and `GET /openai/v1/models` adds it as `tollgate_route`, with no
//!   key anywhere;
//! - a task submitted over HTTP falls back to the second deployment and succeeds; the
//!   failing deployment is then cooled down, so the next task never calls it.

use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::Server;

const ACME: &str = "acme-key-0123456789abcdef";
const SECRET: &str = "sk-route-secret-never-shown";

/// A fake provider answering every call with `status` (200: a `spam` label), counting
/// the calls.
async fn fake(status: u16) -> (String, Arc<AtomicU64>) {
    let calls = Arc::new(AtomicU64::new(0));
    let app = Router::new()
        .route(
            "/v1/chat/completions",
            post(
                move |State(calls): State<Arc<AtomicU64>>, Json(_body): Json<Value>| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let status = StatusCode::from_u16(status).unwrap();
                    if status != StatusCode::OK {
                        return (status, Json(json!({"error": {"message": "down"}})));
                    }
                    (
                        status,
                        Json(json!({
                            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
                            "model": "m",
                            "choices": [{"index": 0, "message": {"role": "assistant",
                                "content": "{\"label\": \"spam\", \"confidence\": 0.9}"},
                                "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
                        })),
                    )
                },
            ),
        )
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, calls)
}

fn config_text(database_url: &str, bad: &str, good: &str) -> String {
    format!(
        r#"
[database]
url = "{database_url}"

[models.default]
strategy = "fallback"
cooldown = "1m"
attempt_timeout = "5s"

[[models.default.deployments]]
provider = "bad"
model = "bad-model"
prices = {{ input_per_million = 1.0, output_per_million = 2.0 }}

[[models.default.deployments]]
provider = "good"
model = "good-model"
prices = {{ input_per_million = 3.0, output_per_million = 4.0, cached_input_per_million = 1.5, cache_write_input_per_million = 3.75 }}

[providers.bad]
kind = "openai"
base_url = "{bad}"
api_key_env = "ROUTES_TEST_SECRET"
max_retries = 1
retry_backoff = "10ms"

[providers.good]
kind = "openai"
base_url = "{good}"
max_retries = 0

[apps.acme]
api_keys = ["{ACME}"]

[workers]
concurrency = 2
heartbeat_interval = "200ms"

[sweeper]
interval = "500ms"
"#
    )
}

async fn get(s: &Server, path: &str) -> Value {
    let response = s
        .http
        .get(format!("{}{path}", s.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{path}");
    response.json().await.unwrap()
}

async fn run_task(s: &Server, key: &str) -> Value {
    let response = s
        .http
        .post(format!("{}/v1/tasks", s.base))
        .bearer_auth(ACME)
        .header("idempotency-key", key)
        .json(&json!({
            "kind": "classify", "scope": "s",
            "request": {"input": "Win a free cruise!", "labels": ["spam", "eggs"]}
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let task: Value = response.json().await.unwrap();
    let id = task["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t = get(s, &format!("/v1/tasks/{id}")).await;
        if matches!(
            t["status"].as_str(),
            Some("succeeded" | "failed" | "canceled")
        ) {
            return t;
        }
        assert!(Instant::now() < deadline, "task {id} never ended: {t}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn routes_over_http(backend: &str) {
    let (bad_url, bad_calls) = fake(500).await;
    let (good_url, good_calls) = fake(200).await;
    // SAFETY: set before the server process starts; no other thread reads it here.
    unsafe { std::env::set_var("ROUTES_TEST_SECRET", SECRET) };
    let Some(s) = common::start(backend, "routes", |db| config_text(db, &bad_url, &good_url))
    else {
        return;
    };

    let models = get(&s, "/v1/models").await;
    let model = &models["models"][0];
    assert_eq!(model["id"], "default");
    let route = &model["route"];
    assert_eq!(route["strategy"], "fallback");
    assert_eq!(route["cooldown_ms"], 60_000);
    assert_eq!(route["attempt_timeout_ms"], 5_000);
    let names: Vec<&str> = route["deployments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["bad/bad-model", "good/good-model"]);
    let prices = &route["deployments"][1]["prices"];
    assert_eq!(prices["output_usd_per_million"], 4.0);
    assert_eq!(prices["cached_input_usd_per_million"], 1.5);
    assert_eq!(
        prices["cache_write_input_usd_per_million"], 3.75,
        "cache-write prices show wherever prices do"
    );
    // An unset cache-write price is the input price (docs/providers.md).
    assert_eq!(
        route["deployments"][0]["prices"]["cache_write_input_usd_per_million"],
        1.0
    );
    let door = get(&s, "/openai/v1/models").await;
    assert_eq!(door["data"][0]["tollgate_route"], *route);
    for listing in [&models, &door] {
        assert!(
            !listing.to_string().contains(SECRET),
            "no key is ever listed"
        );
    }

    let first = run_task(&s, "first").await;
    assert_eq!(first["status"], "succeeded", "{first}");
    assert_eq!(first["output"]["label"], "spam");
    assert_eq!(
        bad_calls.load(Ordering::SeqCst),
        2,
        "one call and its retry"
    );
    assert_eq!(good_calls.load(Ordering::SeqCst), 1);

    let second = run_task(&s, "second").await;
    assert_eq!(second["status"], "succeeded", "{second}");
    assert_eq!(
        bad_calls.load(Ordering::SeqCst),
        2,
        "the failed deployment cools down: no call"
    );
    assert_eq!(good_calls.load(Ordering::SeqCst), 2);

    let metrics = s.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tollgate_route_cooldowns_total")
                && l.contains("bad/bad-model")),
        "the cooldown is counted: {metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_over_http_sqlite() {
    routes_over_http("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_over_http_postgres() {
    routes_over_http("postgres").await;
}
