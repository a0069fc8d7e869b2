//! The engine's effect-key namespaces over HTTP against the real `tollgate serve`
//! binary, on SQLite and (with `TOLLGATE_TEST_DATABASE_URL`) PostgreSQL (issue 26 item
//! 12, docs/api.md "Effect keys"): keys starting with `run:` (pipeline steps) or
//! `openai-` (the OpenAI-compatible door) are refused from callers with a 400 naming the
//! rule, so
//! - a subject-bound key cannot submit its own request as a step of its run
//!   (`Idempotency-Key: run:R:b`): the run still runs the definition's request;
//! - another subject cannot fail that run by taking the step's key first;
//! - `openai-X` on `/v1/tasks` (or in a batch) cannot make the door's `X` answer 409.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::time::Duration;

mod common;

const ACME: &str = "acme-key-0123456789abcdef";
const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";

fn config_text(db: &str) -> String {
    format!(
        r#"
[server]
max_wait = "20s"

[database]
url = "{db}"

[models.default]
provider = "dev"
model = "dev-1"

[models.slow]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 2500 }}

[apps.acme]
api_keys = [
  "{ACME}",
  {{ key = "{ALICE}", subject = "user:alice" }},
  {{ key = "{BOB}", subject = "user:bob" }},
]

[workers]
concurrency = 4
heartbeat_interval = "200ms"

[sweeper]
interval = "500ms"

[pipelines]
poll_interval = "200ms"
"#
    )
}

/// Step `a` is slow, so step `b` is not submitted yet when the callers try its key.
fn two_steps() -> Value {
    json!({
        "name": "two-steps",
        "definition": {
            "steps": [
                {"key": "a", "kind": "generate_text", "model": "slow",
                 "request": {"prompt": {"$from": "/input/text"}, "max_output_tokens": 20}},
                {"key": "b", "kind": "classify", "depends_on": ["a"],
                 "request": {"input": {"$from": "/steps/a/output/text"},
                             "labels": ["definition-label-1", "definition-label-2"]}}
            ],
            "output": {"label": "/steps/b/output/label"}
        }
    })
}

async fn call(
    s: &common::Server,
    method: reqwest::Method,
    path: &str,
    key: &str,
    idempotency_key: Option<&str>,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut rb = s
        .http
        .request(method, format!("{}{path}", s.base))
        .bearer_auth(key);
    if let Some(k) = idempotency_key {
        rb = rb.header("idempotency-key", k);
    }
    if let Some(b) = body {
        rb = rb.json(&b);
    }
    let r = rb.send().await.expect("the server answers");
    let status = r.status();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A 400 `reserved_effect_key` whose message names the reserved namespaces.
fn assert_reserved(status: StatusCode, body: &Value, what: &str) {
    assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {body}");
    assert_eq!(
        body["error"]["code"], "reserved_effect_key",
        "{what}: {body}"
    );
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("effect_key") && message.contains("reserved for the engine"),
        "{what}: the message names the rule: {message}"
    );
}

async fn engine_keys_are_closed_to_callers(backend: &str) {
    let Some(s) = common::start(backend, "effkeys", config_text) else {
        return;
    };
    use reqwest::Method;
    let (st, p) = call(
        &s,
        Method::POST,
        "/v1/pipelines",
        ACME,
        None,
        Some(two_steps()),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    let (st, run) = call(
        &s,
        Method::POST,
        "/v1/pipelines/two-steps/runs",
        ALICE,
        None,
        Some(json!({"scope": "s1", "input": {"text": "an invoice from Initech"}})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{run}");
    let run_id = run["id"].as_str().expect("run id").to_string();
    let step_b = format!("run:{run_id}:b");

    // 1. The run's own subject submits its request as step `b` of the run.
    let (st, e) = call(
        &s,
        Method::POST,
        "/v1/tasks",
        ALICE,
        Some(&step_b),
        Some(json!({
            "kind": "classify", "run_id": run_id, "step": "b",
            "request": {"input": "caller's own input", "labels": ["attacker-label"]}
        })),
    )
    .await;
    assert_reserved(st, &e, "a step's key into its run");
    // 2. Another subject takes the step's key first, as an application task.
    let (st, e) = call(
        &s,
        Method::POST,
        "/v1/tasks",
        BOB,
        Some(&step_b),
        Some(json!({
            "kind": "classify", "scope": "s1",
            "request": {"input": "x", "labels": ["p", "q"]}
        })),
    )
    .await;
    assert_reserved(st, &e, "another subject's step key");
    // The body field is refused like the header, and a retry's key `…#1` too.
    let (st, e) = call(
        &s,
        Method::POST,
        "/v1/tasks",
        ACME,
        None,
        Some(json!({
            "kind": "classify", "scope": "s1", "effect_key": format!("{step_b}#1"),
            "request": {"input": "x", "labels": ["p", "q"]}
        })),
    )
    .await;
    assert_reserved(st, &e, "a retry's key in the body");
    let (st, found) = call(
        &s,
        Method::GET,
        &format!("/v1/tasks?effect_key={}", urlencode(&step_b)),
        ACME,
        None,
        None,
    )
    .await;
    assert_eq!(
        st,
        StatusCode::NOT_FOUND,
        "nothing was stored under the step's key before the driver: {found}"
    );

    // The run runs the definition's request as step `b`, and succeeds.
    let (st, done) = call(
        &s,
        Method::GET,
        &format!("/v1/runs/{run_id}?wait=20s"),
        ALICE,
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{done}");
    assert_eq!(done["state"], "succeeded", "{done}");
    let b_task = done["pipeline"]["steps"][1]["task_id"]
        .as_str()
        .expect("step b's task")
        .to_string();
    let (st, task) = call(
        &s,
        Method::GET,
        &format!("/v1/tasks/{b_task}"),
        ACME,
        None,
        None,
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{task}");
    assert_eq!(task["effect_key"], json!(step_b));
    assert_eq!(task["run_id"], json!(run_id));
    assert_eq!(
        task["request"]["labels"],
        json!(["definition-label-1", "definition-label-2"]),
        "the definition's request ran: {task}"
    );

    // 3. `openai-X` on /v1/tasks, and in a batch, is refused; the door's `X` is the door's.
    let (st, e) = call(
        &s,
        Method::POST,
        "/v1/tasks",
        ACME,
        Some("openai-X"),
        Some(json!({
            "kind": "generate_text", "scope": "openai",
            "request": {"prompt": "not the door's", "max_output_tokens": 5}
        })),
    )
    .await;
    assert_reserved(st, &e, "a door key on /v1/tasks");
    let (st, batch) = call(
        &s,
        Method::POST,
        "/v1/tasks/batch",
        ACME,
        None,
        Some(json!({"tasks": [
            {"kind": "generate_text", "scope": "openai", "effect_key": "openai-X",
             "request": {"prompt": "not the door's", "max_output_tokens": 5}},
            {"kind": "generate_text", "scope": "openai", "effect_key": "mine-openai-X",
             "request": {"prompt": "fine", "max_output_tokens": 5}}
        ]})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{batch}");
    let results = batch["results"].as_array().expect("results");
    assert_eq!(results[0]["status"], 400, "{batch}");
    assert_eq!(
        results[0]["error"]["code"], "reserved_effect_key",
        "{batch}"
    );
    assert!(
        results[0]["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("reserved for the engine")),
        "{batch}"
    );
    assert_eq!(results[1]["status"], 201, "{batch}");
    let door = s
        .http
        .post(format!("{}/openai/v1/chat/completions", s.base))
        .bearer_auth(ACME)
        .header("idempotency-key", "X")
        .json(&json!({"model": "default", "messages": [{"role": "user", "content": "hello"}]}))
        .timeout(Duration::from_secs(30))
        .send()
        .await
        .expect("the door answers");
    let status = door.status();
    let body: Value = door.json().await.unwrap_or(Value::Null);
    assert_eq!(status, StatusCode::OK, "the door's X is the door's: {body}");
    assert_eq!(body["object"], "chat.completion", "{body}");
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_keys_are_closed_to_callers_sqlite() {
    engine_keys_are_closed_to_callers("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_keys_are_closed_to_callers_postgres() {
    engine_keys_are_closed_to_callers("postgres").await;
}
