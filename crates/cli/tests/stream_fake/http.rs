//! The server side of `crates/cli/tests/streaming_reasks.rs`: the configuration its
//! `tollgate serve` runs (models `once`, `twice`, the fallback route `routed` and
//! `retried`, whose provider retries a call once, all on the [`Fake`]), and the HTTP
//! calls and checks its tests share.

use super::{Events, Fake};
use crate::common::{self, Server};
use reqwest::StatusCode;
use serde_json::{Value, json};

pub const ACME: &str = "acme-key-0123456789abcdef";

/// Prices are $1/M input and $2/M output tokens on every deployment.
pub fn config_text(database_url: &str, provider_url: &str) -> String {
    let prices = "prices = { input_per_million = 1.0, output_per_million = 2.0 }";
    format!(
        r#"
default_model = "once"

[server]
max_wait = "20s"

[database]
url = "{database_url}"

[models.once]
provider = "fake"
model = "once-model"
max_output_tokens = 50
max_attempts = 1
{prices}

[models.twice]
provider = "fake"
model = "twice-model"
max_output_tokens = 50
max_attempts = 2
{prices}

[models.routed]
strategy = "fallback"
cooldown = "1m"
max_attempts = 2

[[models.routed.deployments]]
provider = "fake"
model = "flaky-model"
max_output_tokens = 50
{prices}

[[models.routed.deployments]]
provider = "fake"
model = "good-model"
max_output_tokens = 50
{prices}

[models.retried]
provider = "retrying"
model = "retried-model"
max_output_tokens = 50
max_attempts = 1
{prices}

[providers.fake]
kind = "openai"
base_url = "{provider_url}/v1"
max_retries = 0

[providers.retrying]
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
usd_per_24_hours = 1.0

[apps.acme]
api_keys = ["{ACME}"]
default_budget = "standard"

[workers]
concurrency = 4
heartbeat_interval = "200ms"
"#
    )
}

pub async fn start(backend: &str) -> Option<(Fake, Server)> {
    let fake = Fake::start().await;
    let url = fake.url.clone();
    let server = common::start(backend, "streamre", |db| config_text(db, &url))?;
    Some((fake, server))
}

impl Server {
    /// A door call with `stream: true` (and the usage chunk) in `scope`.
    pub async fn door(&self, scope: &str, key: Option<&str>, body: Value) -> reqwest::Response {
        let mut body = body;
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let mut rb = self
            .http
            .post(format!("{}/openai/v1/chat/completions", self.base))
            .bearer_auth(ACME)
            .header("x-tollgate-scope", scope)
            .json(&body);
        if let Some(k) = key {
            rb = rb.header("idempotency-key", k);
        }
        let response = rb.send().await.expect("the server answers");
        assert_eq!(response.status(), StatusCode::OK);
        let kind = response.headers()["content-type"].to_str().unwrap();
        assert!(kind.starts_with("text/event-stream"), "{kind}");
        response
    }

    /// Submits a task through `POST /v1/tasks` (a fresh effect key); its id.
    pub async fn submit(&self, body: Value) -> String {
        let response = self
            .http
            .post(format!("{}/v1/tasks", self.base))
            .bearer_auth(ACME)
            .header("idempotency-key", uuid::Uuid::new_v4().to_string())
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let task: Value = response.json().await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "{task}");
        task["id"].as_str().unwrap().to_string()
    }

    pub async fn get(&self, path: &str) -> Value {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.json().await.unwrap()
    }

    /// The task once it ended.
    pub async fn ended(&self, id: &str) -> Value {
        let task = self.get(&format!("/v1/tasks/{id}?wait=20")).await;
        assert!(
            matches!(
                task["status"].as_str(),
                Some("succeeded" | "failed" | "canceled")
            ),
            "{task}"
        );
        task
    }

    /// A reader of the task's events.
    pub async fn events(&self, id: &str) -> Events {
        let response = self
            .http
            .get(format!("{}/v1/tasks/{id}/events", self.base))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        Events::of(response)
    }
}

pub fn task_id(response: &reqwest::Response) -> String {
    response.headers()["x-tollgate-task-id"]
        .to_str()
        .unwrap()
        .to_string()
}

/// The `content` pieces of door chunks, in order.
pub fn content(events: &[(String, String)]) -> Vec<String> {
    events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .filter(|t| !t.is_empty())
        .collect()
}

pub fn close(a: &Value, b: f64) -> bool {
    a.as_f64().is_some_and(|a| (a - b).abs() < 1e-12)
}

/// $ at $1/M input and $2/M output tokens.
pub fn cost(input: u64, output: u64) -> f64 {
    (input as f64 + 2.0 * output as f64) / 1e6
}

/// The scope's usage report: everything settled, nothing left reserved, and the
/// settled spend is `settled`.
pub async fn assert_settled(server: &Server, scope: &str, settled: f64) {
    let usage = server.get(&format!("/v1/scopes/{scope}/usage")).await;
    assert!(close(&usage["reserved_usd"], 0.0), "{usage}");
    assert_eq!(usage["reserved_tokens"], 0, "{usage}");
    assert!(close(&usage["settled_usd"], settled), "{settled}: {usage}");
}

/// The sum of the task's attempts' `cost_usd` (each > 0).
pub fn attempts_cost(task: &Value) -> f64 {
    let attempts = task["attempts"].as_array().expect("attempts");
    attempts
        .iter()
        .map(|a| {
            let c = a["cost_usd"].as_f64().unwrap_or(0.0);
            assert!(c > 0.0, "every attempt is charged: {task}");
            c
        })
        .sum()
}

/// The door's error event (the stream's last, no `[DONE]` after it).
pub fn door_error(events: &[(String, String)]) -> Value {
    let (_, last) = events.last().expect("events");
    let error: Value = serde_json::from_str(last).unwrap_or_else(|_| panic!("{last}"));
    assert!(error["error"].is_object(), "{error}");
    assert!(events.iter().all(|(_, d)| d != "[DONE]"), "{events:?}");
    error["error"].clone()
}
