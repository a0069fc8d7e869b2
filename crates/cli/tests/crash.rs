//! Crash tests (issue 8): the real `tollgate serve` binary under load, against a fake
//! OpenAI-compatible provider inside the test that records every call, killed with
//! SIGKILL at random moments and restarted; the same with the PostgreSQL server restarted
//! mid-load (a private cluster made with `initdb`), and with the NATS server gone
//! (a private `nats-server`, killed: replicas fall back to polling).
//!
//! Clients behave like careful users: a submission that gets no answer (the server is
//! down) is sent again with the same `Idempotency-Key` until it is answered. Afterwards:
//! - every submission ends answered, and every answered task exists and reaches a
//!   terminal state (nothing is lost; queued tasks are recovered after a restart);
//! - no task's request reached the provider twice, nor twice at once (at most once
//!   execution, whatever was killed when);
//! - a succeeded task holds exactly the answer of its one provider call;
//! - a failed task failed only because its worker died (`WORKFLOW_AI_INTERRUPTED`), a
//!   canceled one only because its client canceled it, and a deleted one stays gone;
//! - a terminal state seen once never changes after later crashes;
//! - a workflow run waiting on a task is woken once the task is terminal, even when the
//!   process died between saving the result and waking the run.
//!
//! Trials: `TOLLGATE_CRASH_TRIALS` (default 20 SIGKILLs on SQLite, 8 disruptions on a
//! private PostgreSQL cluster, 10 SIGKILLs of two replicas sharing PostgreSQL), or
//! `TOLLGATE_LONG_TESTS=1` for ten times as many.

use axum::Json;
use axum::extract::State;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

mod common;
use common::psql;
use tollgate_core::{AppId, RunId, TaskId};
use tollgate_store::Store;

const KEY: &str = "crash-key-0123456789abcdef";

fn trials(default: usize) -> usize {
    if let Some(n) = std::env::var("TOLLGATE_CRASH_TRIALS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return n;
    }
    if std::env::var("TOLLGATE_LONG_TESTS").is_ok_and(|v| v == "1") {
        default * 10
    } else {
        default
    }
}

/// A tiny deterministic mixer for delays and kill moments (no extra dependency).
fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

fn seed() -> u64 {
    std::env::var("TOLLGATE_CRASH_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

// ---------------------------------------------------------------------------------------
// The fake provider.

/// What the fake saw of one task's input.
#[derive(Debug, Default, Clone)]
struct Calls {
    total: usize,
    in_flight: usize,
    max_in_flight: usize,
    /// The label each call was (or would have been) answered with.
    labels: Vec<&'static str>,
}

#[derive(Default)]
struct FakeState {
    calls: Mutex<HashMap<String, Calls>>,
    seq: AtomicU64,
    seed: AtomicU64,
}

/// An OpenAI-compatible chat completions server on 127.0.0.1 that answers every classify
/// call with a random label after a random delay (20–400 ms), and records every call.
#[derive(Clone)]
struct FakeProvider {
    base_url: String,
    state: Arc<FakeState>,
}

impl FakeProvider {
    async fn start(seed: u64) -> FakeProvider {
        let state = Arc::new(FakeState::default());
        state.seed.store(seed, Ordering::SeqCst);
        let app = axum::Router::new()
            .route("/v1/chat/completions", axum::routing::post(chat))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider {
            base_url: format!("http://{addr}/v1"),
            state,
        }
    }

    fn calls(&self) -> HashMap<String, Calls> {
        self.state.calls.lock().unwrap().clone()
    }
}

/// Leaves the in-flight count when the call ends, answered or dropped by a killed client.
struct InFlight(Arc<FakeState>, String);

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(c) = self.0.calls.lock().unwrap().get_mut(&self.1) {
            c.in_flight -= 1;
        }
    }
}

async fn chat(State(state): State<Arc<FakeState>>, Json(body): Json<Value>) -> Json<Value> {
    let input = body["messages"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let n = state.seq.fetch_add(1, Ordering::SeqCst);
    let r = mix(state.seed.load(Ordering::SeqCst) ^ n);
    let label = if r.is_multiple_of(2) { "spam" } else { "ham" };
    let _guard = {
        let mut calls = state.calls.lock().unwrap();
        let c = calls.entry(input.clone()).or_default();
        c.total += 1;
        c.in_flight += 1;
        c.max_in_flight = c.max_in_flight.max(c.in_flight);
        c.labels.push(label);
        InFlight(state.clone(), input)
    };
    tokio::time::sleep(Duration::from_millis(20 + (r >> 8) % 380)).await;
    Json(json!({
        "id": "chatcmpl-crash",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant",
            "content": json!({"label": label}).to_string()}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    }))
}

// ---------------------------------------------------------------------------------------
// Processes.

fn tollgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tollgate"))
}

fn config_text(database_url: &str, provider: &str, notifications: &str) -> String {
    format!(
        r#"
[server]
max_wait = "10s"
shutdown_grace = "1s"

[database]
url = "{database_url}"

[models.default]
provider = "fake"
model = "fake-1"
# At most once: a task whose worker died fails instead of being tried again (what these
# tests prove); crates/cli/tests/attempts.rs proves the next attempt.
max_attempts = 1

[providers.fake]
kind = "openai"
base_url = "{provider}"
timeout = "10s"
max_retries = 0

[budgets.standard]
max_steps_per_source = 1000
sources_per_24_hours = 100000
scope_concurrent = 10000
burst = 10000
tasks_per_minute = 60000

[admission]
global_concurrent = 100000

[apps.acme]
api_keys = ["{KEY}"]

[workers]
concurrency = 4
heartbeat_interval = "100ms"

[sweeper]
interval = "200ms"
liveness_timeout = "1s"
queue_timeout = "1h"

[pipelines]
concurrency = 0

[notifications]
poll_interval = "200ms"
{notifications}
"#
    )
}

/// `tollgate serve` (or another role), killed on drop.
struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    /// SIGKILL: no shutdown code runs.
    fn sigkill(mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }
}

/// Starts `tollgate serve` and returns it with its base URL.
fn serve(config: &Path, extra: &[&str]) -> (Proc, String) {
    let mut child = tollgate()
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(config)
        .args(extra)
        .env("RUST_LOG", "warn")
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
        .expect("serve prints its address");
    (Proc { child }, base)
}

/// Starts `tollgate worker` (workers and sweeper, no HTTP).
fn worker(config: &Path) -> Proc {
    let child = tollgate()
        .args(["worker", "--config"])
        .arg(config)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the worker starts");
    Proc { child }
}

// ---------------------------------------------------------------------------------------
// Load.

/// A submission that was answered with a task.
#[derive(Debug, Clone)]
struct Accepted {
    id: String,
    input: String,
    run: Option<String>,
    /// The client deleted the task's owner data (its scope and source) afterwards.
    deleted: bool,
    /// The client asked to cancel the task right after submitting it.
    canceled: bool,
}

#[derive(Default)]
struct Load {
    base: RwLock<String>,
    stop: AtomicBool,
    next: AtomicUsize,
    accepted: Mutex<BTreeMap<usize, Accepted>>,
    /// Answers that were neither a task nor "try again" (must stay empty).
    unexpected: Mutex<Vec<String>>,
    /// Submissions answered only after at least one retry.
    resent: AtomicUsize,
    /// `?wait=` submissions answered with a terminal task.
    waited_terminal: AtomicUsize,
}

impl Load {
    fn base(&self) -> String {
        self.base.read().unwrap().clone()
    }
}

/// Sends one request until it is answered with something other than "unavailable"
/// (connection refused or reset, 5xx): the client's side of crash safety.
async fn until_answered(
    load: &Load,
    http: &reqwest::Client,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, String)],
    body: Option<&Value>,
) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut tries = 0;
    loop {
        let mut rb = http
            .request(method.clone(), format!("{}{path}", load.base()))
            .bearer_auth(KEY)
            .timeout(Duration::from_secs(15));
        for (k, v) in headers {
            rb = rb.header(*k, v);
        }
        if let Some(b) = body {
            rb = rb.json(b);
        }
        match rb.send().await {
            Ok(r) if !r.status().is_server_error() => {
                let status = r.status().as_u16();
                let text = r.text().await.unwrap_or_default();
                if tries > 0 {
                    load.resent.fetch_add(1, Ordering::SeqCst);
                }
                return (status, serde_json::from_str(&text).unwrap_or(Value::Null));
            }
            _ => {}
        }
        tries += 1;
        assert!(
            Instant::now() < deadline,
            "{method} {path} never answered within 90 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One client: submits tasks one after the other until told to stop. Every 5th is
/// unscoped, every 7th belongs to a workflow run that then waits on it.
async fn client(load: Arc<Load>, waits: Option<Arc<dyn Store>>) {
    let http = reqwest::Client::new();
    while !load.stop.load(Ordering::SeqCst) {
        let n = load.next.fetch_add(1, Ordering::SeqCst);
        let input = format!("task-{n}");
        let request = json!({"input": input, "labels": ["spam", "ham"]});
        let mut run = None;
        let mut scoped = None;
        let body = if n % 7 == 3 && waits.is_some() {
            let (st, r) = until_answered(
                &load,
                &http,
                reqwest::Method::POST,
                "/v1/runs",
                &[],
                Some(&json!({"scope": "wf"})),
            )
            .await;
            if st != 201 {
                load.unexpected
                    .lock()
                    .unwrap()
                    .push(format!("run: {st} {r}"));
                continue;
            }
            let rid = r["id"].as_str().unwrap().to_string();
            run = Some(rid.clone());
            json!({"kind": "classify", "run_id": rid, "request": request})
        } else if n.is_multiple_of(5) {
            json!({"kind": "classify", "scope": "plain", "request": request})
        } else {
            scoped = Some((format!("s{}", n % 3), format!("doc-{n}")));
            json!({"kind": "classify", "scope": format!("s{}", n % 3),
                   "source": {"id": format!("doc-{n}"), "revision": "v1"}, "request": request})
        };
        let path = if n % 4 == 1 {
            "/v1/tasks?wait=5s"
        } else {
            "/v1/tasks"
        };
        let (st, t) = until_answered(
            &load,
            &http,
            reqwest::Method::POST,
            path,
            &[("idempotency-key", format!("t-{n}"))],
            Some(&body),
        )
        .await;
        if !(st == 200 || st == 201) || t["id"].as_str().is_none() {
            load.unexpected
                .lock()
                .unwrap()
                .push(format!("t-{n}: {st} {t}"));
            continue;
        }
        let id = t["id"].as_str().unwrap().to_string();
        if path.contains("wait") && t["status"] == json!("succeeded") {
            load.waited_terminal.fetch_add(1, Ordering::SeqCst);
        }
        if let (Some(rid), Some(store)) = (&run, &waits) {
            // The run's workflow worker (this test, through the library) waits on it.
            let app = AppId::new("acme").unwrap();
            let (rid, tid) = (RunId::parse(rid).unwrap(), TaskId::parse(&id).unwrap());
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                match store.wait_on_task(&app, rid, tid).await {
                    Ok(_) => break,
                    Err(e) if e.is_retryable() && Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(100)).await
                    }
                    Err(e) => panic!("wait_on_task({rid}, {tid}): {e:?}"),
                }
            }
        }
        // Every 11th scoped task's owner data is deleted right away, often while the
        // task is queued or running.
        // Every 13th task is canceled right away, racing its worker (and the crashes).
        let mut canceled = false;
        if n % 13 == 9 {
            let (st, c) = until_answered(
                &load,
                &http,
                reqwest::Method::POST,
                &format!("/v1/tasks/{id}/cancel"),
                &[],
                Some(&json!({})),
            )
            .await;
            if st != 200 {
                load.unexpected
                    .lock()
                    .unwrap()
                    .push(format!("cancel {id}: {st} {c}"));
            }
            canceled = true;
        }
        let mut deleted = false;
        if let Some((scope, source)) = scoped.filter(|_| n % 11 == 6) {
            let (st, d) = until_answered(
                &load,
                &http,
                reqwest::Method::DELETE,
                &format!("/v1/scopes/{scope}/tasks?source={source}"),
                &[],
                None,
            )
            .await;
            if st != 200 {
                load.unexpected
                    .lock()
                    .unwrap()
                    .push(format!("delete {source}: {st} {d}"));
            }
            deleted = true;
        }
        load.accepted.lock().unwrap().insert(
            n,
            Accepted {
                id,
                input,
                run,
                deleted,
                canceled,
            },
        );
    }
}

// ---------------------------------------------------------------------------------------
// Checks.

async fn get(http: &reqwest::Client, base: &str, path: &str) -> Option<(u16, Value)> {
    let r = http
        .get(format!("{base}{path}"))
        .bearer_auth(KEY)
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or(Value::Null)))
}

/// Terminal tasks seen so far: (status, output, completed_at) must never change.
type Seen = BTreeMap<String, (Value, Value, Value)>;

/// Records the terminal tasks visible now; with `recheck`, also reads again those seen
/// before and panics if one changed (between trials only new ones are read, so a long
/// run stays linear; the final check reads them all).
async fn observe(base: &str, accepted: &[Accepted], seen: &mut Seen, recheck: bool) {
    let http = reqwest::Client::new();
    for a in accepted {
        if !recheck && seen.contains_key(&a.id) {
            continue;
        }
        let Some((200, t)) = get(&http, base, &format!("/v1/tasks/{}", a.id)).await else {
            continue;
        };
        if !matches!(
            t["status"].as_str(),
            Some("succeeded" | "failed" | "canceled")
        ) {
            continue;
        }
        let now = (
            t["status"].clone(),
            t["output"].clone(),
            t["completed_at"].clone(),
        );
        if let Some(before) = seen.get(&a.id) {
            assert_eq!(before, &now, "task {} changed after it was terminal", a.id);
        } else {
            seen.insert(a.id.clone(), now);
        }
    }
}

/// Waits for every accepted task to be terminal and every waiting run to be woken, then
/// checks what the fake provider saw. Returns (succeeded, interrupted).
async fn settle_and_check(
    base: &str,
    load: &Load,
    fake: &FakeProvider,
    seen: &mut Seen,
) -> (usize, usize) {
    let http = reqwest::Client::new();
    let unexpected = load.unexpected.lock().unwrap().clone();
    assert!(unexpected.is_empty(), "unexpected answers: {unexpected:?}");
    let accepted: Vec<Accepted> = load.accepted.lock().unwrap().values().cloned().collect();
    assert!(!accepted.is_empty(), "the load submitted nothing");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut tasks = BTreeMap::new();
    let mut deleted = 0;
    for a in &accepted {
        if a.deleted {
            let (st, t) = get(&http, base, &format!("/v1/tasks/{}", a.id))
                .await
                .expect("the server answers");
            assert_eq!(st, 404, "task {} was deleted with its owner: {t}", a.id);
            deleted += 1;
            continue;
        }
        loop {
            let (st, t) = get(&http, base, &format!("/v1/tasks/{}", a.id))
                .await
                .expect("the server answers");
            assert_eq!(st, 200, "accepted task {} is lost: {t}", a.id);
            if matches!(
                t["status"].as_str(),
                Some("succeeded" | "failed" | "canceled")
            ) {
                tasks.insert(a.id.clone(), t);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "task {} never became terminal: {t}",
                a.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    observe(base, &accepted, seen, true).await;

    let calls = fake.calls();
    let mut succeeded = 0;
    let mut interrupted = 0;
    let mut canceled = 0;
    for a in &accepted {
        let c = calls.get(&a.input).cloned().unwrap_or_default();
        assert!(
            c.total <= 1 && c.max_in_flight <= 1,
            "deleted task {} ran twice",
            a.id
        );
        let Some(t) = tasks.get(&a.id) else {
            continue; // deleted with its owner
        };
        assert!(
            c.total <= 1,
            "task {} ({}) reached the provider {} times",
            a.id,
            a.input,
            c.total
        );
        assert!(c.max_in_flight <= 1, "task {} ran concurrently", a.id);
        match t["status"].as_str().unwrap() {
            "succeeded" => {
                succeeded += 1;
                assert_eq!(c.total, 1, "a succeeded task was executed: {t}");
                assert_eq!(
                    t["output"]["label"],
                    json!(c.labels[0]),
                    "the stored output is its one call's answer: {t}"
                );
            }
            "failed" => {
                interrupted += 1;
                assert_eq!(
                    t["error"]["code"],
                    json!("WORKFLOW_AI_INTERRUPTED"),
                    "only a dead worker fails a task here: {t}"
                );
            }
            "canceled" => {
                assert!(a.canceled, "nobody canceled task {}: {t}", a.id);
                assert_eq!(t["error"]["code"], json!("WORKFLOW_AI_CANCELED"), "{t}");
                canceled += 1;
            }
            other => panic!("task {} ended {other}: {t}", a.id),
        }
    }
    // Waiting runs are woken (the sweeper repairs a wake lost to a crash).
    for a in accepted.iter().filter(|a| a.run.is_some()) {
        let rid = a.run.as_ref().unwrap();
        loop {
            let (st, r) = get(&http, base, &format!("/v1/runs/{rid}"))
                .await
                .expect("the server answers");
            assert_eq!(st, 200, "{r}");
            if r["state"] != json!("waiting") {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "run {rid} still waits on terminal task {}: {r}",
                a.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    eprintln!(
        "{} tasks accepted: {succeeded} succeeded, {interrupted} interrupted by a crash, \
         {canceled} canceled, {deleted} deleted with their owner, {} answered only after a retry, {} runs woken",
        accepted.len(),
        load.resent.load(Ordering::SeqCst),
        accepted.iter().filter(|a| a.run.is_some()).count()
    );
    (succeeded, interrupted)
}

fn start_load(
    load: &Arc<Load>,
    clients: usize,
    waits: Option<Arc<dyn Store>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..clients)
        .map(|_| tokio::spawn(client(load.clone(), waits.clone())))
        .collect()
}

async fn stop_load(load: &Load, clients: Vec<tokio::task::JoinHandle<()>>) {
    load.stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.expect("a client panicked");
    }
}

fn accepted(load: &Load) -> Vec<Accepted> {
    load.accepted.lock().unwrap().values().cloned().collect()
}

// ---------------------------------------------------------------------------------------
// The tests.

/// SIGKILL at random moments under load, on embedded SQLite.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_under_load_loses_nothing_and_runs_nothing_twice() {
    let seed = seed();
    let trials = trials(20);
    eprintln!("sigkill: {trials} trials, TOLLGATE_CRASH_SEED={seed}");
    let fake = FakeProvider::start(seed).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tollgate.db");
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        config_text(&format!("sqlite://{}", db.display()), &fake.base_url, ""),
    )
    .unwrap();
    let (mut server, base) = serve(&config, &[]);
    let store: Arc<dyn Store> = Arc::new(
        tollgate_store::sqlite::SqliteStore::open(tollgate_store::sqlite::SqliteOptions::new(&db))
            .await
            .expect("the test's own store on the same file"),
    );
    let load = Arc::new(Load::default());
    *load.base.write().unwrap() = base;
    let clients = start_load(&load, 6, Some(store));
    let mut seen = Seen::new();
    for trial in 0..trials {
        let r = mix(seed ^ (trial as u64 + 1));
        tokio::time::sleep(Duration::from_millis(100 + r % 900)).await;
        server.sigkill();
        // Sometimes the replica stays down a while (clients keep retrying).
        tokio::time::sleep(Duration::from_millis((r >> 16) % 300)).await;
        let (s, b) = serve(&config, &[]);
        server = s;
        *load.base.write().unwrap() = b.clone();
        observe(&b, &accepted(&load), &mut seen, false).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_load(&load, clients).await;
    let base = load.base();
    let (succeeded, _) = settle_and_check(&base, &load, &fake, &mut seen).await;
    assert!(succeeded > 0);
    drop(server);
}

/// A fresh schema in the shared test database, dropped at the end.
struct SharedSchema {
    url: String,
    name: String,
}

impl SharedSchema {
    fn new(url: &str) -> SharedSchema {
        let name = format!("crash_{}", uuid::Uuid::new_v4().simple());
        psql(url, &format!("CREATE SCHEMA \"{name}\""));
        SharedSchema {
            url: url.to_string(),
            name,
        }
    }

    /// The database URL with this schema first on the search path.
    fn database_url(&self) -> String {
        let sep = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{sep}options=-c%20search_path%3D{}", self.url, self.name)
    }
}

impl Drop for SharedSchema {
    fn drop(&mut self) {
        psql(
            &self.url,
            &format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name),
        );
    }
}

/// Two `serve` replicas on one PostgreSQL database (PostgreSQL `LISTEN/NOTIFY` between
/// them), SIGKILLed in turn while the other keeps serving: the survivor's sweeper ends
/// what the dead one held, its workers take the queue, and no task runs on both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_killed_in_turn_share_the_work_once() {
    if !require_postgres("two_replicas_killed_in_turn_share_the_work_once") {
        return;
    }
    let url = std::env::var("TOLLGATE_TEST_DATABASE_URL").unwrap();
    let schema = SharedSchema::new(&url);
    let seed = seed();
    let trials = trials(10);
    eprintln!("two replicas: {trials} SIGKILLs, TOLLGATE_CRASH_SEED={seed}");
    let fake = FakeProvider::start(seed).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        config_text(
            &schema.database_url(),
            &fake.base_url,
            "transport = \"postgres\"",
        ),
    )
    .unwrap();
    let mut replicas = vec![serve(&config, &[]), serve(&config, &[])];
    let mut options = tollgate_store::postgres::PostgresOptions::new(url.clone())
        .with_schema(schema.name.clone());
    options.max_connections = 2;
    let store: Arc<dyn Store> = Arc::new(
        tollgate_store::postgres::PostgresStore::open(options)
            .await
            .expect("the test's own store on the schema"),
    );
    let load = Arc::new(Load::default());
    *load.base.write().unwrap() = replicas[0].1.clone();
    let clients = start_load(&load, 6, Some(store));
    let mut seen = Seen::new();
    for trial in 0..trials {
        let r = mix(seed ^ (trial as u64 + 1));
        tokio::time::sleep(Duration::from_millis(200 + r % 900)).await;
        let victim = (r >> 20) as usize % 2;
        // Clients move to the survivor first, as a load balancer would.
        *load.base.write().unwrap() = replicas[1 - victim].1.clone();
        let (dead, _) = replicas.remove(victim);
        dead.sigkill();
        tokio::time::sleep(Duration::from_millis((r >> 16) % 500)).await;
        replicas.insert(victim, serve(&config, &[]));
        observe(&load.base(), &accepted(&load), &mut seen, false).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_load(&load, clients).await;
    let base = load.base();
    let (succeeded, _) = settle_and_check(&base, &load, &fake, &mut seen).await;
    assert!(succeeded > 0);
    drop(replicas);
}

/// A throwaway PostgreSQL server owned by the `postgres` user in a temporary folder.
struct PrivateCluster {
    dir: PathBuf,
    port: u16,
    bin: PathBuf,
}

impl PrivateCluster {
    fn start() -> Option<PrivateCluster> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()?
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("bin"))
            .find(|p| p.join("initdb").exists())?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let dir = std::env::temp_dir().join(format!(
            "tollgate-crash-pg-{}",
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&dir).ok()?;
        Command::new("chown")
            .args(["postgres:postgres", dir.to_str()?])
            .status()
            .ok()?;
        let data = dir.join("data");
        let ok = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(bin.join("initdb"))
            .args(["-D", data.to_str()?, "-A", "trust", "-U", "postgres"])
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false);
        if !ok {
            let _ = std::fs::remove_dir_all(&dir);
            return None;
        }
        let cluster = PrivateCluster { dir, port, bin };
        cluster.pg_ctl("start").then_some(cluster)
    }

    fn pg_ctl(&self, action: &str) -> bool {
        let data = self.dir.join("data");
        let log = self.dir.join("log");
        let mut cmd = Command::new("runuser");
        cmd.args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "30"]);
        if action == "stop" {
            cmd.args(["-m", "immediate"]);
        } else {
            cmd.arg("-o").arg(format!(
                "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
                self.port,
                self.dir.display()
            ));
        }
        cmd.arg(action)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = self.pg_ctl("stop");
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn require_postgres(what: &str) -> bool {
    if std::env::var("TOLLGATE_TEST_DATABASE_URL").is_err() {
        if std::env::var("TOLLGATE_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
            panic!("TOLLGATE_REQUIRE_POSTGRES=1 but TOLLGATE_TEST_DATABASE_URL is not set");
        }
        eprintln!("skipping {what}: TOLLGATE_TEST_DATABASE_URL is not set");
        return false;
    }
    true
}

/// PostgreSQL restarted (immediate stop: every connection cut) mid-load, alternating
/// with SIGKILLs of the service, on a private cluster.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarts_and_sigkills_lose_nothing() {
    if !require_postgres("postgres_restarts_and_sigkills_lose_nothing") {
        return;
    }
    let Some(cluster) = PrivateCluster::start() else {
        if std::env::var("TOLLGATE_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
            panic!("cannot make a private PostgreSQL cluster (initdb/pg_ctl as user postgres)");
        }
        eprintln!("skipping: cannot make a private PostgreSQL cluster");
        return;
    };
    let seed = seed();
    let trials = trials(8);
    eprintln!("postgres: {trials} disruptions, TOLLGATE_CRASH_SEED={seed}");
    let fake = FakeProvider::start(seed).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(&config, config_text(&cluster.url(), &fake.base_url, "")).unwrap();
    let (mut server, base) = serve(&config, &[]);
    let mut options = tollgate_store::postgres::PostgresOptions::new(cluster.url());
    options.max_connections = 2;
    options.acquire_timeout = Duration::from_secs(2);
    let store: Arc<dyn Store> = Arc::new(
        tollgate_store::postgres::PostgresStore::open(options)
            .await
            .expect("the test's own store on the cluster"),
    );
    let load = Arc::new(Load::default());
    *load.base.write().unwrap() = base;
    let clients = start_load(&load, 6, Some(store));
    let mut seen = Seen::new();
    for trial in 0..trials {
        let r = mix(seed ^ (trial as u64 + 1));
        tokio::time::sleep(Duration::from_millis(300 + r % 900)).await;
        if trial % 2 == 0 {
            assert!(cluster.pg_ctl("stop"), "pg_ctl stop");
            tokio::time::sleep(Duration::from_millis(200 + (r >> 16) % 800)).await;
            assert!(cluster.pg_ctl("start"), "pg_ctl start");
        } else {
            server.sigkill();
            let (s, b) = serve(&config, &[]);
            server = s;
            *load.base.write().unwrap() = b;
        }
        observe(&load.base(), &accepted(&load), &mut seen, false).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop_load(&load, clients).await;
    let base = load.base();
    let (succeeded, _) = settle_and_check(&base, &load, &fake, &mut seen).await;
    assert!(succeeded > 0);
    drop(server);
}

/// NATS gone mid-load: an API-only replica and a worker replica that only hear of each
/// other through NATS keep working by polling, and waiting clients still get answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stopped_mid_load_falls_back_to_polling() {
    let nats_bin = Path::new("/usr/sbin/nats-server");
    if !nats_bin.exists() {
        if std::env::var("TOLLGATE_REQUIRE_NATS").is_ok_and(|v| v == "1") {
            panic!("TOLLGATE_REQUIRE_NATS=1 but /usr/sbin/nats-server is missing");
        }
        eprintln!("skipping: no nats-server");
        return;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nats = Proc {
        child: Command::new(nats_bin)
            .args(["-a", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts"),
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < deadline,
            "the private nats-server never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let seed = seed();
    let fake = FakeProvider::start(seed).await;
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tollgate.db");
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        config_text(
            &format!("sqlite://{}", db.display()),
            &fake.base_url,
            &format!("transport = \"nats\"\nnats_url = \"nats://127.0.0.1:{port}\""),
        ),
    )
    .unwrap();
    let (api, base) = serve(&config, &["--workers", "0"]);
    let workers = worker(&config);
    let load = Arc::new(Load::default());
    *load.base.write().unwrap() = base.clone();
    let clients = start_load(&load, 4, None);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = accepted(&load).len();
    let waited_before = load.waited_terminal.load(Ordering::SeqCst);
    nats.sigkill();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    stop_load(&load, clients).await;
    let after = accepted(&load).len();
    let waited_after = load.waited_terminal.load(Ordering::SeqCst);
    assert!(
        after > before,
        "submissions go on without NATS ({before} before, {after} after)"
    );
    assert!(
        waited_after > waited_before,
        "?wait= on the API replica still answers once the worker replica finished"
    );
    let mut seen = Seen::new();
    let (succeeded, interrupted) = settle_and_check(&base, &load, &fake, &mut seen).await;
    assert_eq!(interrupted, 0, "nothing crashed here");
    let all = accepted(&load);
    let deleted = all.iter().filter(|a| a.deleted).count();
    let canceled = all.iter().filter(|a| a.canceled && !a.deleted).count();
    assert!(
        succeeded + deleted <= after && succeeded + deleted + canceled >= after,
        "every task ran (or was deleted or canceled), by polling after NATS died"
    );
    drop(workers);
    drop(api);
}
