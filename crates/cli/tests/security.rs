//! Security over HTTP against the real `tollgate serve` binary (issue 8), beside what
//! `http.rs` already covers (the bad-input table for `POST /v1/tasks` and the size limit):
//! - a JSON Schema naming remote documents makes the server open no connection at all;
//! - headers that are too long, or not text, are refused with a 4xx;
//! - every other body-taking route refuses malformed, mistyped and oversized bodies with
//!   a 4xx JSON error and stores nothing;
//! - integers beyond ±2^53 anywhere in a request are refused;
//! - the tenant isolation matrix: every route of `crates/server/src/routes/mod.rs` (the test
//!   reads the router to be sure none is missed) called with another app's key on real
//!   rows of the first app answers 404 (or an empty/zero answer for collection routes)
//!   and changes nothing the first app can see.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

const ACME: &str = "acme-key-0123456789abcdef";
const BETA: &str = "beta-key-0123456789abcdef";

struct Server {
    child: Child,
    base: String,
    http: reqwest::Client,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve` on a fresh SQLite file; `workers` executions (0: tasks stay queued, so rows
/// change only when a call changes them).
fn start(workers: u32) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("tollgate.toml");
    std::fs::write(
        &config,
        format!(
            r#"
[server]
max_request_bytes = 4000

[database]
url = "sqlite://{}"

[apps.acme]
api_keys = ["{ACME}"]

[apps.beta]
api_keys = ["{BETA}"]

[workers]
concurrency = {workers}
"#,
            dir.path().join("tollgate.db").display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "127.0.0.1:0", "--config"])
        .arg(&config)
        .current_dir(dir.path())
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
        .expect("the server prints its address");
    Server {
        child,
        base,
        http: reqwest::Client::new(),
        _dir: dir,
    }
}

impl Server {
    async fn call(
        &self,
        method: Method,
        path: &str,
        key: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> (StatusCode, Value) {
        let mut rb = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(key);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        if let Some(b) = body {
            rb = rb.header("content-type", "application/json").body(b);
        }
        let r = rb.send().await.expect("the server answers");
        let status = r.status();
        let text = r.text().await.unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn json(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Value,
    ) -> (StatusCode, Value) {
        self.call(
            method,
            path,
            key,
            &[],
            Some(serde_json::to_vec(&body).unwrap()),
        )
        .await
    }

    async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        self.call(Method::GET, path, key, &[], None).await
    }
}

fn is_json_error(v: &Value) -> bool {
    v["error"]["code"].is_string() && v["error"]["message"].is_string()
}

/// A TCP listener that counts every connection made to it.
fn recording_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, hits)
}

/// A tenant's schema must never make the server fetch a URL: remote `$ref`, `$schema`,
/// `$id`-relative and `$dynamicRef` references, at the root and nested, are refused
/// (422, nothing stored) and no connection reaches the listener they name, neither at
/// submission nor while a worker validates an output.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remote_schema_references_cause_no_outbound_request() {
    let s = start(2);
    let (port, hits) = recording_listener();
    let remote = format!("http://127.0.0.1:{port}/schema.json");
    let schemas = [
        json!({"$ref": remote}),
        json!({"type": "object", "properties": {"a": {"$ref": remote}}}),
        json!({"$schema": remote, "type": "object"}),
        json!({"$id": format!("http://127.0.0.1:{port}/root.json"), "type": "object",
               "properties": {"a": {"$ref": "other.json"}}}),
        json!({"type": "object", "properties": {"a": {"$dynamicRef": remote}}}),
        json!({"allOf": [{"$ref": format!("{remote}#/definitions/x")}]}),
        json!({"type": "array", "items": {"$ref": format!("//127.0.0.1:{port}/x")}}),
    ];
    let mut accepted = Vec::new();
    for (i, schema) in schemas.iter().enumerate() {
        let key = format!("ref-{i}");
        let (st, e) = s
            .call(
                Method::POST,
                "/v1/tasks?wait=3s",
                ACME,
                &[("idempotency-key", &key)],
                Some(
                    serde_json::to_vec(&json!({"kind": "extract_data", "scope": "s",
                        "request": {"input": "x", "schema": schema}}))
                    .unwrap(),
                ),
            )
            .await;
        if st.is_client_error() {
            assert!(is_json_error(&e), "{schema}: {e}");
            let (st, _) = s.get(&format!("/v1/tasks?effect_key={key}"), ACME).await;
            assert_eq!(st, StatusCode::NOT_FOUND, "{schema}: nothing stored");
        } else {
            // Accepted only if the reference is never followed; the run must not fetch.
            accepted.push((schema.clone(), e));
        }
    }
    eprintln!(
        "{} schemas refused, accepted (no remote reference followed): {accepted:?}",
        schemas.len() - accepted.len()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        0,
        "the server connected to a URL named by a tenant's schema"
    );
    assert!(
        accepted
            .iter()
            .all(|(schema, _)| !schema.to_string().contains("\"$ref\":\"http")),
        "a remote $ref must be refused: {accepted:?}"
    );
}

/// Headers: a huge header block is refused before any handler runs (431); an
/// `Idempotency-Key` that is too long or not text is a 4xx JSON error and stores nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlong_and_binary_headers_are_refused() {
    let s = start(0);
    let body = serde_json::to_vec(
        &json!({"kind": "classify", "scope": "s", "request": {"input": "x", "labels": ["a", "b"]}}),
    )
    .unwrap();
    // One enormous header.
    let huge = "h".repeat(1 << 20);
    let r = s
        .http
        .post(format!("{}/v1/tasks", s.base))
        .bearer_auth(ACME)
        .header("idempotency-key", "huge-header")
        .header("x-padding", huge.as_str())
        .body(body.clone())
        .send()
        .await;
    match r {
        Ok(r) => assert_eq!(
            r.status(),
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "a 1 MiB header"
        ),
        Err(e) => panic!("the server must answer, not drop the connection: {e}"),
    }
    // Thousands of headers.
    let mut rb = s
        .http
        .post(format!("{}/v1/tasks", s.base))
        .bearer_auth(ACME)
        .header("idempotency-key", "many-headers");
    for i in 0..2000 {
        rb = rb.header(format!("x-h{i}"), "v");
    }
    let r = rb.body(body.clone()).send().await;
    if let Ok(r) = r {
        assert!(
            r.status().is_client_error(),
            "2,000 headers: {}",
            r.status()
        );
    }
    for key in ["huge-header", "many-headers"] {
        let (st, _) = s.get(&format!("/v1/tasks?effect_key={key}"), ACME).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{key}: nothing stored");
    }
    // An effect key far beyond any sane length: refused by validation, as JSON.
    let long_key = "k".repeat(5000);
    let (st, e) = s
        .call(
            Method::POST,
            "/v1/tasks",
            ACME,
            &[("idempotency-key", &long_key)],
            Some(body.clone()),
        )
        .await;
    assert!(st.is_client_error() && is_json_error(&e), "{st} {e}");
    // A header value that is not text.
    let r = s
        .http
        .post(format!("{}/v1/tasks", s.base))
        .bearer_auth(ACME)
        .header(
            "idempotency-key",
            reqwest::header::HeaderValue::from_bytes(b"k\xff\xfe").unwrap(),
        )
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let e: Value = r.json().await.unwrap();
    assert!(is_json_error(&e), "{e}");
    // An Authorization header that is not text is simply not a key.
    let r = s
        .http
        .get(format!("{}/v1/kinds", s.base))
        .header(
            "authorization",
            reqwest::header::HeaderValue::from_bytes(b"Bearer \xff").unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

/// The other body-taking routes refuse bad bodies the same way: 400 for malformed JSON,
/// invalid UTF-8, wrong types and unknown fields; 413 beyond their limit; 422 for values
/// out of range; always a JSON error and nothing stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_body_route_refuses_bad_bodies_and_stores_nothing() {
    let s = start(0);
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    let big = 9_007_199_254_740_993u64;
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("/v1/tasks/batch", b"{\"tasks\": [".to_vec()),
        ("/v1/tasks/batch", vec![b'{', 0xc3, 0x28, b'}']),
        ("/v1/tasks/batch", br#"{"tasks": {"kind": "classify"}}"#.to_vec()),
        ("/v1/tasks/batch", br#"{"tasks": [], "extra": 1}"#.to_vec()),
        ("/v1/tasks/batch", format!("{{\"tasks\": {deep}}}").into_bytes()),
        ("/v1/tasks/release", b"{\"effect_key\": ".to_vec()),
        ("/v1/tasks/release", br#"{"effect_key": 5, "scope": "s"}"#.to_vec()),
        ("/v1/tasks/release", br#"{"effect_key": "k", "scope": "s", "x": 1}"#.to_vec()),
        ("/v1/tasks/release", vec![0xff, 0xfe]),
        ("/v1/runs", b"[".to_vec()),
        ("/v1/runs", br#"{"scope": 42}"#.to_vec()),
        ("/v1/runs", br#"{"scope": "wf", "surprise": true}"#.to_vec()),
        ("/v1/runs", format!("{{\"scope\": \"wf\", \"input\": {deep}}}").into_bytes()),
        ("/v1/runs", format!("{{\"scope\": \"wf\", \"input\": {{\"n\": {big}}}}}").into_bytes()),
        ("/v1/runs", format!("{{\"scope\": \"wf\", \"input\": {{\"n\": -{big}}}}}").into_bytes()),
        ("/v1/tasks", format!("{{\"kind\": \"generate_text\", \"scope\": \"s\", \"effect_key\": \"neg\", \"request\": {{\"prompt\": \"p\", \"max_output_tokens\": -{big}}}}}").into_bytes()),
        ("/v1/tasks", br#"{"kind": "generate_text", "scope": "s", "effect_key": "huge-float", "request": {"prompt": "p", "temperature": 1e400}}"#.to_vec()),
        ("/v1/tasks", br#"{"kind": "classify", "scope": "s", "effect_key": "dup", "request": {"input": "x", "labels": ["a", "b"]}, "request": {"input": "y", "labels": ["a", "b"]}}"#.to_vec()),
    ];
    for (path, body) in cases {
        let shown = String::from_utf8_lossy(&body)
            .chars()
            .take(80)
            .collect::<String>();
        let (st, e) = s.call(Method::POST, path, ACME, &[], Some(body)).await;
        assert!(
            st.is_client_error() && st != StatusCode::NOT_FOUND,
            "{path} {shown}: {st} {e}"
        );
        assert!(is_json_error(&e), "{path} {shown}: a JSON error body: {e}");
    }
    // Over each route's own limit (1 MiB for the small routes, a batch's default
    // `[server] max_batch_body_bytes`).
    for (path, limit) in [
        ("/v1/tasks/release", 1 << 20),
        ("/v1/runs", 1 << 20),
        ("/v1/tasks/batch", tollgate_server::DEFAULT_BATCH_BODY_LIMIT),
    ] {
        let body = format!("{{\"scope\": \"{}\"}}", "x".repeat(limit - 12));
        assert_eq!(body.len(), limit + 1);
        let (st, e) = s
            .call(Method::POST, path, ACME, &[], Some(body.into_bytes()))
            .await;
        assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{path}: {e}");
        assert!(is_json_error(&e), "{path}: {e}");
    }
    // More items than a batch may hold.
    let items: Vec<Value> = (0..1001)
        .map(|i| {
            json!({"kind": "classify", "scope": "s", "effect_key": format!("many-{i}"),
                        "request": {"input": "x", "labels": ["a", "b"]}})
        })
        .collect();
    let (st, e) = s
        .json(
            Method::POST,
            "/v1/tasks/batch",
            ACME,
            json!({"tasks": items}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    let (st, _) = s.get("/v1/tasks?effect_key=many-0", ACME).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "a refused batch stores nothing");
    // Nothing was stored: no task under any key used above, no run, no source.
    for key in ["neg", "huge-float", "dup"] {
        let (st, _) = s.get(&format!("/v1/tasks?effect_key={key}"), ACME).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{key}: nothing stored");
    }
    let (st, u) = s.get("/v1/scopes/s/unreleased-sources", ACME).await;
    assert_eq!((st, u["sources"].clone()), (StatusCode::OK, json!([])));
}

/// Configuration refusals beside those of `http.rs`: every limit must be a positive
/// integer, and every app needs a key; the message names the setting.
#[test]
fn invalid_limits_are_refused_at_start_naming_the_setting() {
    let dir = tempfile::tempdir().unwrap();
    let policy = |field: &str, value: &str| {
        let mut text = String::from("[budgets.standard]\n");
        for f in [
            "max_steps_per_source",
            "sources_per_24_hours",
            "scope_concurrent",
            "burst",
            "tasks_per_minute",
        ] {
            let v = if f == field { value } else { "1" };
            text.push_str(&format!("{f} = {v}\n"));
        }
        text
    };
    let mut cases = Vec::new();
    for field in [
        "sources_per_24_hours",
        "scope_concurrent",
        "burst",
        "tasks_per_minute",
    ] {
        for value in ["0", "-1", "2.5", "\"ten\""] {
            cases.push((policy(field, value), format!("budgets.standard.{field}")));
        }
    }
    for value in ["0", "-3", "0.5"] {
        cases.push((
            format!("[admission]\nglobal_concurrent = {value}\n"),
            "admission.global_concurrent".to_string(),
        ));
    }
    cases.push((
        format!("[apps.acme]\napi_keys = [\"{ACME}\"]\n[apps.beta]\napi_keys = []\n"),
        "apps.beta".to_string(),
    ));
    for (text, key) in cases {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, &text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--addr", "127.0.0.1:0", "--config"])
            .arg(&path)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(&key), "the message names {key}: {err}\n{text}");
    }
}

/// Every (method, path) the router serves, read from its source so a new route cannot
/// be forgotten by the matrix below.
fn routes_in_router() -> BTreeSet<(String, String)> {
    let source = include_str!("../../server/src/routes/mod.rs");
    let mut routers =
        vec![&source[source.find("Router::new()").unwrap()..source.find(".fallback(").unwrap()]];
    // The module the router merges (dashboard): its `Router::new()`.
    let source = include_str!("../../server/src/ui.rs");
    let start = source.find("Router::new()").unwrap();
    let end = start + source[start..].find("\n}\n").unwrap();
    routers.push(&source[start..end]);
    let mut routes = BTreeSet::new();
    for part in routers.iter().flat_map(|r| r.split(".route(").skip(1)) {
        let path = part.split('"').nth(1).unwrap().to_string();
        for method in ["get", "post", "delete", "put", "patch"] {
            let token = format!("{method}(");
            let mut rest = part;
            while let Some(i) = rest.find(&token) {
                let before = rest[..i].chars().last().unwrap_or(' ');
                if !(before.is_alphanumeric() || before == '_') {
                    routes.insert((method.to_uppercase(), path.clone()));
                }
                rest = &rest[i + token.len()..];
            }
        }
    }
    routes
}

/// What acme can see of its own rows; must be identical before and after beta's calls.
async fn acme_view(s: &Server, tasks: &[&str], runs: &[&str]) -> Vec<Value> {
    let mut view = Vec::new();
    for id in tasks {
        view.push(s.get(&format!("/v1/tasks/{id}"), ACME).await.1);
    }
    for id in runs {
        view.push(s.get(&format!("/v1/runs/{id}"), ACME).await.1);
    }
    for scope in ["s", "wf"] {
        view.push(
            s.get(&format!("/v1/scopes/{scope}/unreleased-sources"), ACME)
                .await
                .1,
        );
    }
    view
}

/// docs/conformance.md#concepts, docs/conformance.md#tenant-isolation: the tenant isolation matrix over every route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_isolation_matrix_covers_every_route() {
    let s = start(0);
    // Acme's real rows: a queued scoped task, a canceled (terminal) one, a run with a
    // task of its own.
    let task = |key: &str, source: &str| {
        json!({"kind": "classify", "scope": "s", "effect_key": key,
               "source": {"id": source, "revision": "v1"},
               "request": {"input": key, "labels": ["a", "b"]}})
    };
    let (st, queued) = s
        .json(Method::POST, "/v1/tasks", ACME, task("acme-q", "doc-q"))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{queued}");
    let (_, done) = s
        .json(Method::POST, "/v1/tasks", ACME, task("acme-c", "doc-c"))
        .await;
    let (q, c) = (queued["id"].as_str().unwrap(), done["id"].as_str().unwrap());
    let (st, _) = s
        .json(
            Method::POST,
            &format!("/v1/tasks/{c}/cancel"),
            ACME,
            json!({}),
        )
        .await;
    assert_eq!(st, StatusCode::OK);
    let (st, run) = s
        .json(Method::POST, "/v1/runs", ACME, json!({"scope": "wf"}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{run}");
    let r = run["id"].as_str().unwrap();
    let (st, rt) = s
        .json(
            Method::POST,
            "/v1/tasks",
            ACME,
            json!({"kind": "generate_text", "run_id": r, "effect_key": "acme-r",
                   "request": {"prompt": "p"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{rt}");
    let rt = rt["id"].as_str().unwrap();
    let tasks = [q, c, rt];
    let before = acme_view(&s, &tasks, &[r]).await;

    let mut covered: BTreeSet<(String, String)> = BTreeSet::new();
    let mut cover = |m: &Method, p: &str| covered.insert((m.to_string(), p.to_string()));
    // Routes on one row: 404 for every acme row, never 403.
    for id in tasks {
        let (st, e) = s.get(&format!("/v1/tasks/{id}"), BETA).await;
        assert_eq!(
            (st, is_json_error(&e)),
            (StatusCode::NOT_FOUND, true),
            "{e}"
        );
        let (st, _) = s
            .json(
                Method::POST,
                &format!("/v1/tasks/{id}/cancel"),
                BETA,
                json!({}),
            )
            .await;
        assert_eq!(st, StatusCode::NOT_FOUND, "cancel {id}");
        let (st, e) = s.get(&format!("/v1/tasks/{id}/events"), BETA).await;
        assert_eq!(
            (st, is_json_error(&e)),
            (StatusCode::NOT_FOUND, true),
            "events {id}: {e}"
        );
    }
    cover(&Method::GET, "/v1/tasks/{id}");
    cover(&Method::POST, "/v1/tasks/{id}/cancel");
    cover(&Method::GET, "/v1/tasks/{id}/events");
    let (st, _) = s.get(&format!("/v1/runs/{r}"), BETA).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s
        .json(
            Method::POST,
            &format!("/v1/runs/{r}/cancel"),
            BETA,
            json!({}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    cover(&Method::GET, "/v1/runs/{id}");
    cover(&Method::POST, "/v1/runs/{id}/cancel");
    // Routes that name acme's rows by key, run or scope.
    for key in ["acme-q", "acme-c", "acme-r"] {
        let (st, _) = s.get(&format!("/v1/tasks?effect_key={key}"), BETA).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{key}");
        let (st, _) = s
            .json(
                Method::POST,
                "/v1/tasks/release",
                BETA,
                json!({"effect_key": key, "scope": "s"}),
            )
            .await;
        assert_eq!(st, StatusCode::NOT_FOUND, "release {key}");
    }
    cover(&Method::GET, "/v1/tasks");
    cover(&Method::POST, "/v1/tasks/release");
    let (st, e) = s
        .json(
            Method::POST,
            "/v1/tasks",
            BETA,
            json!({"kind": "generate_text", "run_id": r, "effect_key": "beta-in-acme-run",
                   "request": {"prompt": "p"}}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "a task in acme's run: {e}");
    cover(&Method::POST, "/v1/tasks");
    let (st, b) = s
        .json(
            Method::POST,
            "/v1/tasks/batch",
            BETA,
            json!({"tasks": [{"kind": "generate_text", "run_id": r, "effect_key": "beta-b1",
                              "request": {"prompt": "p"}}]}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["results"][0]["status"], json!(404), "{b}");
    cover(&Method::POST, "/v1/tasks/batch");
    for scope in ["s", "wf"] {
        let (st, u) = s
            .get(&format!("/v1/scopes/{scope}/unreleased-sources"), BETA)
            .await;
        assert_eq!((st, u["sources"].clone()), (StatusCode::OK, json!([])));
        let (st, d) = s
            .call(
                Method::DELETE,
                &format!("/v1/scopes/{scope}/tasks"),
                BETA,
                &[],
                None,
            )
            .await;
        assert_eq!((st, d["deleted"].clone()), (StatusCode::OK, json!(0)));
        let (st, d) = s
            .call(
                Method::DELETE,
                &format!("/v1/scopes/{scope}/tasks?source=doc-q"),
                BETA,
                &[],
                None,
            )
            .await;
        assert_eq!((st, d["deleted"].clone()), (StatusCode::OK, json!(0)));
    }
    cover(&Method::GET, "/v1/scopes/{scope}/unreleased-sources");
    cover(&Method::DELETE, "/v1/scopes/{scope}/tasks");
    // A run beta creates is its own, in a scope of the same name.
    let (st, own) = s
        .json(Method::POST, "/v1/runs", BETA, json!({"scope": "wf"}))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_ne!(own["id"].as_str(), Some(r));
    cover(&Method::POST, "/v1/runs");
    // Pipelines: acme's definition is invisible and cannot be run by beta; beta's own
    // pipeline of the same name is a separate row that leaves acme's untouched.
    let pipeline = |label: &str| {
        json!({"name": "acme-pipe", "definition": {
            "steps": [{"key": "label", "kind": "classify",
                       "request": {"input": {"$from": "/input/text"}, "labels": [label, "b"]}}],
            "output": {"label": "/steps/label/output"}}})
    };
    let (st, acme_pipe) = s
        .json(Method::POST, "/v1/pipelines", ACME, pipeline("a"))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{acme_pipe}");
    let (st, e) = s.get("/v1/pipelines/acme-pipe", BETA).await;
    assert_eq!(
        (st, is_json_error(&e)),
        (StatusCode::NOT_FOUND, true),
        "{e}"
    );
    let (st, e) = s
        .json(
            Method::POST,
            "/v1/pipelines/acme-pipe/runs",
            BETA,
            json!({"scope": "wf", "input": {"text": "x"}}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "run acme's pipeline: {e}");
    let (st, beta_pipe) = s
        .json(Method::POST, "/v1/pipelines", BETA, pipeline("z"))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{beta_pipe}");
    let (st, acme_again) = s.get("/v1/pipelines/acme-pipe", ACME).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(acme_again["version"], acme_pipe["version"], "{acme_again}");
    assert_ne!(beta_pipe["version"], acme_pipe["version"]);
    cover(&Method::POST, "/v1/pipelines");
    cover(&Method::GET, "/v1/pipelines/{name}");
    cover(&Method::POST, "/v1/pipelines/{name}/runs");
    // Listings (docs/conformance.md#listings): beta's own rows at most, never acme's, whatever the filter.
    for path in [
        "/v1/tasks?limit=500",
        "/v1/tasks?scope=s",
        "/v1/tasks?status=queued,canceled",
        &format!("/v1/tasks?run_id={r}"),
        "/v1/tasks?source=doc-q",
    ] {
        let (st, page) = s.get(path, BETA).await;
        assert_eq!(
            (st, page["tasks"].clone()),
            (StatusCode::OK, json!([])),
            "{path}"
        );
    }
    let (st, runs) = s.get("/v1/runs?scope=wf", BETA).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        runs["runs"].as_array().unwrap().len(),
        1,
        "beta's own run: {runs}"
    );
    assert_eq!(runs["runs"][0]["id"], own["id"]);
    let (st, pipes) = s.get("/v1/pipelines", BETA).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        pipes["pipelines"][0]["versions"][0]["version"],
        beta_pipe["version"]
    );
    assert_eq!(
        pipes["pipelines"][0]["versions"].as_array().unwrap().len(),
        1,
        "{pipes}"
    );
    let (st, scopes) = s.get("/v1/scopes", BETA).await;
    assert_eq!((st, scopes["scopes"].clone()), (StatusCode::OK, json!([])));
    let (st, scope) = s.get("/v1/scopes/s", BETA).await;
    assert_eq!(st, StatusCode::OK, "{scope}");
    assert_eq!(
        (
            scope["active"].clone(),
            scope["sources_in_window"].clone(),
            scope["admissions_in_window"].clone()
        ),
        (json!(0), json!(0), json!(0)),
        "acme's admissions in scope s do not show: {scope}"
    );
    let (st, stats) = s.get("/v1/stats", BETA).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (stats["queued"].clone(), stats["canceled"].clone()),
        (json!(0), json!(0)),
        "{stats}"
    );
    let (st, acme_scope) = s.get("/v1/scopes/s", ACME).await;
    assert_eq!(
        (st, acme_scope["active"].clone()),
        (StatusCode::OK, json!(1)),
        "{acme_scope}"
    );
    // docs/conformance.md#cost-reservation usage: acme's reservations in scope s never show in beta's reports.
    let (st, acme_usage) = s.get("/v1/scopes/s/usage", ACME).await;
    assert_eq!(st, StatusCode::OK, "{acme_usage}");
    for path in ["/v1/scopes/s/usage", "/v1/usage"] {
        let (st, usage) = s.get(path, BETA).await;
        assert_eq!(st, StatusCode::OK, "{path}: {usage}");
        assert_eq!(
            (
                usage["reserved_tokens"].clone(),
                usage["settled_tokens"].clone()
            ),
            (json!(0), json!(0)),
            "acme's spend does not show to beta at {path}: {usage}"
        );
    }
    for path in [
        "/v1/runs",
        "/v1/pipelines",
        "/v1/scopes",
        "/v1/scopes/{scope}",
        "/v1/stats",
        "/v1/scopes/{scope}/usage",
        "/v1/usage",
    ] {
        cover(&Method::GET, path);
    }
    // Routes without tenant rows: nothing of acme's shows through them.
    for path in [
        "/v1/kinds",
        "/v1/models",
        "/openapi.json",
        "/healthz",
        "/readyz",
        "/metrics",
        "/",
        "/ui",
        "/ui/",
        "/ui/{file}",
    ] {
        let (st, body) = s.get(&path.replace("{file}", "app.js"), BETA).await;
        assert_eq!(st, StatusCode::OK, "{path}");
        let text = body.to_string();
        for secret in [q, c, r, rt, "acme-q", "doc-q", ACME] {
            assert!(!text.contains(secret), "{path} shows acme's {secret}");
        }
        cover(&Method::GET, path);
    }

    // Webhooks (docs/webhooks.md): acme's endpoint is missing to beta, whatever the call,
    // and beta's own endpoint is its own.
    let hook = json!({"url": "https://hooks.invalid/acme", "events": ["task.failed"]});
    let (st, acme_hook) = s
        .json(Method::POST, "/v1/webhooks", ACME, hook.clone())
        .await;
    assert_eq!(st, StatusCode::CREATED, "{acme_hook}");
    let w = acme_hook["id"].as_str().unwrap();
    for (method, path, body) in [
        (Method::GET, format!("/v1/webhooks/{w}"), None),
        (
            Method::PATCH,
            format!("/v1/webhooks/{w}"),
            Some(json!({"enabled": false})),
        ),
        (Method::DELETE, format!("/v1/webhooks/{w}"), None),
        (Method::GET, format!("/v1/webhooks/{w}/deliveries"), None),
        (
            Method::POST,
            format!("/v1/webhooks/{w}/deliveries/{w}/replay"),
            None,
        ),
    ] {
        let body = body.map(|b: Value| b.to_string().into_bytes());
        let (st, e) = s.call(method.clone(), &path, BETA, &[], body).await;
        assert_eq!(
            (st, is_json_error(&e)),
            (StatusCode::NOT_FOUND, true),
            "{method} {path}: {e}"
        );
    }
    let (st, beta_hooks) = s.get("/v1/webhooks", BETA).await;
    assert_eq!(
        (st, beta_hooks["webhooks"].clone()),
        (StatusCode::OK, json!([]))
    );
    let (st, beta_hook) = s.json(Method::POST, "/v1/webhooks", BETA, hook).await;
    assert_eq!(st, StatusCode::CREATED, "{beta_hook}");
    let (_, acme_hooks) = s.get("/v1/webhooks", ACME).await;
    assert_eq!(
        acme_hooks["webhooks"].as_array().unwrap().len(),
        1,
        "{acme_hooks}"
    );
    assert_eq!(
        acme_hooks["webhooks"][0]["enabled"],
        json!(true),
        "{acme_hooks}"
    );
    for (method, path) in [
        (Method::POST, "/v1/webhooks"),
        (Method::GET, "/v1/webhooks"),
        (Method::GET, "/v1/webhooks/{id}"),
        (Method::PATCH, "/v1/webhooks/{id}"),
        (Method::DELETE, "/v1/webhooks/{id}"),
        (Method::GET, "/v1/webhooks/{id}/deliveries"),
        (
            Method::POST,
            "/v1/webhooks/{id}/deliveries/{delivery}/replay",
        ),
    ] {
        cover(&method, path);
    }

    let routes = routes_in_router();
    assert!(routes.len() >= 17, "the router was read: {routes:?}");
    let missing: Vec<_> = routes.difference(&covered).cloned().collect();
    assert!(
        missing.is_empty(),
        "routes the isolation matrix misses: {missing:?}"
    );
    assert_eq!(
        acme_view(&s, &tasks, &[r]).await,
        before,
        "nothing acme sees changed"
    );
}

mod common;

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const SERVICE: &str = "service-key-0123456789abcdef";

/// `serve` with one app and four kinds of key: the app's own (no subject), two bound to a
/// user each, and a service that may assert subjects; no workers, so rows change only
/// when a call changes them.
fn start_subjects(backend: &str) -> Option<common::Server> {
    common::start(backend, "subjects", |db| {
        format!(
            r#"
[database]
url = "{db}"

[apps.acme]
api_keys = [
  "{ACME}",
  {{ key = "{ALICE}", subject = "user:alice" }},
  {{ key = "{BOB}", subject = "user:bob" }},
  {{ key = "{SERVICE}", subject = "service:backend", may_assert_subject = true }},
]

[workers]
concurrency = 0
"#
        )
    })
}

async fn scall(
    s: &common::Server,
    method: Method,
    path: &str,
    key: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut rb = s
        .http
        .request(method, format!("{}{path}", s.base))
        .bearer_auth(key);
    for (k, v) in headers {
        rb = rb.header(*k, *v);
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

/// What alice can see of her rows; must be identical before and after bob's calls.
async fn alice_view(s: &common::Server, tasks: &[&str], run: &str) -> Vec<Value> {
    let mut view = Vec::new();
    for id in tasks {
        view.push(
            scall(s, Method::GET, &format!("/v1/tasks/{id}"), ALICE, &[], None)
                .await
                .1,
        );
    }
    view.push(
        scall(s, Method::GET, &format!("/v1/runs/{run}"), ALICE, &[], None)
            .await
            .1,
    );
    view.push(
        scall(
            s,
            Method::GET,
            "/v1/scopes/s/unreleased-sources",
            ALICE,
            &[],
            None,
        )
        .await
        .1,
    );
    view
}

/// Subjects (issue 11 item 11): a key bound to a subject sees only that subject's tasks
/// and runs — every route of the router, another subject's rows answer 404 (or an empty
/// page, or 409 without details for a replayed key, or 403 for scope deletion) and change
/// nothing — while the app's own key and a service key that may assert subjects see the
/// whole app's. The task and the run say whose they are.
async fn subject_isolation_matrix(backend: &str) {
    let Some(s) = start_subjects(backend) else {
        return;
    };
    let alice_subject = json!({"type": "user", "id": "alice"});
    let task = |key: &str, source: &str| {
        json!({"kind": "classify", "scope": "s", "effect_key": key,
               "source": {"id": source, "revision": "v1"},
               "request": {"input": key, "labels": ["a", "b"]}})
    };
    let (st, q) = scall(
        &s,
        Method::POST,
        "/v1/tasks",
        ALICE,
        &[],
        Some(task("alice-q", "doc-a")),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{q}");
    assert_eq!(q["subject"], alice_subject, "the task says whose it is");
    let q = q["id"].as_str().unwrap().to_string();
    let (st, run) = scall(
        &s,
        Method::POST,
        "/v1/runs",
        ALICE,
        &[],
        Some(json!({"scope": "wf"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{run}");
    assert_eq!(run["subject"], alice_subject, "the run says whose it is");
    let r = run["id"].as_str().unwrap().to_string();
    let (st, rt) = scall(
        &s,
        Method::POST,
        "/v1/tasks",
        ALICE,
        &[],
        Some(
            json!({"kind": "generate_text", "run_id": r, "effect_key": "alice-r",
                    "request": {"prompt": "p"}}),
        ),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{rt}");
    assert_eq!(
        rt["subject"], alice_subject,
        "a run's task is its run's subject's"
    );
    let rt = rt["id"].as_str().unwrap().to_string();
    let (st, app_task) = scall(
        &s,
        Method::POST,
        "/v1/tasks",
        ACME,
        &[],
        Some(task("app-q", "doc-z")),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(app_task["subject"], Value::Null, "no subject: null");
    let pipeline = json!({"name": "pipe", "definition": {
        "steps": [{"key": "label", "kind": "classify",
                   "request": {"input": {"$from": "/input/text"}, "labels": ["a", "b"]}}],
        "output": {"label": "/steps/label/output"}}});
    let (st, _) = scall(
        &s,
        Method::POST,
        "/v1/pipelines",
        ALICE,
        &[],
        Some(pipeline.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let start = json!({"scope": "wf", "input": {"text": "x"}});
    let (st, prun) = scall(
        &s,
        Method::POST,
        "/v1/pipelines/pipe/runs",
        ALICE,
        &[("idempotency-key", "alice-start")],
        Some(start.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{prun}");
    let prun = prun["id"].as_str().unwrap().to_string();
    let tasks = [q.as_str(), rt.as_str()];
    let before = alice_view(&s, &tasks, &r).await;
    // (Not `r`: bob names alice's run himself below, and may see his own words again.)
    let secrets = [q.as_str(), rt.as_str(), prun.as_str(), "doc-a", "alice"];
    let reveals = |v: &Value| {
        let text = v.to_string();
        secrets
            .iter()
            .find(|x| text.contains(**x))
            .map(|x| x.to_string())
    };

    let mut covered: BTreeSet<(String, String)> = BTreeSet::new();
    let mut cover = |m: &Method, p: &str| covered.insert((m.to_string(), p.to_string()));
    for id in tasks {
        for path in [
            format!("/v1/tasks/{id}"),
            format!("/v1/tasks/{id}?wait=1s"),
            format!("/v1/tasks/{id}/events"),
        ] {
            let (st, e) = scall(&s, Method::GET, &path, BOB, &[], None).await;
            assert_eq!(
                (st, is_json_error(&e)),
                (StatusCode::NOT_FOUND, true),
                "{path}: {e}"
            );
        }
        let (st, e) = scall(
            &s,
            Method::POST,
            &format!("/v1/tasks/{id}/cancel"),
            BOB,
            &[],
            None,
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND, "cancel {id}: {e}");
    }
    cover(&Method::GET, "/v1/tasks/{id}");
    cover(&Method::GET, "/v1/tasks/{id}/events");
    cover(&Method::POST, "/v1/tasks/{id}/cancel");
    for path in [
        format!("/v1/runs/{r}"),
        format!("/v1/runs/{r}?wait=1s"),
        format!("/v1/runs/{prun}"),
    ] {
        let (st, e) = scall(&s, Method::GET, &path, BOB, &[], None).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{path}: {e}");
    }
    let (st, _) = scall(
        &s,
        Method::POST,
        &format!("/v1/runs/{r}/cancel"),
        BOB,
        &[],
        None,
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    cover(&Method::GET, "/v1/runs/{id}");
    cover(&Method::POST, "/v1/runs/{id}/cancel");
    for key in ["alice-q", "alice-r"] {
        let (st, _) = scall(
            &s,
            Method::GET,
            &format!("/v1/tasks?effect_key={key}"),
            BOB,
            &[],
            None,
        )
        .await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{key}");
    }
    let (st, _) = scall(
        &s,
        Method::POST,
        "/v1/tasks/release",
        BOB,
        &[],
        Some(json!({"effect_key": "alice-q", "scope": "s"})),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "release alice's task");
    cover(&Method::GET, "/v1/tasks");
    cover(&Method::POST, "/v1/tasks/release");
    // Replaying alice's effect key, even with her exact body, shows nothing of her task.
    let (st, e) = scall(
        &s,
        Method::POST,
        "/v1/tasks",
        BOB,
        &[],
        Some(task("alice-q", "doc-a")),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{e}");
    assert_eq!(reveals(&e), None, "{e}");
    let (st, e) = scall(
        &s,
        Method::POST,
        "/v1/tasks",
        BOB,
        &[],
        Some(
            json!({"kind": "generate_text", "run_id": r, "effect_key": "bob-in-alice-run",
                    "request": {"prompt": "p"}}),
        ),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "a task in alice's run: {e}");
    cover(&Method::POST, "/v1/tasks");
    let (st, b) = scall(
        &s,
        Method::POST,
        "/v1/tasks/batch",
        BOB,
        &[],
        Some(json!({"tasks": [
            task("alice-q", "doc-a"),
            {"kind": "generate_text", "run_id": r, "effect_key": "bob-b1", "request": {"prompt": "p"}},
            task("bob-own", "doc-b"),
        ]})),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["results"][0]["status"], json!(409), "{b}");
    assert_eq!(b["results"][1]["status"], json!(404), "{b}");
    assert_eq!(b["results"][2]["status"], json!(201), "{b}");
    assert_eq!(reveals(&b), None, "{b}");
    cover(&Method::POST, "/v1/tasks/batch");
    let (st, u) = scall(
        &s,
        Method::GET,
        "/v1/scopes/s/unreleased-sources",
        BOB,
        &[],
        None,
    )
    .await;
    assert_eq!(
        (st, u["sources"].clone()),
        (StatusCode::OK, json!([{"scope": "s", "source": "doc-b"}]))
    );
    let (st, u) = scall(
        &s,
        Method::GET,
        "/v1/scopes/s/unreleased-sources",
        ALICE,
        &[],
        None,
    )
    .await;
    assert_eq!(
        (st, u["sources"].clone()),
        (StatusCode::OK, json!([{"scope": "s", "source": "doc-a"}]))
    );
    cover(&Method::GET, "/v1/scopes/{scope}/unreleased-sources");
    let (st, e) = scall(&s, Method::DELETE, "/v1/scopes/s/tasks", BOB, &[], None).await;
    assert_eq!(
        (st, e["error"]["code"].clone()),
        (StatusCode::FORBIDDEN, json!("subject_not_allowed")),
        "{e}"
    );
    cover(&Method::DELETE, "/v1/scopes/{scope}/tasks");
    let (st, own) = scall(
        &s,
        Method::POST,
        "/v1/runs",
        BOB,
        &[],
        Some(json!({"scope": "wf"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(own["subject"], json!({"type": "user", "id": "bob"}));
    cover(&Method::POST, "/v1/runs");
    // Pipeline definitions belong to the app; runs to their subject.
    let (st, _) = scall(&s, Method::POST, "/v1/pipelines", BOB, &[], Some(pipeline)).await;
    assert_eq!(st, StatusCode::OK, "the app has this version already");
    let (st, _) = scall(&s, Method::GET, "/v1/pipelines/pipe", BOB, &[], None).await;
    assert_eq!(st, StatusCode::OK);
    let (st, e) = scall(
        &s,
        Method::POST,
        "/v1/pipelines/pipe/runs",
        BOB,
        &[("idempotency-key", "alice-start")],
        Some(start),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{e}");
    assert_eq!(reveals(&e), None, "{e}");
    cover(&Method::POST, "/v1/pipelines");
    cover(&Method::GET, "/v1/pipelines/{name}");
    cover(&Method::POST, "/v1/pipelines/{name}/runs");
    // Listings (docs/conformance.md#listings): bob lists his own tasks and runs only; the app-wide
    // aggregates (scopes, stats) are refused to a key bound to a subject.
    let (st, page) = scall(&s, Method::GET, "/v1/tasks?limit=500", BOB, &[], None).await;
    assert_eq!(st, StatusCode::OK, "{page}");
    for t in page["tasks"].as_array().unwrap() {
        assert_eq!(t["subject"], json!({"type": "user", "id": "bob"}), "{t}");
    }
    let (st, runs) = scall(&s, Method::GET, "/v1/runs", BOB, &[], None).await;
    assert_eq!(st, StatusCode::OK, "{runs}");
    assert!(
        !runs["runs"].as_array().unwrap().is_empty(),
        "bob's own run: {runs}"
    );
    for run in runs["runs"].as_array().unwrap() {
        assert_eq!(
            run["subject"],
            json!({"type": "user", "id": "bob"}),
            "{run}"
        );
    }
    let (st, pipes) = scall(&s, Method::GET, "/v1/pipelines", BOB, &[], None).await;
    assert_eq!(
        (st, pipes["pipelines"][0]["name"].clone()),
        (StatusCode::OK, json!("pipe"))
    );
    for path in [
        "/v1/scopes",
        "/v1/scopes/s",
        "/v1/stats",
        "/v1/scopes/s/usage",
        "/v1/usage",
    ] {
        let (st, e) = scall(&s, Method::GET, path, BOB, &[], None).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{path}: {e}");
        assert_eq!(reveals(&e), None, "{e}");
    }
    let (st, page) = scall(&s, Method::GET, "/v1/tasks?limit=500", ALICE, &[], None).await;
    assert_eq!(st, StatusCode::OK);
    let ids: Vec<&str> = page["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|t| t["id"].as_str())
        .collect();
    assert!(ids.contains(&q.as_str()), "alice lists her own: {page}");
    let (st, all) = scall(&s, Method::GET, "/v1/stats", ACME, &[], None).await;
    assert_eq!(st, StatusCode::OK, "the app's key reads the stats: {all}");
    for path in [
        "/v1/runs",
        "/v1/pipelines",
        "/v1/scopes",
        "/v1/scopes/{scope}",
        "/v1/stats",
        "/v1/scopes/{scope}/usage",
        "/v1/usage",
    ] {
        cover(&Method::GET, path);
    }
    for path in [
        "/v1/kinds",
        "/v1/models",
        "/openapi.json",
        "/healthz",
        "/readyz",
        "/metrics",
        "/",
        "/ui",
        "/ui/",
        "/ui/{file}",
    ] {
        let (st, body) = scall(
            &s,
            Method::GET,
            &path.replace("{file}", "pages.js"),
            BOB,
            &[],
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK, "{path}");
        let text = body.to_string();
        for secret in [q.as_str(), rt.as_str(), r.as_str(), "doc-a"] {
            assert!(!text.contains(secret), "{path} shows alice's {secret}");
        }
        cover(&Method::GET, path);
    }
    // Webhooks belong to the whole app: a key bound to a subject manages none (403).
    for (method, path, body) in [
        (
            Method::POST,
            "/v1/webhooks",
            Some(json!({"url": "https://hooks.invalid/bob", "events": ["task.failed"]})),
        ),
        (Method::GET, "/v1/webhooks", None),
        (Method::GET, "/v1/webhooks/{id}", None),
        (
            Method::PATCH,
            "/v1/webhooks/{id}",
            Some(json!({"enabled": false})),
        ),
        (Method::DELETE, "/v1/webhooks/{id}", None),
        (Method::GET, "/v1/webhooks/{id}/deliveries", None),
        (
            Method::POST,
            "/v1/webhooks/{id}/deliveries/{delivery}/replay",
            None,
        ),
    ] {
        let concrete = path.replace("{id}", "whe_x").replace("{delivery}", "whd_x");
        let (st, e) = scall(&s, method.clone(), &concrete, BOB, &[], body).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{method} {path}: {e}");
        assert_eq!(reveals(&e), None, "{e}");
        cover(&method, path);
    }
    let routes = routes_in_router();
    let missing: Vec<_> = routes.difference(&covered).cloned().collect();
    assert!(
        missing.is_empty(),
        "routes the subject matrix misses: {missing:?}"
    );
    assert_eq!(
        alice_view(&s, &tasks, &r).await,
        before,
        "nothing alice sees changed"
    );

    // The app's key and a service key (even asserting bob) see the whole app's.
    for (key, headers) in [
        (ACME, vec![]),
        (SERVICE, vec![]),
        (SERVICE, vec![("x-tollgate-subject", "user:bob")]),
    ] {
        let (st, t) = scall(
            &s,
            Method::GET,
            &format!("/v1/tasks/{q}"),
            key,
            &headers,
            None,
        )
        .await;
        assert_eq!((st, &t["subject"]), (StatusCode::OK, &alice_subject), "{t}");
        let (st, _) = scall(
            &s,
            Method::GET,
            "/v1/tasks?effect_key=alice-r",
            key,
            &headers,
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let (st, _) = scall(
            &s,
            Method::GET,
            &format!("/v1/runs/{r}"),
            key,
            &headers,
            None,
        )
        .await;
        assert_eq!(st, StatusCode::OK);
        let (st, u) = scall(
            &s,
            Method::GET,
            "/v1/scopes/s/unreleased-sources",
            key,
            &headers,
            None,
        )
        .await;
        assert_eq!(
            (st, u["sources"].as_array().unwrap().len()),
            (StatusCode::OK, 3),
            "{u}"
        );
    }
    let (st, _) = scall(
        &s,
        Method::GET,
        "/v1/tasks?effect_key=app-q",
        ALICE,
        &[],
        None,
    )
    .await;
    assert_eq!(
        st,
        StatusCode::NOT_FOUND,
        "a subject's key does not see the app's own tasks"
    );
    // Alice can still act on her own rows.
    let (st, t) = scall(
        &s,
        Method::POST,
        &format!("/v1/tasks/{q}/cancel"),
        ALICE,
        &[],
        None,
    )
    .await;
    assert_eq!((st, &t["status"]), (StatusCode::OK, &json!("canceled")));
    let (st, _) = scall(
        &s,
        Method::POST,
        "/v1/tasks/release",
        ALICE,
        &[],
        Some(json!({"effect_key": "alice-q", "scope": "s"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    let (st, d) = scall(&s, Method::DELETE, "/v1/scopes/s/tasks", SERVICE, &[], None).await;
    assert_eq!((st, d["deleted"].clone()), (StatusCode::OK, json!(3)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_isolation_matrix_sqlite() {
    subject_isolation_matrix("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subject_isolation_matrix_postgres() {
    subject_isolation_matrix("postgres").await;
}
