//! Webhooks end to end (docs/webhooks.md): the real `tollgate serve` binary, a receiver
//! inside the test on 127.0.0.1 (allowed explicitly by `[webhooks] allowed_networks`),
//! on SQLite and (with `TOLLGATE_TEST_DATABASE_URL`) on PostgreSQL:
//! - every event is delivered once when the receiver is healthy, signed per Standard
//!   Webhooks (checked here by an implementation of HMAC-SHA256 written in this file);
//! - deliveries are retried through 500s, timeouts and a receiver that is down a while;
//! - nothing is lost when the delivering replica is killed with SIGKILL;
//! - an internal address is refused by default (at creation, and after DNS resolution);
//! - one app's dead endpoint does not delay another app's deliveries;
//! - a budget threshold reached sends one `budget.threshold` delivery.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;

const ACME: &str = "acme-key-0123456789abcdef";
const BETA: &str = "beta-key-0123456789abcdef";
const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

// ---------------------------------------------------------------------------------------
// An independent check of the signature: HMAC-SHA256 written out (RFC 2104).

fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let inner: Vec<u8> = block.iter().map(|b| b ^ 0x36).collect();
    let outer: Vec<u8> = block.iter().map(|b| b ^ 0x5c).collect();
    let mut h = Sha256::new();
    h.update(&inner);
    h.update(message);
    let inner_hash = h.finalize();
    let mut h = Sha256::new();
    h.update(&outer);
    h.update(inner_hash);
    h.finalize().to_vec()
}

/// `webhook-signature` holds `v1,<base64(HMAC(secret, id.timestamp.body))>`.
fn signature_valid(secret: &str, id: &str, timestamp: &str, body: &[u8], header: &str) -> bool {
    let key = BASE64
        .decode(secret.strip_prefix("whsec_").unwrap())
        .unwrap();
    let mut message = format!("{id}.{timestamp}.").into_bytes();
    message.extend_from_slice(body);
    let expected = format!("v1,{}", BASE64.encode(hmac_sha256(&key, &message)));
    header.split(' ').any(|s| s == expected)
}

#[test]
fn the_independent_hmac_matches_the_standard_example() {
    assert!(signature_valid(
        SECRET,
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        "1614265330",
        br#"{"test": 2432232314}"#,
        "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    ));
}

// ---------------------------------------------------------------------------------------
// The receiver.

/// How the receiver answers an attempt.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    Ok,
    Error500,
    /// Holds the request past the server's timeout.
    Hang,
}

#[derive(Debug, Clone)]
struct Received {
    id: String,
    body: Value,
    answer: Answer,
    at: Instant,
}

#[derive(Default)]
struct ReceiverState {
    got: Mutex<Vec<Received>>,
    /// Answers per attempt number of an id (1-based); later attempts get `Ok`.
    script: Mutex<Vec<Answer>>,
    /// Every attempt is answered this way when set.
    always: Mutex<Option<Answer>>,
    hold: Mutex<Duration>,
    bad_signatures: Mutex<Vec<String>>,
}

#[derive(Clone)]
struct Receiver {
    state: Arc<ReceiverState>,
    port: u16,
    server: Arc<Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

async fn hook(State(st): State<Arc<ReceiverState>>, headers: HeaderMap, body: Bytes) -> StatusCode {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let id = h("webhook-id");
    if !signature_valid(
        SECRET,
        &id,
        &h("webhook-timestamp"),
        &body,
        &h("webhook-signature"),
    ) {
        st.bad_signatures.lock().unwrap().push(id.clone());
    }
    let answer = {
        let mut got = st.got.lock().unwrap();
        let attempt = got.iter().filter(|r| r.id == id).count();
        let answer = st.always.lock().unwrap().unwrap_or_else(|| {
            st.script
                .lock()
                .unwrap()
                .get(attempt)
                .copied()
                .unwrap_or(Answer::Ok)
        });
        got.push(Received {
            id,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            answer,
            at: Instant::now(),
        });
        answer
    };
    match answer {
        Answer::Ok => StatusCode::NO_CONTENT,
        Answer::Error500 => StatusCode::INTERNAL_SERVER_ERROR,
        Answer::Hang => {
            let hold = *st.hold.lock().unwrap();
            tokio::time::sleep(hold).await;
            StatusCode::OK
        }
    }
}

impl Receiver {
    async fn start() -> Receiver {
        let r = Receiver {
            state: Arc::new(ReceiverState {
                hold: Mutex::new(Duration::from_secs(5)),
                ..ReceiverState::default()
            }),
            port: 0,
            server: Arc::new(Mutex::new(None)),
        };
        r.listen(0).await
    }

    async fn listen(mut self, port: u16) -> Receiver {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        self.port = listener.local_addr().unwrap().port();
        let app = axum::Router::new()
            .route("/hook", axum::routing::post(hook))
            .with_state(self.state.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        *self.server.lock().unwrap() = Some(task);
        self
    }

    /// Stops listening (connections are refused) until [`up`](Self::up).
    async fn down(&self) {
        if let Some(t) = self.server.lock().unwrap().take() {
            t.abort();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    async fn up(&self) {
        self.clone().listen(self.port).await;
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn got(&self) -> Vec<Received> {
        self.state.got.lock().unwrap().clone()
    }

    /// Ids answered 2xx.
    fn accepted(&self) -> BTreeMap<String, usize> {
        let mut m = BTreeMap::new();
        for r in self.got().iter().filter(|r| r.answer == Answer::Ok) {
            *m.entry(r.id.clone()).or_default() += 1;
        }
        m
    }

    async fn wait_accepted(&self, n: usize, within: Duration) -> BTreeMap<String, usize> {
        let end = Instant::now() + within;
        loop {
            let a = self.accepted();
            if a.len() >= n || Instant::now() > end {
                return a;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn assert_signed(&self) {
        let bad = self.state.bad_signatures.lock().unwrap().clone();
        assert!(bad.is_empty(), "bad signatures: {bad:?}");
    }
}

// ---------------------------------------------------------------------------------------
// The server.

fn config_text(db: &str, webhooks: &str) -> String {
    format!(
        r#"
[database]
url = "{db}"

[models.default]
provider = "dev"
model = "dev-1"

[models.slow]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 30000 }}

[apps.acme]
api_keys = ["{ACME}"]

[apps.beta]
api_keys = ["{BETA}"]

[workers]
concurrency = 4
heartbeat_interval = "200ms"

[sweeper]
interval = "500ms"

[webhooks]
poll_interval = "100ms"
{webhooks}
"#
    )
}

/// The webhooks section of a test that reaches the receiver.
fn local(timeout: &str, lease: &str) -> String {
    format!(
        r#"allow_http = true
allowed_networks = ["127.0.0.1/32"]
timeout = "{timeout}"
lease = "{lease}"
concurrency = 8
per_app_concurrency = 2
retry = {{ initial = "200ms", max_interval = "1s", give_up_after = "5m", jitter = 0.2 }}
"#
    )
}

/// `tollgate serve` with the configuration file `config` (in `dir`).
fn spawn(config: &Path, dir: &Path) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(config)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
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
        .expect("the server prints its address");
    (child, base)
}

struct Api {
    http: reqwest::Client,
    base: String,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let res = req.send().await.expect("the server answers");
        let status = StatusCode::from_u16(res.status().as_u16()).unwrap();
        let text = res.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn add_webhook(&self, key: &str, url: &str) -> Value {
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                "/v1/webhooks",
                key,
                Some(json!({
                    "url": url,
                    "events": ["task.succeeded", "task.failed", "task.canceled", "run.finished"],
                    "secret": SECRET,
                })),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        body
    }

    /// A classify task waited for; returns its id.
    async fn finished_task(&self, key: &str, effect: &str) -> String {
        let res = self
            .http
            .post(format!("{}/v1/tasks?wait=20s", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", effect)
            .json(&json!({"kind": "classify", "scope": "s",
                "request": {"input": format!("Win a free cruise {effect}"), "labels": ["spam", "ham"]}}))
            .send()
            .await
            .unwrap();
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["status"], json!("succeeded"), "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    /// A slow task, canceled; returns its id.
    async fn canceled_task(&self, key: &str, effect: &str) -> String {
        let res = self
            .http
            .post(format!("{}/v1/tasks", self.base))
            .bearer_auth(key)
            .header("Idempotency-Key", effect)
            .json(&json!({"kind": "classify", "scope": "s", "model": "slow",
                "request": {"input": "slow", "labels": ["spam", "ham"]}}))
            .send()
            .await
            .unwrap();
        let body: Value = res.json().await.unwrap();
        let id = body["id"].as_str().unwrap().to_string();
        let (status, body) = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/tasks/{id}/cancel"),
                key,
                Some(json!({})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        id
    }

    /// A run, canceled; returns its id.
    async fn canceled_run(&self, key: &str) -> String {
        let (status, run) = self
            .call(
                reqwest::Method::POST,
                "/v1/runs",
                key,
                Some(json!({"scope": "s"})),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{run}");
        let id = run["id"].as_str().unwrap().to_string();
        let (status, _) = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/runs/{id}/cancel"),
                key,
                Some(json!({})),
            )
            .await;
        assert_eq!(status, StatusCode::OK);
        id
    }

    async fn deliveries(&self, key: &str, endpoint: &str) -> Vec<Value> {
        let (status, body) = self
            .call(
                reqwest::Method::GET,
                &format!("/v1/webhooks/{endpoint}/deliveries?limit=500"),
                key,
                None,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        body["deliveries"].as_array().unwrap().clone()
    }
}

/// One test's server: a fresh database, a config file, a running `serve` (restartable).
struct Instance {
    dir: tempfile::TempDir,
    schema: Option<(String, String)>,
    child: Option<Child>,
    api: Api,
}

impl Instance {
    fn start(backend: &str, webhooks: &str) -> Option<Instance> {
        Instance::start_with(backend, |db| config_text(db, webhooks))
    }

    /// An instance whose configuration file `config` writes for the database `db`.
    fn start_with(backend: &str, config: impl FnOnce(&str) -> String) -> Option<Instance> {
        let dir = tempfile::tempdir().unwrap();
        let (db, schema) = common::database(backend, dir.path(), "hooks")?;
        let text = config(&db);
        let config = dir.path().join("tollgate.toml");
        std::fs::write(&config, text).unwrap();
        let (child, base) = spawn(&config, dir.path());
        Some(Instance {
            api: Api {
                http: reqwest::Client::new(),
                base,
            },
            child: Some(child),
            dir,
            schema,
        })
    }

    /// SIGKILL, then a new process on the same database.
    fn kill_and_restart(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        let (child, base) = spawn(&self.dir.path().join("tollgate.toml"), self.dir.path());
        self.child = Some(child);
        self.api.base = base;
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some((url, schema)) = &self.schema {
            common::psql(url, &format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The tests.

async fn delivered_once_when_healthy(backend: &str) {
    let receiver = Receiver::start().await;
    let Some(inst) = Instance::start(backend, &local("2s", "10s")) else {
        return;
    };
    let api = &inst.api;
    let endpoint = api.add_webhook(ACME, &receiver.url()).await;
    assert_eq!(endpoint["secret"], json!(SECRET));
    let mut expected: BTreeMap<String, &str> = BTreeMap::new();
    for i in 0..6 {
        let id = api.finished_task(ACME, &format!("ok-{i}")).await;
        expected.insert(format!("evt_{id}"), "task.succeeded");
    }
    for i in 0..2 {
        let id = api.canceled_task(ACME, &format!("cancel-{i}")).await;
        expected.insert(format!("evt_{id}"), "task.canceled");
    }
    let run = api.canceled_run(ACME).await;
    expected.insert(format!("evt_{run}"), "run.finished");
    // Another app's tasks go nowhere near acme's endpoint.
    api.finished_task(BETA, "beta-1").await;

    let accepted = receiver
        .wait_accepted(expected.len(), Duration::from_secs(30))
        .await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let got = receiver.got();
    assert_eq!(
        accepted.keys().cloned().collect::<BTreeSet<_>>(),
        expected.keys().cloned().collect::<BTreeSet<_>>(),
        "every event, and only acme's"
    );
    assert_eq!(
        got.len(),
        expected.len(),
        "each delivered exactly once: {:?}",
        got.iter().map(|r| &r.id).collect::<Vec<_>>()
    );
    receiver.assert_signed();
    for r in &got {
        assert_eq!(r.body["type"], json!(expected[&r.id]), "{}", r.body);
        assert_eq!(r.body["id"], json!(r.id));
    }
    let deliveries = api.deliveries(ACME, endpoint["id"].as_str().unwrap()).await;
    assert_eq!(deliveries.len(), expected.len());
    assert!(
        deliveries
            .iter()
            .all(|d| d["state"] == json!("delivered") && d["attempts"] == json!(1))
    );
    assert!(deliveries.iter().all(|d| d["response_code"] == json!(204)));

    // A replay sends the same event again, with the same webhook-id.
    let first = deliveries[0]["id"].as_str().unwrap();
    let event = deliveries[0]["event_id"].as_str().unwrap().to_string();
    let (status, replay) = api
        .call(
            reqwest::Method::POST,
            &format!(
                "/v1/webhooks/{}/deliveries/{first}/replay",
                endpoint["id"].as_str().unwrap()
            ),
            ACME,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{replay}");
    let end = Instant::now() + Duration::from_secs(10);
    while receiver.accepted().get(&event) != Some(&2) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        receiver.accepted().get(&event),
        Some(&2),
        "the replay arrived"
    );
    // Another app cannot see the endpoint or replay its deliveries.
    let (status, body) = api
        .call(
            reqwest::Method::GET,
            &format!(
                "/v1/webhooks/{}/deliveries",
                endpoint["id"].as_str().unwrap()
            ),
            BETA,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["error"]["code"], json!("not_found"), "{body}");
}

async fn retried_through_errors_timeouts_and_downtime(backend: &str) {
    let receiver = Receiver::start().await;
    *receiver.state.script.lock().unwrap() = vec![Answer::Error500, Answer::Error500, Answer::Hang];
    *receiver.state.hold.lock().unwrap() = Duration::from_secs(3);
    let Some(inst) = Instance::start(backend, &local("1s", "5s")) else {
        return;
    };
    let api = &inst.api;
    let endpoint = api.add_webhook(ACME, &receiver.url()).await;
    let mut expected = BTreeSet::new();
    for i in 0..4 {
        expected.insert(format!(
            "evt_{}",
            api.finished_task(ACME, &format!("a-{i}")).await
        ));
    }
    // Down for a while: attempts meanwhile find no one listening.
    receiver.down().await;
    for i in 0..4 {
        expected.insert(format!(
            "evt_{}",
            api.finished_task(ACME, &format!("b-{i}")).await
        ));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    receiver.up().await;
    let accepted = receiver
        .wait_accepted(expected.len(), Duration::from_secs(60))
        .await;
    assert_eq!(
        accepted.keys().cloned().collect::<BTreeSet<_>>(),
        expected,
        "every event arrived in the end"
    );
    receiver.assert_signed();
    let got = receiver.got();
    for id in &expected {
        let answers: Vec<Answer> = got
            .iter()
            .filter(|r| &r.id == id)
            .map(|r| r.answer)
            .collect();
        assert_eq!(
            &answers[..3],
            &[Answer::Error500, Answer::Error500, Answer::Hang],
            "{id} went through two 500s and a timeout first"
        );
    }
    // The receiver may have answered an attempt the server had already given up on (a
    // timeout under load): that delivery is sent again, so wait for the records.
    let end = Instant::now() + Duration::from_secs(30);
    let deliveries = loop {
        let ds = api.deliveries(ACME, endpoint["id"].as_str().unwrap()).await;
        if ds.iter().all(|d| d["state"] == json!("delivered")) || Instant::now() > end {
            break ds;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(
        deliveries.iter().all(|d| d["state"] == json!("delivered")),
        "{deliveries:?}"
    );
    assert!(
        deliveries
            .iter()
            .all(|d| d["attempts"].as_u64().unwrap() >= 4),
        "{deliveries:?}"
    );
}

async fn nothing_lost_across_kill_9(backend: &str) {
    let receiver = Receiver::start().await;
    // Slow answers, so attempts are in flight when the replica dies.
    *receiver.state.always.lock().unwrap() = Some(Answer::Hang);
    *receiver.state.hold.lock().unwrap() = Duration::from_millis(400);
    let Some(mut inst) = Instance::start(backend, &local("3s", "4s")) else {
        return;
    };
    inst.api.add_webhook(ACME, &receiver.url()).await;
    let mut expected = BTreeSet::new();
    for i in 0..12 {
        expected.insert(format!(
            "evt_{}",
            inst.api.finished_task(ACME, &format!("k-{i}")).await
        ));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    inst.kill_and_restart();
    let end = Instant::now() + Duration::from_secs(60);
    let seen = loop {
        let seen: BTreeSet<String> = receiver.got().iter().map(|r| r.id.clone()).collect();
        if seen.is_superset(&expected) || Instant::now() > end {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        seen.is_superset(&expected),
        "lost: {:?}",
        expected.difference(&seen).collect::<Vec<_>>()
    );
    // Every delivery ends delivered on the new replica (a delivery cut off mid-attempt is
    // sent again once its lease runs out).
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, list) = inst
            .api
            .call(reqwest::Method::GET, "/v1/webhooks", ACME, None)
            .await;
        let id = list["webhooks"][0]["id"].as_str().unwrap().to_string();
        let ds = inst.api.deliveries(ACME, &id).await;
        if ds.len() == expected.len() && ds.iter().all(|d| d["state"] == json!("delivered")) {
            break;
        }
        assert!(Instant::now() < end, "not all delivered: {ds:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    receiver.assert_signed();
}

async fn internal_addresses_refused_by_default(backend: &str) {
    let receiver = Receiver::start().await;
    let Some(inst) = Instance::start(backend, "") else {
        return;
    };
    let api = &inst.api;
    for url in [
        "https://127.0.0.1/hook".to_string(),
        "https://10.1.2.3/hook".to_string(),
        "https://169.254.169.254/latest".to_string(),
        "https://[::1]/hook".to_string(),
        receiver.url(),
        "ftp://hooks.example.com/".to_string(),
    ] {
        let (status, body) = api
            .call(
                reqwest::Method::POST,
                "/v1/webhooks",
                ACME,
                Some(json!({"url": url, "events": ["task.succeeded"]})),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("url"),
            "{body}"
        );
    }
    let (status, list) = api
        .call(reqwest::Method::GET, "/v1/webhooks", ACME, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(list["webhooks"], json!([]), "nothing was created");
    // A name that resolves to an internal address passes creation and is refused when
    // it resolves: the receiver never hears of it.
    let endpoint = api
        .call(
            reqwest::Method::POST,
            "/v1/webhooks",
            ACME,
            Some(
                json!({"url": format!("https://localhost:{}/hook", receiver.port),
                        "events": ["task.succeeded"]}),
            ),
        )
        .await
        .1;
    let secret = endpoint["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "a secret is made: {endpoint}");
    api.finished_task(ACME, "internal").await;
    let id = endpoint["id"].as_str().unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    let d = loop {
        let ds = api.deliveries(ACME, id).await;
        if let Some(d) = ds.first().filter(|d| d["attempts"].as_u64() >= Some(1)) {
            break d.clone();
        }
        assert!(Instant::now() < end, "no attempt: {ds:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        d["state"],
        json!("pending"),
        "failed attempts are retried: {d}"
    );
    let error = d["last_error"].as_str().unwrap();
    assert!(error.contains("may not reach"), "{error}");
    assert!(receiver.got().is_empty(), "nothing reached 127.0.0.1");
}

async fn dead_endpoint_does_not_delay_another_app(backend: &str) {
    let dead = Receiver::start().await;
    *dead.state.always.lock().unwrap() = Some(Answer::Hang);
    *dead.state.hold.lock().unwrap() = Duration::from_secs(30);
    let healthy = Receiver::start().await;
    let Some(inst) = Instance::start(backend, &local("3s", "10s")) else {
        return;
    };
    let api = &inst.api;
    api.add_webhook(ACME, &dead.url()).await;
    api.add_webhook(BETA, &healthy.url()).await;
    for i in 0..12 {
        api.finished_task(ACME, &format!("dead-{i}")).await;
    }
    // acme's backlog now holds its slots for many timeouts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut finished_at = BTreeMap::new();
    for i in 0..5 {
        let id = api.finished_task(BETA, &format!("live-{i}")).await;
        finished_at.insert(format!("evt_{id}"), Instant::now());
    }
    let accepted = healthy.wait_accepted(5, Duration::from_secs(10)).await;
    assert_eq!(
        accepted.len(),
        5,
        "beta's events arrive while acme's endpoint hangs"
    );
    for r in healthy.got() {
        let lag = r.at.saturating_duration_since(finished_at[&r.id]);
        assert!(
            lag < Duration::from_millis(2500),
            "{} arrived {lag:?} after its task finished, behind acme's 3 s timeouts",
            r.id
        );
    }
    healthy.assert_signed();
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name("sqlite").await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name("postgres").await;
                }
            )*
        }
    };
}

/// docs/webhooks.md, "Budget thresholds", end to end: an endpoint's `budget_thresholds`
/// are checked, shown and patched over the API; spend of a priced model reaching one of
/// them under the app's USD limit sends one signed `budget.threshold` delivery.
async fn budget_thresholds_over_the_api(backend: &str) {
    let receiver = Receiver::start().await;
    let Some(inst) = Instance::start_with(backend, |db| {
        config_text(db, &local("2s", "10s"))
            .replace(
                "[models.slow]",
                "[models.priced]\nprovider = \"dev\"\nmodel = \"dev-1\"\nmax_output_tokens = 50\n\
                 prices = { input_per_million = 1000.0, output_per_million = 1000.0 }\n\n\
                 [models.slow]",
            )
            .replace(
                &format!("api_keys = [\"{ACME}\"]"),
                &format!("api_keys = [\"{ACME}\"]\nusd_per_24_hours = 10.0"),
            )
    }) else {
        return;
    };
    let api = &inst.api;
    for bad in [json!([1.5]), json!([]), json!([0.0]), json!([0.00001])] {
        let (status, body) = api
            .call(
                reqwest::Method::POST,
                "/v1/webhooks",
                ACME,
                Some(
                    json!({"url": receiver.url(), "events": ["budget.threshold"],
                            "budget_thresholds": bad}),
                ),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{bad}: {body}");
    }
    let (status, endpoint) = api
        .call(
            reqwest::Method::POST,
            "/v1/webhooks",
            ACME,
            Some(
                json!({"url": receiver.url(), "events": ["budget.threshold"],
                        "budget_thresholds": [1.0, 0.5], "secret": SECRET}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{endpoint}");
    assert_eq!(endpoint["budget_thresholds"], json!([0.5, 1.0]));
    let id = endpoint["id"].as_str().unwrap().to_string();
    let (status, patched) = api
        .call(
            reqwest::Method::PATCH,
            &format!("/v1/webhooks/{id}"),
            ACME,
            Some(json!({"budget_thresholds": [0.0001, 1.0]})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{patched}");
    assert_eq!(patched["budget_thresholds"], json!([0.0001, 1.0]));
    let (_, plain) = api
        .call(
            reqwest::Method::POST,
            "/v1/webhooks",
            BETA,
            Some(json!({"url": receiver.url(), "events": ["task.failed"], "secret": SECRET})),
        )
        .await;
    assert_eq!(plain["budget_thresholds"], json!([0.8]), "the default");

    // 0.01 % of 10 USD is 0.001 USD: one token of the priced model.
    for i in 0..2 {
        let res = api
            .http
            .post(format!("{}/v1/tasks?wait=20s", api.base))
            .bearer_auth(ACME)
            .header("Idempotency-Key", format!("priced-{i}"))
            .json(&json!({"kind": "classify", "scope": "s", "model": "priced",
                "request": {"input": format!("Win a free cruise {i}"), "labels": ["spam", "ham"]}}))
            .send()
            .await
            .unwrap();
        let body: Value = res.json().await.unwrap();
        assert_eq!(body["status"], json!("succeeded"), "{body}");
    }
    receiver.wait_accepted(1, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let got = receiver.got();
    assert_eq!(
        got.len(),
        1,
        "one threshold reached once: {:?}",
        got.iter().map(|r| &r.body).collect::<Vec<_>>()
    );
    receiver.assert_signed();
    let body = &got[0].body;
    assert_eq!(body["type"], json!("budget.threshold"), "{body}");
    assert_eq!(
        body["data"]["limit"],
        json!("app_usd_per_24_hours"),
        "{body}"
    );
    assert_eq!(body["data"]["threshold"], json!(0.0001), "{body}");
    assert_eq!(body["data"]["limit_usd"], json!(10.0), "{body}");
    assert_eq!(body["data"]["app"], json!("acme"), "{body}");
    assert!(
        body["data"]["spent_usd"].as_f64().unwrap() >= 0.001,
        "{body}"
    );
    assert!(body["data"].get("scope").is_none(), "{body}");
    assert!(got[0].id.starts_with("evt_budget_"), "{}", got[0].id);
}

both_backends!(
    budget_thresholds_over_the_api,
    delivered_once_when_healthy,
    retried_through_errors_timeouts_and_downtime,
    nothing_lost_across_kill_9,
    internal_addresses_refused_by_default,
    dead_endpoint_does_not_delay_another_app,
);
