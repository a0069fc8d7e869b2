//! What one tenant's load may take from the others, over HTTP with the real binary
//! (docs/api.md, "Waiting", "Batches", "Metrics"): long-polls and batch requests are
//! bounded per app (429 naming the app's limit, another app still served), a batch's
//! memory is bounded by its body and given back, and `/metrics` shows no tenant-chosen
//! name and can be protected.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

#[macro_use]
mod common;

const ACME: &str = "acme-key-0123456789abcdef";
const BETA: &str = "beta-key-0123456789abcdef";
const METRICS_TOKEN: &str = "scrape-token-0123456789";

/// A `serve` process with the addresses it printed, killed on drop.
struct Served {
    child: Child,
    base: String,
    metrics: Option<String>,
    http: reqwest::Client,
    _schema: Option<(String, String)>,
    _dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some((url, schema)) = &self._schema {
            common::psql(url, &format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"));
        }
    }
}

/// Starts `serve` with two apps (`acme`, `beta`), a `slow` model, and `extra` appended to
/// the configuration. `None`: the Postgres half is skipped.
fn serve(backend: &str, extra: &str) -> Option<Served> {
    let dir = tempfile::tempdir().unwrap();
    let (db, schema) = common::database(backend, dir.path(), "fair")?;
    let config = format!(
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

{extra}
"#
    );
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, config).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(&path)
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("the tollgate binary starts");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    // `[metrics] addr` is printed after the API's address.
    let own_metrics_addr = extra.contains("[metrics]\naddr");
    let (mut base, mut metrics) = (None, None);
    while base.is_none() || (own_metrics_addr && metrics.is_none()) {
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("the server prints its address");
        if let Some(addr) = line.strip_prefix("Tollgate metrics on ") {
            metrics = Some(addr.trim().trim_end_matches("/metrics").to_string());
        }
        if let Some(addr) = line.strip_prefix("Tollgate listening on ") {
            base = Some(addr.trim().to_string());
        }
    }
    Some(Served {
        child,
        base: base.unwrap(),
        metrics,
        http: reqwest::Client::new(),
        _schema: schema,
        _dir: dir,
    })
}

impl Served {
    async fn call(
        &self,
        method: reqwest::Method,
        url: &str,
        key: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut rb = self.http.request(method, url);
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        if let Some(b) = body {
            rb = rb.header("content-type", "application/json").body(b);
        }
        let response = rb.send().await.expect("the server answers");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, value)
    }

    async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let url = format!("{}{path}", self.base);
        let (st, _, v) = self.call(reqwest::Method::GET, &url, Some(key), None).await;
        (st, v)
    }

    async fn submit(&self, key: &str, path: &str, body: Value) -> (StatusCode, Value) {
        let url = format!("{}{path}", self.base);
        let body = serde_json::to_vec(&body).unwrap();
        let (st, _, v) = self
            .call(reqwest::Method::POST, &url, Some(key), Some(body))
            .await;
        (st, v)
    }

    async fn metrics_text(&self, base: &str, token: Option<&str>) -> (StatusCode, String) {
        let mut rb = self.http.get(format!("{base}/metrics"));
        if let Some(t) = token {
            rb = rb.bearer_auth(t);
        }
        let r = rb.send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    }
}

fn slow_task(scope: &str, key: &str) -> Value {
    json!({"kind": "classify", "scope": scope, "model": "slow", "effect_key": key,
           "request": {"input": "x", "labels": ["a", "b"]}})
}

/// Beyond `waiters_per_app` an app's long-poll is refused with 429
/// `WORKFLOW_AI_TOO_MANY_WAITERS` naming the app's limit (a refused `POST ?wait=`
/// submits nothing); another app's long-polls are still served.
async fn long_polls_are_bounded_per_app(backend: &str) {
    let Some(s) = serve(backend, "[notifications]\nwaiters_per_app = 3\n") else {
        return;
    };
    let (st, task) = s.submit(ACME, "/v1/tasks", slow_task("s", "slow-1")).await;
    assert_eq!(st, StatusCode::CREATED, "{task}");
    let id = task["id"].as_str().unwrap().to_string();
    let mut waiting = Vec::new();
    for _ in 0..3 {
        let url = format!("{}/v1/tasks/{id}?wait=3s", s.base);
        let http = s.http.clone();
        waiting.push(tokio::spawn(async move {
            http.get(url)
                .bearer_auth(ACME)
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    tokio::time::sleep(Duration::from_millis(700)).await;
    let url = format!("{}/v1/tasks/{id}?wait=3s", s.base);
    let (st, headers, e) = s.call(reqwest::Method::GET, &url, Some(ACME), None).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{e}");
    assert_eq!(e["error"]["code"], "WORKFLOW_AI_TOO_MANY_WAITERS", "{e}");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`acme`") && message.contains(" 3 "),
        "{message}"
    );
    assert!(headers.contains_key("retry-after"), "{headers:?}");
    // A refused submission with ?wait= wrote nothing.
    let (st, e) = s
        .submit(ACME, "/v1/tasks?wait=2s", slow_task("s", "refused-1"))
        .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{e}");
    let (st, _) = s.get("/v1/tasks?effect_key=refused-1", ACME).await;
    assert_eq!(
        st,
        StatusCode::NOT_FOUND,
        "a refused submission stores nothing"
    );
    // Another app waits as usual.
    let (st, theirs) = s.submit(BETA, "/v1/tasks", slow_task("t", "beta-1")).await;
    assert_eq!(st, StatusCode::CREATED, "{theirs}");
    let started = Instant::now();
    let (st, got) = s
        .get(
            &format!("/v1/tasks/{}?wait=1s", theirs["id"].as_str().unwrap()),
            BETA,
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{got}");
    assert!(started.elapsed() >= Duration::from_millis(900), "it waited");
    for w in waiting {
        assert_eq!(w.await.unwrap(), StatusCode::OK);
    }
    // The slots are free again.
    let (st, got) = s.get(&format!("/v1/tasks/{id}?wait=100ms"), ACME).await;
    assert_eq!(st, StatusCode::OK, "{got}");
}

/// After tasks of two apps in many scopes, `/metrics` names no app and no scope, and its
/// size does not grow with the number of scopes.
async fn metrics_name_no_tenant(backend: &str) {
    let Some(s) = serve(backend, "") else {
        return;
    };
    let run = |key: &'static str, scope: String, n: usize| {
        let task = json!({"kind": "classify", "scope": scope, "effect_key": format!("{scope}-{n}"),
                          "request": {"input": format!("text {n}"), "labels": ["a", "b"]}});
        let s = &s;
        async move {
            let (st, t) = s.submit(key, "/v1/tasks?wait=20s", task).await;
            assert_eq!(st, StatusCode::CREATED, "{t}");
            assert_eq!(t["status"], "succeeded", "{t}");
        }
    };
    run(ACME, "secret-scope-a0".into(), 0).await;
    run(BETA, "secret-scope-b0".into(), 0).await;
    let (st, first) = s.metrics_text(&s.base, None).await;
    assert_eq!(st, StatusCode::OK);
    for i in 1..=20 {
        run(ACME, format!("secret-scope-a{i}"), i).await;
        run(BETA, format!("secret-scope-b{i}"), i).await;
    }
    let (_, text) = s.metrics_text(&s.base, None).await;
    for name in ["acme", "beta", "secret-scope"] {
        assert!(!text.contains(name), "/metrics shows {name}:\n{text}");
    }
    let series = |t: &str| t.lines().filter(|l| !l.starts_with('#')).count();
    assert_eq!(
        series(&text),
        series(&first),
        "40 more scopes added series:\n{text}"
    );
}

/// With `[metrics] token`, `/metrics` answers only that bearer token (an API key is not
/// enough); with `[metrics] addr`, it is served there and not on the API's address.
async fn metrics_can_be_protected(backend: &str) {
    let Some(s) = serve(
        backend,
        &format!("[metrics]\ntoken = \"{METRICS_TOKEN}\"\napp_labels = true\n"),
    ) else {
        return;
    };
    for token in [None, Some("wrong-token-0123456789"), Some(ACME)] {
        let url = format!("{}/metrics", s.base);
        let (st, headers, e) = s.call(reqwest::Method::GET, &url, token, None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{token:?}: {e}");
        assert_eq!(e["error"]["code"], "unauthorized", "{e}");
        assert!(headers.contains_key("www-authenticate"));
    }
    let (st, t) = s
        .submit(
            ACME,
            "/v1/tasks?wait=20s",
            json!({"kind": "classify", "scope": "s",
        "effect_key": "labelled", "request": {"input": "x", "labels": ["a", "b"]}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{t}");
    let (st, text) = s.metrics_text(&s.base, Some(METRICS_TOKEN)).await;
    assert_eq!(st, StatusCode::OK);
    assert!(text.contains("tollgate_submits_total"), "{text}");
    // The operator opted in to app labels: the app shows, the scope never.
    assert!(
        text.contains(r#"tollgate_scope_claims_total{app="acme"}"#),
        "{text}"
    );
    drop(s);

    let Some(s) = serve(backend, "[metrics]\naddr = \"127.0.0.1:0\"\n") else {
        return;
    };
    let metrics = s.metrics.clone().expect("the metrics address is printed");
    assert_ne!(metrics, s.base);
    let (st, text) = s.metrics_text(&metrics, None).await;
    assert_eq!(st, StatusCode::OK);
    assert!(text.contains("tollgate_submits_total"), "{text}");
    let (st, e) = s.metrics_text(&s.base, None).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    let (st, _, _) = s
        .call(
            reqwest::Method::GET,
            &format!("{metrics}/v1/tasks"),
            Some(ACME),
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "only /metrics there");
}

/// A batch body over `max_batch_body_bytes` is refused with 413; while an app has
/// `batches_per_app` batches in flight (here one whose body is still arriving), another
/// of its batches is refused with 429 `WORKFLOW_AI_TOO_MANY_BATCHES`, and another app's
/// batch is answered.
async fn batches_are_bounded_per_app(backend: &str) {
    let Some(s) = serve(
        backend,
        "[server]\nmax_batch_body_bytes = 20000\nbatches_per_app = 1\n",
    ) else {
        return;
    };
    let item = |k: String| {
        json!({"kind": "classify", "scope": "s", "effect_key": k,
               "request": {"input": "x", "labels": ["a", "b"]}})
    };
    let big: Vec<Value> = (0..300).map(|i| item(format!("big-{i}"))).collect();
    let (st, e) = s
        .submit(ACME, "/v1/tasks/batch", json!({ "tasks": big }))
        .await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("20000"),
        "{e}"
    );
    let (st, _) = s.get("/v1/tasks?effect_key=big-0", ACME).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "a refused batch stores nothing");

    // A batch whose body is still arriving holds acme's one slot.
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&addr).await.unwrap();
    slow.write_all(
        format!(
            "POST /v1/tasks/batch HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ACME}\r\n\
             Content-Type: application/json\r\nContent-Length: 5000\r\n\r\n{{\"tasks\": ["
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let small = |k: &str| json!({ "tasks": [item(k.to_string())] });
    let (st, e) = s.submit(ACME, "/v1/tasks/batch", small("second")).await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{e}");
    assert_eq!(e["error"]["code"], "WORKFLOW_AI_TOO_MANY_BATCHES", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("`acme`"),
        "{e}"
    );
    let (st, _) = s.get("/v1/tasks?effect_key=second", ACME).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, answer) = s.submit(BETA, "/v1/tasks/batch", small("theirs")).await;
    assert_eq!(st, StatusCode::OK, "{answer}");
    assert_eq!(answer["results"][0]["status"], 201, "{answer}");
    // Once the slow batch is gone, acme's next batch is answered.
    drop(slow);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (st, answer) = s.submit(ACME, "/v1/tasks/batch", small("third")).await;
        if st == StatusCode::OK {
            assert_eq!(answer["results"][0]["status"], 201, "{answer}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "acme's slot never came back: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Resident and peak memory (MiB) of a process, from `/proc/<pid>/status`.
fn memory_of(pid: u32) -> (f64, f64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|kb| kb.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{name} in {status}"))
            / 1024.0
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// A batch of 1,000 `classify_many` tasks near the default body limit raises the
/// server's peak memory by a small multiple of its body, and its memory is given back
/// after the answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_memory_is_bounded_by_its_body_and_given_back() {
    let s = serve("sqlite", "").unwrap();
    let tasks: Vec<Value> = (0..1000)
        .map(|i| {
            let items: Vec<Value> = (0..18)
                .map(|j| json!({"id": format!("i{j}"), "input": format!("lorem ipsum dolor sit amet {i} {j} ").repeat(12)}))
                .collect();
            json!({"kind": "classify_many", "scope": format!("s{}", i % 10), "model": "slow",
                   "effect_key": format!("mem-{i}"),
                   "request": {"items": items, "labels": ["a", "b"]}})
        })
        .collect();
    let body = serde_json::to_vec(&json!({ "tasks": tasks })).unwrap();
    drop(tasks);
    let body_mib = body.len() as f64 / (1 << 20) as f64;
    assert!(
        body.len() < 8 << 20,
        "within the default limit: {body_mib} MiB"
    );
    // Warm up: connections and the first request's allocations.
    let (st, _) = s
        .submit(ACME, "/v1/tasks/batch", json!({"tasks": []}))
        .await;
    assert_eq!(st, StatusCode::OK);
    let pid = s.child.id();
    let (rss_before, peak_before) = memory_of(pid);
    let url = format!("{}/v1/tasks/batch", s.base);
    let (st, _, answer) = s
        .call(reqwest::Method::POST, &url, Some(ACME), Some(body))
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(answer["results"].as_array().unwrap().len(), 1000);
    assert!(
        answer["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["status"] == 201),
        "every item created"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_after, peak_after) = memory_of(pid);
    let growth = peak_after - peak_before;
    eprintln!(
        "batch body {body_mib:.1} MiB: peak +{growth:.1} MiB ({:.1}x the body); \
         resident {rss_before:.1} -> {rss_after:.1} MiB",
        growth / body_mib
    );
    assert!(
        growth <= 6.0 * body_mib,
        "peak grew {growth:.1} MiB for a {body_mib:.1} MiB body"
    );
    assert!(
        rss_after - rss_before <= 2.5 * body_mib,
        "resident memory stayed {:.1} MiB above its level before the batch",
        rss_after - rss_before
    );
}

on_both_backends!(
    long_polls_are_bounded_per_app,
    metrics_name_no_tenant,
    metrics_can_be_protected,
    batches_are_bounded_per_app,
);
