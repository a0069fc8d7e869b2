//! Input the server must refuse or read one way only (issue 11, items 4, 7, 9 and 10),
//! against the real `tollgate serve` binary on SQLite and (with
//! `TOLLGATE_TEST_DATABASE_URL`) on PostgreSQL; every answer must be the same on both:
//! - NUL bytes and other characters no identifier may hold are refused before SQL, and a
//!   500 never shows the database's text (it names a request id, also in `x-request-id`);
//! - keyset paging gives no `next` on the last page, even when that page is full;
//! - duplicate JSON keys at any depth, repeated `Idempotency-Key`/`Authorization`
//!   headers, unknown query parameters and `?wait=` where it does nothing are refused with
//!   a 400 naming them; `GET /v1/tasks/{id}?wait=` long-polls;
//! - one identifier rule, the same through headers and bodies (UTF-8 accepted; bidi,
//!   zero-width, control characters and surrounding whitespace refused).

use reqwest::StatusCode;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

mod common;
use common::Server;

const ACME: &str = "acme-key-0123456789abcdef";

fn config_text(database_url: &str) -> String {
    format!(
        r#"
[server]
max_wait = "20s"

[database]
url = "{database_url}"

[models.default]
provider = "dev"
model = "dev-1"

[models.slow]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 1500 }}

[budgets.standard]
max_steps_per_source = 50
sources_per_24_hours = 10000
scope_concurrent = 1000
burst = 1000
tasks_per_minute = 60000

[apps.acme]
api_keys = ["{ACME}"]
default_budget = "standard"
allowed_budgets = ["standard"]

[workers]
concurrency = 2
"#
    )
}

fn start(backend: &str) -> Option<Server> {
    common::start(backend, "input", config_text)
}

/// One call: headers are raw bytes (so UTF-8 and repeated headers can be sent).
async fn call(
    s: &Server,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &[u8])],
    body: Option<Vec<u8>>,
) -> (StatusCode, HeaderMap, Value) {
    let mut map = HeaderMap::new();
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
    {
        map.append(
            "authorization",
            HeaderValue::from_str(&format!("Bearer {ACME}")).unwrap(),
        );
    }
    for (k, v) in headers {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).unwrap(),
            HeaderValue::from_bytes(v).unwrap(),
        );
    }
    let mut rb = s
        .http
        .request(method, format!("{}{path}", s.base))
        .headers(map);
    if let Some(b) = body {
        rb = rb.header("content-type", "application/json").body(b);
    }
    let r = rb.send().await.expect("the server answers");
    let status = r.status();
    let headers = r.headers().clone();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(s: &Server, path: &str) -> (StatusCode, Value) {
    let (st, _, v) = call(s, reqwest::Method::GET, path, &[], None).await;
    (st, v)
}

async fn post(s: &Server, path: &str, body: &Value) -> (StatusCode, Value) {
    let (st, _, v) = call(
        s,
        reqwest::Method::POST,
        path,
        &[],
        Some(serde_json::to_vec(body).unwrap()),
    )
    .await;
    (st, v)
}

async fn post_text(s: &Server, path: &str, body: &str) -> (StatusCode, Value) {
    let (st, _, v) = call(
        s,
        reqwest::Method::POST,
        path,
        &[],
        Some(body.as_bytes().to_vec()),
    )
    .await;
    (st, v)
}

fn message(e: &Value) -> String {
    assert!(
        e["error"]["code"].is_string() && e["error"]["message"].is_string(),
        "a JSON error: {e}"
    );
    e["error"]["message"].as_str().unwrap().to_string()
}

fn classify(key: &str, scope: &str) -> Value {
    json!({"kind": "classify", "scope": scope, "effect_key": key,
           "request": {"input": "x", "labels": ["a", "b"]}})
}

const PIPELINE: &str = r#"{"name": "p1", "definition": {"steps": [{"key": "label", "kind": "classify",
    "request": {"input": {"$from": "/input/text"}, "labels": ["a", "b"]}}],
    "output": {"label": "/steps/label/output"}}}"#;

/// Item 4: NUL bytes (and every other character no identifier may hold) in any string
/// that would reach SQL are refused with a 4xx naming the field, the same on both
/// backends, and nothing reaches the database.
async fn nul_bytes_are_refused_before_sql(backend: &str) {
    let Some(s) = start(backend) else { return };
    let (st, p) = post_text(&s, "/v1/pipelines", PIPELINE).await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    let (st, e) = get(&s, "/v1/pipelines/p1?version=%00").await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(message(&e).contains("version"), "{e}");
    let (st, e) = post(
        &s,
        "/v1/pipelines/p1/runs",
        &json!({"scope": "s", "version": "\u{0}", "input": {"text": "x"}}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(message(&e).contains("version"), "{e}");
    let (st, e) = post(
        &s,
        "/v1/pipelines/p1/runs",
        &json!({"scope": "s\u{0}", "input": {"text": "x"}}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    // Query parameters, path segments and body fields.
    for (path, field) in [
        ("/v1/scopes/s/unreleased-sources?step=%00", "step"),
        ("/v1/scopes/s/unreleased-sources?after=a%00", "source.id"),
        ("/v1/scopes/s%00/unreleased-sources", "scope"),
    ] {
        let (st, e) = get(&s, path).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {e}");
        assert!(message(&e).contains(field), "{path}: {e}");
    }
    let (st, _, e) = call(
        &s,
        reqwest::Method::DELETE,
        "/v1/scopes/s/tasks?source=%00",
        &[],
        None,
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    for (body, field) in [
        (
            json!({"kind": "classify", "scope": "s\u{0}", "effect_key": "n1", "request": {"input": "x", "labels": ["a", "b"]}}),
            "scope",
        ),
        (
            json!({"kind": "classify", "scope": "s", "effect_key": "n\u{0}", "request": {"input": "x", "labels": ["a", "b"]}}),
            "effect_key",
        ),
        (
            json!({"kind": "classify", "scope": "s", "step": "\u{0}", "effect_key": "n2", "request": {"input": "x", "labels": ["a", "b"]}}),
            "step",
        ),
        (
            json!({"kind": "classify", "scope": "s", "effect_key": "n3", "source": {"id": "d", "revision": "\u{0}"}, "request": {"input": "x", "labels": ["a", "b"]}}),
            "source.revision",
        ),
        (
            json!({"kind": "classify", "scope": "s", "effect_key": "n4", "model": "\u{0}", "request": {"input": "x", "labels": ["a", "b"]}}),
            "model",
        ),
    ] {
        let (st, e) = post(&s, "/v1/tasks", &body).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {e}");
        assert!(message(&e).contains(field), "{field}: {e}");
    }
    let (st, e) = post(
        &s,
        "/v1/tasks/release",
        &json!({"scope": "s", "effect_key": "\u{0}"}),
    )
    .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    let (st, e) = post(&s, "/v1/runs", &json!({"scope": "\u{0}"})).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    // NUL inside request text is data, not an identifier: stored and read back as sent.
    let (st, t) = post(
        &s,
        "/v1/tasks",
        &json!({"kind": "generate_text", "scope": "s", "effect_key": "nul-data", "request": {"prompt": "a\u{0}b"}}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{t}");
}

/// Item 4: a request id on every answer; a 500 names it and never carries the
/// database's text (PostgreSQL only: the test breaks the schema under the server).
async fn a_500_shows_a_request_id_not_the_database(backend: &str) {
    let Some(s) = start(backend) else { return };
    let mut ids = std::collections::BTreeSet::new();
    for path in [
        "/healthz",
        "/v1/kinds",
        "/v1/no-such-route",
        "/v1/tasks/nope",
    ] {
        let (_, h, _) = call(&s, reqwest::Method::GET, path, &[], None).await;
        let id = h["x-request-id"].to_str().unwrap().to_string();
        assert!(id.len() >= 16, "{path}: {id}");
        assert!(ids.insert(id), "one id per request");
    }
    let Some((url, schema)) = s.schema.clone() else {
        return;
    };
    common::psql(
        &url,
        &format!("ALTER TABLE \"{schema}\".pipelines RENAME TO pipelines_gone"),
    );
    let (st, h, e) = call(&s, reqwest::Method::GET, "/v1/pipelines/p1", &[], None).await;
    common::psql(
        &url,
        &format!("ALTER TABLE \"{schema}\".pipelines_gone RENAME TO pipelines"),
    );
    assert_eq!(st, StatusCode::INTERNAL_SERVER_ERROR, "{e}");
    let text = message(&e);
    let id = h["x-request-id"].to_str().unwrap();
    assert!(text.contains(id), "the message names the request id: {e}");
    for leak in ["pipelines", "relation", "does not exist", "SELECT", "42P01"] {
        assert!(!text.contains(leak), "database text {leak:?} in {e}");
    }
}

/// Item 7: exactly two full pages of unreleased sources: page 2 has no `next`.
async fn the_last_full_page_has_no_next(backend: &str) {
    let Some(s) = start(backend) else { return };
    for half in 0..2 {
        let tasks: Vec<Value> = (0..100)
            .map(|i| {
                let n = half * 100 + i;
                json!({"kind": "classify", "scope": "pages", "effect_key": format!("p{n}"),
                       "source": {"id": format!("doc{n:03}"), "revision": "1"},
                       "request": {"input": format!("x{n}"), "labels": ["a", "b"]}})
            })
            .collect();
        let (st, b) = post(&s, "/v1/tasks/batch", &json!({ "tasks": tasks })).await;
        assert_eq!(st, StatusCode::OK, "{b}");
        for r in b["results"].as_array().unwrap() {
            assert_eq!(r["status"], json!(201), "{r}");
        }
    }
    let (st, p1) = get(&s, "/v1/scopes/pages/unreleased-sources").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(p1["sources"].as_array().unwrap().len(), 100);
    let next = p1["next"].as_str().expect("page 1 has a next").to_string();
    assert_eq!(next, "doc099");
    let (st, p2) = get(
        &s,
        &format!("/v1/scopes/pages/unreleased-sources?after={next}"),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(p2["sources"].as_array().unwrap().len(), 100);
    assert_eq!(p2["sources"][99]["source"], json!("doc199"));
    assert!(p2.get("next").is_none(), "the last page has no next: {p2}");
}

/// Item 9: ambiguous input is refused with a 400 naming it.
async fn ambiguous_input_is_refused(backend: &str) {
    let Some(s) = start(backend) else { return };
    // Duplicate keys: top level, inside `request`, deep inside a schema, in a batch item,
    // in a pipeline definition.
    for (body, named) in [
        (
            r#"{"kind":"classify","scope":"s","scope":"t","effect_key":"d0","request":{"input":"a","labels":["x","y"]}}"#,
            "\"scope\"",
        ),
        (
            r#"{"kind":"classify","scope":"s","effect_key":"d1","request":{"input":"a","input":"b","labels":["x","y"]}}"#,
            "\"input\" at request",
        ),
        (
            r#"{"kind":"extract_data","scope":"s","effect_key":"d2","request":{"input":"a","schema":{"type":"object","properties":{"n":{"type":"string","type":"integer"}}}}}"#,
            "\"type\" at request.schema.properties.n",
        ),
    ] {
        let (st, e) = post_text(&s, "/v1/tasks", body).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{body}: {e}");
        let m = message(&e);
        assert!(m.contains("duplicate key") && m.contains(named), "{m}");
    }
    for key in ["d0", "d1", "d2"] {
        let (st, _) = get(&s, &format!("/v1/tasks?effect_key={key}")).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{key}: nothing stored");
    }
    let (st, e) = post_text(
        &s,
        "/v1/tasks/batch",
        r#"{"tasks":[{"kind":"classify","scope":"s","effect_key":"b1","request":{"input":"a","labels":["x"],"labels":["y"]}}]}"#,
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert!(message(&e).contains("tasks[0].request"), "{e}");
    let (st, e) = post_text(
        &s,
        "/v1/pipelines",
        &PIPELINE.replace(
            r#""kind": "classify","#,
            r#""kind": "classify", "key": "again","#,
        ),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert!(message(&e).contains("definition.steps[0]"), "{e}");

    // Repeated headers.
    let body = serde_json::to_vec(&classify("h1", "s")).unwrap();
    let (st, _, e) = call(
        &s,
        reqwest::Method::POST,
        "/v1/tasks",
        &[("idempotency-key", b"h1"), ("idempotency-key", b"h2")],
        Some(body.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert!(
        message(&e).to_lowercase().contains("idempotency-key"),
        "{e}"
    );
    let bearer = format!("Bearer {ACME}");
    let (st, _, e) = call(
        &s,
        reqwest::Method::GET,
        "/v1/kinds",
        &[
            ("authorization", bearer.as_bytes()),
            ("authorization", b"Bearer someone-elses-key-0123"),
        ],
        None,
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert!(message(&e).to_lowercase().contains("authorization"), "{e}");

    // Unknown query parameters, on every route.
    let (st, t) = post(&s, "/v1/tasks", &classify("q1", "s")).await;
    assert_eq!(st, StatusCode::CREATED, "{t}");
    let task = t["id"].as_str().unwrap().to_string();
    let (st, run) = post(&s, "/v1/runs", &json!({"scope": "s"})).await;
    assert_eq!(st, StatusCode::CREATED, "{run}");
    let run = run["id"].as_str().unwrap().to_string();
    let get_routes = [
        "/v1/tasks?effect_key=q1".to_string(),
        format!("/v1/tasks/{task}"),
        "/v1/scopes/s/unreleased-sources".to_string(),
        format!("/v1/runs/{run}"),
        "/v1/pipelines/p1".to_string(),
        "/v1/kinds".to_string(),
        "/v1/models".to_string(),
        "/openapi.json".to_string(),
        "/healthz".to_string(),
        "/readyz".to_string(),
        "/metrics".to_string(),
    ];
    for path in get_routes {
        let sep = if path.contains('?') { '&' } else { '?' };
        let (st, e) = get(&s, &format!("{path}{sep}wiat=30s")).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{path}: {e}");
        assert!(message(&e).contains("wiat"), "{path}: {e}");
    }
    for (method, path, body) in [
        (
            reqwest::Method::POST,
            "/v1/tasks".to_string(),
            classify("q2", "s"),
        ),
        (
            reqwest::Method::POST,
            "/v1/tasks/batch".to_string(),
            json!({"tasks": []}),
        ),
        (
            reqwest::Method::POST,
            "/v1/tasks/release".to_string(),
            json!({"scope": "s", "effect_key": "q1"}),
        ),
        (
            reqwest::Method::POST,
            format!("/v1/tasks/{task}/cancel"),
            json!({}),
        ),
        (
            reqwest::Method::DELETE,
            "/v1/scopes/s/tasks".to_string(),
            json!({}),
        ),
        (
            reqwest::Method::POST,
            "/v1/runs".to_string(),
            json!({"scope": "s"}),
        ),
        (
            reqwest::Method::POST,
            format!("/v1/runs/{run}/cancel"),
            json!({}),
        ),
        (
            reqwest::Method::POST,
            "/v1/pipelines".to_string(),
            serde_json::from_str(PIPELINE).unwrap(),
        ),
        (
            reqwest::Method::POST,
            "/v1/pipelines/p1/runs".to_string(),
            json!({"scope": "s", "input": {"text": "x"}}),
        ),
    ] {
        let (st, _, e) = call(
            &s,
            method.clone(),
            &format!("{path}?wiat=30s"),
            &[],
            Some(serde_json::to_vec(&body).unwrap()),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{method} {path}: {e}");
        assert!(message(&e).contains("wiat"), "{method} {path}: {e}");
    }
    let (st, _) = get(&s, "/v1/tasks?effect_key=q2").await;
    assert_eq!(
        st,
        StatusCode::NOT_FOUND,
        "the refused submit stored nothing"
    );
    let (st, t) = get(&s, &format!("/v1/tasks/{task}")).await;
    assert_ne!(
        t["status"],
        json!("canceled"),
        "the refused cancel did nothing"
    );
    assert_eq!(st, StatusCode::OK);
    // `?wait=` where it does nothing.
    let (st, e) = post(
        &s,
        "/v1/tasks/batch?wait=5s",
        &json!({"tasks": [classify("q3", "s")]}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert!(message(&e).contains("wait"), "{e}");
    let (st, _) = get(&s, "/v1/tasks?effect_key=q3").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

/// Item 9: `GET /v1/tasks/{id}?wait=` long-polls like submit's `wait` (same syntax, same
/// cap, same answer).
async fn get_task_wait_long_polls(backend: &str) {
    let Some(s) = start(backend) else { return };
    let (st, t) = post(
        &s,
        "/v1/tasks",
        &json!({"kind": "generate_text", "scope": "s", "effect_key": "slow", "model": "slow",
                "request": {"prompt": "p"}}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{t}");
    let id = t["id"].as_str().unwrap();
    let (st, e) = get(&s, &format!("/v1/tasks/{id}?wait=soon")).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    let (st, t) = get(&s, &format!("/v1/tasks/{id}?wait=0")).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        matches!(t["status"].as_str(), Some("queued" | "running")),
        "{t}"
    );
    let started = Instant::now();
    let (st, t) = get(&s, &format!("/v1/tasks/{id}?wait=15s")).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(t["status"], json!("succeeded"), "{t}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let (st, e) = get(&s, &format!("/v1/tasks/{}?wait=1s", uuid::Uuid::now_v7())).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
}

/// Item 10: one identifier rule through headers and bodies.
async fn one_identifier_rule_for_headers_and_bodies(backend: &str) {
    let Some(s) = start(backend) else { return };
    // A UTF-8 Idempotency-Key header is accepted, and is the same key as in the body.
    let key = "clé-ü-日本";
    let body = serde_json::to_vec(&json!({"kind": "classify", "scope": "s",
        "request": {"input": "x", "labels": ["a", "b"]}}))
    .unwrap();
    let (st, _, first) = call(
        &s,
        reqwest::Method::POST,
        "/v1/tasks",
        &[("idempotency-key", key.as_bytes())],
        Some(body.clone()),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{first}");
    assert_eq!(first["effect_key"], json!(key));
    let (st, again) = post(
        &s,
        "/v1/tasks",
        &json!({"kind": "classify", "scope": "s", "effect_key": key,
                "request": {"input": "x", "labels": ["a", "b"]}}),
    )
    .await;
    assert_eq!((st, &again["id"]), (StatusCode::OK, &first["id"]));
    let (st, _, again) = call(
        &s,
        reqwest::Method::POST,
        "/v1/tasks",
        &[("idempotency-key", key.as_bytes())],
        Some(body.clone()),
    )
    .await;
    assert_eq!((st, &again["id"]), (StatusCode::OK, &first["id"]));
    // Look-alikes, invisible characters and blank values are refused everywhere.
    let bad = [
        "s\u{202E}",
        "\u{200B}s",
        "s\u{200F}",
        "\u{FEFF}s",
        "s\u{2066}",
        " ",
        "s ",
        " s",
        "",
        "s\u{7}",
    ];
    for (i, v) in bad.iter().enumerate() {
        for field in ["scope", "effect_key", "step"] {
            let mut b = json!({"kind": "classify", "scope": "s", "effect_key": format!("id-{field}-{i}"),
                               "request": {"input": "x", "labels": ["a", "b"]}});
            b[field] = json!(v);
            let (st, e) = post(&s, "/v1/tasks", &b).await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{field}={v:?}: {e}");
            assert!(message(&e).contains(field), "{field}={v:?}: {e}");
        }
        let b = json!({"kind": "classify", "scope": "s", "effect_key": format!("src-{i}"),
                       "source": {"id": v, "revision": "1"},
                       "request": {"input": "x", "labels": ["a", "b"]}});
        let (st, e) = post(&s, "/v1/tasks", &b).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "source.id={v:?}: {e}");
        assert!(message(&e).contains("source.id"), "{e}");
        // Spaces around a header value are HTTP syntax (RFC 9110 strips them), not part
        // of the key: "s " in a header is the key "s".
        let http_trimmed = v.trim_matches([' ', '\t']);
        // (ASCII control bytes cannot be sent in a header at all.)
        let sendable = !v.bytes().any(|b| b < 0x20 || b == 0x7f);
        if sendable && !v.is_empty() && (http_trimmed == *v || http_trimmed.is_empty()) {
            let (st, _, e) = call(
                &s,
                reqwest::Method::POST,
                "/v1/tasks",
                &[("idempotency-key", v.as_bytes())],
                Some(body.clone()),
            )
            .await;
            assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "header {v:?}: {e}");
            assert!(message(&e).contains("Idempotency-Key"), "{e}");
        }
        let (st, e) = post(&s, "/v1/runs", &json!({"scope": v})).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "run scope {v:?}: {e}");
    }
    // The length cap is in characters (as JSON Schema's maxLength): 256 fit, 257 do not.
    let (st, e) = post(&s, "/v1/tasks", &classify(&"é".repeat(256), "s")).await;
    assert_eq!(st, StatusCode::CREATED, "{e}");
    let (st, e) = post(&s, "/v1/tasks", &classify(&"é".repeat(257), "s")).await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(message(&e).contains("256 characters"), "{e}");
    // A header that is not UTF-8 is refused.
    let (st, _, e) = call(
        &s,
        reqwest::Method::POST,
        "/v1/tasks",
        &[("idempotency-key", &[0xff, 0xfe])],
        Some(body),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
}

macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name("sqlite").await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name("postgres").await } )*
        }
    };
}

on_both_backends!(
    nul_bytes_are_refused_before_sql,
    a_500_shows_a_request_id_not_the_database,
    the_last_full_page_has_no_next,
    ambiguous_input_is_refused,
    get_task_wait_long_polls,
    one_identifier_rule_for_headers_and_bodies,
);
