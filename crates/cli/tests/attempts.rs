//! docs/routes.md, "Attempts", with the real binary: a `serve` replica is SIGKILLed in
//! the middle of a task's provider call; another replica on the same database puts the
//! task back in the queue once the dead one's lease lapses, makes the next attempt and
//! succeeds. The task shows both attempts (the first `interrupted`, charged its
//! reservation; the second `succeeded`, charged its usage) and its scope's spend is
//! their sum. Both backends (the SQLite replicas run one after the other on one file).

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod common;

const KEY: &str = "attempts-key-0123456789abcdef";

/// Counts calls; the first hangs (its replica is killed meanwhile), the others answer.
async fn chat(State(calls): State<Arc<AtomicUsize>>, Json(_body): Json<Value>) -> Json<Value> {
    if calls.fetch_add(1, Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_secs(120)).await;
    }
    Json(json!({
        "id": "chatcmpl-attempts",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant",
            "content": json!({"label": "spam"}).to_string()}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    }))
}

async fn start_fake() -> (Arc<AtomicUsize>, String) {
    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(calls.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (calls, url)
}

fn config_text(database_url: &str, provider: &str) -> String {
    format!(
        r#"
[database]
url = "{database_url}"

[models.default]
provider = "fake"
model = "fake-1"
max_output_tokens = 20
prices = {{ input_per_million = 1000.0, output_per_million = 1000.0 }}

[providers.fake]
kind = "openai"
base_url = "{provider}"
timeout = "180s"
max_retries = 0

[budgets.standard]
max_steps_per_source = 1000
sources_per_24_hours = 100000
scope_concurrent = 10000
burst = 10000
tasks_per_minute = 60000
usd_per_24_hours = 1000.0

[apps.acme]
api_keys = ["{KEY}"]

[workers]
heartbeat_interval = "100ms"

[sweeper]
interval = "200ms"
liveness_timeout = "1s"

[notifications]
poll_interval = "200ms"
"#
    )
}

/// Another `serve` replica on the same configuration file.
fn replica(config: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(config)
        .current_dir(config.parent().unwrap())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the tollgate binary starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("Tollgate listening on ") {
                let _ = tx.send(addr.trim().to_string());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the replica prints its address");
    (child, base)
}

async fn get(http: &reqwest::Client, base: &str, path: &str) -> Value {
    http.get(format!("{base}{path}"))
        .bearer_auth(KEY)
        .send()
        .await
        .expect("the replica answers")
        .json()
        .await
        .expect("JSON")
}

async fn a_replica_killed_mid_attempt_leaves_the_next_attempt_to_another(backend: &str) {
    let (calls, provider) = start_fake().await;
    let Some(mut first) = common::start(backend, "attempts", |db| config_text(db, &provider))
    else {
        return;
    };
    let http = reqwest::Client::new();
    let submitted: Value = http
        .post(format!("{}/v1/tasks", first.base))
        .bearer_auth(KEY)
        .header("Idempotency-Key", "crash-mid-attempt")
        .json(&json!({"kind": "classify", "scope": "s",
            "source": {"id": "doc", "revision": "v1"},
            "request": {"input": "Win a free cruise!", "labels": ["spam", "ham"]}}))
        .send()
        .await
        .expect("submit")
        .json()
        .await
        .expect("JSON");
    let id = submitted["id"].as_str().expect("a task id").to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    while calls.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "the first replica never called the provider"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // SIGKILL mid-call: nothing is recorded; the task stays running under a dead worker.
    first.child.kill().expect("SIGKILL");
    first.child.wait().expect("reaped");

    let config = first._dir.path().join("tollgate.toml");
    let (mut second, base) = replica(&config);
    let deadline = Instant::now() + Duration::from_secs(60);
    let task = loop {
        let t = get(&http, &base, &format!("/v1/tasks/{id}")).await;
        if ["succeeded", "failed", "canceled"].contains(&t["status"].as_str().unwrap_or("")) {
            break t;
        }
        assert!(Instant::now() < deadline, "the task never ended: {t}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let usage = get(&http, &base, "/v1/scopes/s/usage").await;
    let _ = second.kill();
    let _ = second.wait();

    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "one call per attempt");
    let attempts = task["attempts"].as_array().expect("attempts");
    let outcomes: Vec<&str> = attempts
        .iter()
        .map(|a| a["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["interrupted", "succeeded"], "{task}");
    assert!(attempts.iter().all(|a| a["deployment"] == "fake/fake-1"));
    assert_eq!(attempts[0]["error"]["code"], "WORKFLOW_AI_INTERRUPTED");
    let cost = |a: &Value| a["cost_usd"].as_f64().expect("priced");
    // The interrupted attempt is charged its reservation (its worst case), the second
    // its 12 tokens at $1,000 per million.
    assert!((cost(&attempts[1]) - 0.012).abs() < 1e-9, "{task}");
    assert!(cost(&attempts[0]) > cost(&attempts[1]), "{task}");
    let settled = usage["settled_usd"].as_f64().expect("settled_usd");
    assert!(
        (settled - (cost(&attempts[0]) + cost(&attempts[1]))).abs() < 1e-6,
        "the task is charged both attempts: {usage} vs {task}"
    );
    assert_eq!(usage["reserved_usd"].as_f64(), Some(0.0), "{usage}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_attempt_leaves_the_next_attempt_to_another_sqlite() {
    a_replica_killed_mid_attempt_leaves_the_next_attempt_to_another("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_attempt_leaves_the_next_attempt_to_another_postgres() {
    a_replica_killed_mid_attempt_leaves_the_next_attempt_to_another("postgres").await;
}
