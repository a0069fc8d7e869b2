//! The real `tollgate serve` binary (issue 11, items 1 and 2), on SQLite and (with
//! `TOLLGATE_TEST_DATABASE_URL`) on PostgreSQL:
//! - SIGTERM ends a server busy with CPU-heavy tasks and an open long-poll within
//!   `shutdown_grace` plus a few seconds, and hands the tasks it cut short back to the
//!   queue (their attempts `interrupted`);
//! - an API-only replica (`[workers] concurrency = 0`) still sweeps: a task nobody runs
//!   fails with `WORKFLOW_AI_QUEUE_TIMEOUT`.

use serde_json::{Value, json};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tollgate_core::{AppId, ErrorCode, TaskId, TaskStatus};
use tollgate_engine::{EngineConfig, Tollgate};

mod common;
use common::Server;

const KEY: &str = "shutdown-key-0123456789abcdef";
/// The shutdown grace of the busy server.
const GRACE: Duration = Duration::from_secs(2);
/// What SIGTERM may take on top of the grace (interrupted tasks are recorded, the
/// process exits), generous for a loaded machine.
const SLACK: Duration = Duration::from_secs(10);

/// Four options per level, each the whole schema again: the validator cuts a reference
/// back to itself at the same place of the value (so the submit-time cost rule accepts
/// it), but the dev builder, which follows `$ref`s sixteen levels deep, works through
/// 4^16 dead ends (until its time limit, minutes away) unless stopped.
fn endless_schema() -> Value {
    json!({"anyOf": [{"$ref": "#"}, {"$ref": "#"}, {"$ref": "#"}, {"$ref": "#"}]})
}

/// Starts `serve` with `extra` configuration; returns it with its database URL.
fn start(backend: &str, prefix: &str, extra: &'static str) -> Option<(Server, String)> {
    let url = Arc::new(Mutex::new(String::new()));
    let seen = url.clone();
    let server = common::start(backend, prefix, move |db| {
        *seen.lock().unwrap() = db.to_string();
        format!(
            r#"
[database]
url = "{db}"

[apps.acme]
api_keys = ["{KEY}"]

[notifications]
poll_interval = "200ms"
{extra}
"#
        )
    })?;
    let url = url.lock().unwrap().clone();
    Some((server, url))
}

async fn submit(server: &Server, effect_key: &str, kind: &str, request: Value) -> TaskId {
    let response = server
        .http
        .post(format!("{}/v1/tasks", server.base))
        .bearer_auth(KEY)
        .header("Idempotency-Key", effect_key)
        .json(&json!({"kind": kind, "scope": "s", "request": request}))
        .send()
        .await
        .unwrap();
    let status = response.status();
    let body: Value = response.json().await.unwrap();
    assert!(status.is_success(), "{status}: {body}");
    TaskId::parse(body["id"].as_str().unwrap()).unwrap()
}

async fn status_of(server: &Server, id: TaskId) -> Value {
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

/// The task as stored, read through the engine once the server is gone.
async fn stored(url: &str, id: TaskId) -> (tollgate_core::Task, Vec<tollgate_core::Attempt>) {
    let engine = Tollgate::open(url, EngineConfig::default()).await.unwrap();
    let app = AppId::new("acme").unwrap();
    let task = engine
        .get(&app, id)
        .await
        .unwrap()
        .expect("the task exists");
    (task, engine.attempts(&app, id).await.unwrap())
}

async fn sigterm_ends_a_busy_server_within_the_grace(backend: &str) {
    let Some((mut server, url)) = start(
        backend,
        "shutdown_busy",
        r#"
[server]
shutdown_grace = "2s"
max_wait = "60s"

[models.default]
provider = "dev"
model = "dev-1"
params = { time_limit_ms = 600000 }

[models.slow]
provider = "dev"
model = "dev-1"
params = { latency_ms = 60000 }

[workers]
concurrency = 12
heartbeat_interval = "200ms"
"#,
    ) else {
        return;
    };
    // CPU-heavy work: endless generations (one per core and more) and large outputs.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut endless = Vec::new();
    for i in 0..cores + 1 {
        let request = json!({"input": "x", "schema": endless_schema()});
        endless.push(submit(&server, &format!("endless-{i}"), "extract_data", request).await);
    }
    for i in 0..4 {
        let request = json!({"input": "x", "schema": {"type": "string", "minLength": 900_000}});
        submit(&server, &format!("large-{i}"), "extract_data", request).await;
    }
    // A client long-polling a slow task: its request stays open past the grace.
    let long_poll = {
        let http = server.http.clone();
        let url = format!("{}/v1/tasks?wait=60s", server.base);
        tokio::spawn(async move {
            let _ = http
                .post(url)
                .bearer_auth(KEY)
                .header("Idempotency-Key", "long-poll")
                .json(&json!({"kind": "classify", "scope": "s", "model": "slow",
                              "request": {"input": "x", "labels": ["a", "b"]}}))
                .send()
                .await;
        })
    };
    // Wait (bounded) until the endless ones run.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut running = 0;
    while running < cores {
        assert!(Instant::now() < deadline, "the endless tasks never ran");
        running = 0;
        for id in &endless {
            if status_of(&server, *id).await["status"] == "running" {
                running += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The long-poll's task runs (so its request is open, waiting).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let task: Value = server
            .http
            .get(format!("{}/v1/tasks?effect_key=long-poll", server.base))
            .bearer_auth(KEY)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if task["status"] == "running" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the long-poll's task never ran: {task}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The server still answers while they run.
    let health = server
        .http
        .get(format!("{}/healthz", server.base))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .unwrap();
    assert!(health.status().is_success());

    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let signaled = Instant::now();
    let exited = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            signaled.elapsed() < GRACE + SLACK,
            "serve did not stop within {:?} of SIGTERM (grace {GRACE:?})",
            GRACE + SLACK
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exited.success(), "{exited:?}");
    long_poll.abort();
    // The tasks it cut short are recorded, not left running: their attempts ended
    // interrupted, and with tries left (3 by default) they are back in the queue for
    // another replica (docs/routes.md, "Attempts").
    for id in &endless {
        let (task, attempts) = stored(&url, *id).await;
        assert_eq!(task.status, TaskStatus::Queued, "{task:?}");
        assert_eq!(task.worker, None);
        let last = attempts.last().expect("an attempt");
        assert_eq!(last.outcome, tollgate_core::AttemptOutcome::Interrupted);
        assert_eq!(
            last.error.as_ref().map(|e| e.code),
            Some(ErrorCode::Interrupted)
        );
    }
}

async fn an_api_only_replica_sweeps(backend: &str) {
    let Some((server, _)) = start(
        backend,
        "shutdown_api_only",
        r#"
[workers]
concurrency = 0

[sweeper]
interval = "200ms"
queue_timeout = "1s"
"#,
    ) else {
        return;
    };
    let id = submit(
        &server,
        "nobody-runs-this",
        "classify",
        json!({"input": "x", "labels": ["a", "b"]}),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let task = status_of(&server, id).await;
        if task["status"] == "failed" {
            assert_eq!(task["error"]["code"], "WORKFLOW_AI_QUEUE_TIMEOUT", "{task}");
            break;
        }
        assert_eq!(
            task["status"], "queued",
            "an API-only replica runs nothing: {task}"
        );
        assert!(
            Instant::now() < deadline,
            "the queued task never timed out: {task}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_busy_server_within_the_grace_sqlite() {
    sigterm_ends_a_busy_server_within_the_grace("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_a_busy_server_within_the_grace_postgres() {
    sigterm_ends_a_busy_server_within_the_grace("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_only_replica_sweeps_sqlite() {
    an_api_only_replica_sweeps("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_only_replica_sweeps_postgres() {
    an_api_only_replica_sweeps("postgres").await;
}
