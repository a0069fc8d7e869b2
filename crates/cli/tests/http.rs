//! End to end: the real `tollgate serve` binary on a free 127.0.0.1 port, driven over HTTP
//! like a user would, on SQLite and (with `TOLLGATE_TEST_DATABASE_URL`) on PostgreSQL.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::process::Command;
use std::time::{Duration, Instant};
use tollgate_core::{TaskKind, ValidatedRequest};

mod common;
use common::Server;

const ACME: &str = "acme-key-0123456789abcdef";
const BETA: &str = "beta-key-0123456789abcdef";
const ACME_ASSERTS: &str = "acme-asserting-key-0123456789";
/// Requests above this many stored bytes are refused (small, so the limit is cheap to hit).
const LIMIT: usize = 2000;

fn config_text(database_url: &str) -> String {
    format!(
        r#"
[server]
max_request_bytes = {LIMIT}
max_wait = "20s"

[database]
url = "{database_url}"

[models.default]
provider = "dev"
model = "dev-1"

[models.slow]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 30000 }}

[budgets.standard]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 100
tasks_per_minute = 600

[budgets.tight]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 2
tasks_per_minute = 1

[budgets.secret]
max_steps_per_source = 1
sources_per_24_hours = 1
scope_concurrent = 1
burst = 1
tasks_per_minute = 1

[apps.acme]
api_keys = ["{ACME}", {{ key = "{ACME_ASSERTS}", subject = "service:backend", may_assert_subject = true }}]
default_budget = "standard"
allowed_budgets = ["standard", "tight"]

[apps.beta]
api_keys = ["{BETA}"]
default_budget = "standard"
allowed_budgets = ["standard"]

[workers]
concurrency = 4
heartbeat_interval = "200ms"

[sweeper]
interval = "500ms"
"#
    )
}

async fn start(backend: &str) -> Option<Server> {
    common::start(backend, "http", config_text)
}

impl Server {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut rb = self.http.request(method, format!("{}{path}", self.base));
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
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

    async fn post(
        &self,
        path: &str,
        key: &str,
        effect_key: Option<&str>,
        body: &Value,
    ) -> (StatusCode, Value) {
        let headers: Vec<(&str, &str)> = effect_key
            .map(|k| ("idempotency-key", k))
            .into_iter()
            .collect();
        let (s, _, v) = self
            .call(
                reqwest::Method::POST,
                path,
                Some(key),
                &headers,
                Some(serde_json::to_vec(body).unwrap()),
            )
            .await;
        (s, v)
    }

    async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        let (s, _, v) = self
            .call(reqwest::Method::GET, path, Some(key), &[], None)
            .await;
        (s, v)
    }

    async fn wait_terminal(&self, id: &str, key: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (s, t) = self.get(&format!("/v1/tasks/{id}"), key).await;
            assert_eq!(s, StatusCode::OK, "{t}");
            if matches!(
                t["status"].as_str(),
                Some("succeeded" | "failed" | "canceled")
            ) {
                return t;
            }
            assert!(Instant::now() < deadline, "task {id} never finished: {t}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn classify(input: &str) -> Value {
    json!({"input": input, "labels": ["spam", "ham"]})
}

fn scoped(scope: &str, source: &str, request: Value) -> Value {
    json!({"kind": "classify", "scope": scope, "source": {"id": source, "revision": "v1"}, "request": request})
}

async fn lifecycle(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    // Create (201), read back by id and by effect key, wait for the worker.
    let body = scoped("customer-42", "msg-1", classify("Win a free cruise!"));
    let (st, t) = s.post("/v1/tasks", ACME, Some("e-1"), &body).await;
    assert_eq!(st, StatusCode::CREATED, "{t}");
    assert_eq!(t["created"], json!(true));
    assert_eq!(t["step"], json!("classify"), "step defaults to the kind");
    assert_eq!(t["model"], json!("default"));
    let id = t["id"].as_str().unwrap().to_string();
    let (st, by_key) = s.get("/v1/tasks?effect_key=e-1", ACME).await;
    assert_eq!(
        (st, by_key["id"].as_str()),
        (StatusCode::OK, Some(id.as_str()))
    );
    let done = s.wait_terminal(&id, ACME).await;
    assert_eq!(done["status"], json!("succeeded"), "{done}");
    let label = done["output"]["label"].as_str().unwrap();
    assert!(["spam", "ham"].contains(&label));
    assert!(done["usage"]["input_tokens"].as_u64().is_some());
    assert!(done["completed_at"].is_string());

    // Same key, same body (keys in another order): the existing task, 200.
    let reordered = json!({"request": {"labels": ["spam", "ham"], "input": "Win a free cruise!"},
        "source": {"revision": "v1", "id": "msg-1"}, "scope": "customer-42", "kind": "classify"});
    let (st, t) = s.post("/v1/tasks", ACME, Some("e-1"), &reordered).await;
    assert_eq!(
        (st, t["created"].clone(), t["id"].as_str()),
        (StatusCode::OK, json!(false), Some(id.as_str()))
    );
    // Same key, another body: 409.
    let (st, e) = s
        .post(
            "/v1/tasks",
            ACME,
            Some("e-1"),
            &scoped("customer-42", "msg-1", classify("other")),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{e}");
    assert_eq!(e["error"]["code"], json!("idempotency_key_conflict"));
    // The same request under a new key is a cache hit: a new succeeded task, 200.
    let (st, hit) = s.post("/v1/tasks", ACME, Some("e-2"), &body).await;
    assert_eq!(st, StatusCode::OK, "{hit}");
    assert_eq!(
        (
            hit["cached"].clone(),
            hit["created"].clone(),
            hit["status"].clone()
        ),
        (json!(true), json!(true), json!("succeeded"))
    );
    assert_eq!(hit["output"], done["output"]);
    // ?wait answers once terminal.
    let (st, waited) = s
        .post(
            "/v1/tasks?wait=15s",
            ACME,
            Some("e-3"),
            &scoped("customer-42", "msg-3", classify("hello")),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_eq!(waited["status"], json!("succeeded"), "{waited}");
    // effect_key in the body works too.
    let mut with_field = scoped("customer-42", "msg-4", classify("field"));
    with_field["effect_key"] = json!("e-4");
    let (st, _) = s.post("/v1/tasks", ACME, None, &with_field).await;
    assert_eq!(st, StatusCode::CREATED);

    // Every kind runs end to end on the dev provider.
    let kinds = [
        json!({"kind": "generate_text", "scope": "k", "request": {"prompt": "Say hi"}}),
        json!({"kind": "classify_many", "scope": "k", "request": {"items": [{"id": "a", "input": "x"}, {"id": "b", "input": "y"}], "labels": ["p", "q"]}}),
        json!({"kind": "extract_data", "scope": "k", "request": {"input": "Invoice 7 total 12.5", "schema": {"type": "object", "properties": {"total": {"type": "number"}, "number": {"type": "integer"}}, "required": ["total", "number"]}}}),
        json!({"kind": "chat", "scope": "k", "request": {"messages": [{"role": "user", "content": "Weather?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]}}),
        json!({"kind": "embed", "scope": "k", "request": {"input": ["a text", {"text": "another", "id": "doc-1", "revision": "v1"}], "dimensions": 8}}),
    ];
    for (i, k) in kinds.iter().enumerate() {
        let (st, t) = s
            .post("/v1/tasks?wait=15s", ACME, Some(&format!("kind-{i}")), k)
            .await;
        assert_eq!(st, StatusCode::CREATED, "{t}");
        assert_eq!(t["status"], json!("succeeded"), "{t}");
        if k["kind"] == "chat" {
            // The dev model called the tool: the output is the assistant message.
            assert_eq!(t["output"]["finish_reason"], "tool_calls", "{t}");
            assert_eq!(
                t["output"]["tool_calls"][0]["function"]["name"],
                "get_weather"
            );
        }
    }
    // A chat's bad input is a 422 naming the field, and stores nothing.
    for (i, (request, field)) in [
        (json!({"messages": [{"role": "tool", "content": "42"}]}), "request.messages[0]"),
        (json!({"messages": [{"role": "robot", "content": "x"}]}), "request.messages[0].role"),
        (json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}), "request.tools[0].function.parameters"),
        (json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]}), "request.tools[1].function.name"),
        (json!({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}), "request.tool_choice.function.name"),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("bad-chat-{i}");
        let body = json!({"kind": "chat", "scope": "k", "request": request});
        let (st, e) = s.post("/v1/tasks", ACME, Some(&key), &body).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
        assert_eq!(e["error"]["code"], "invalid_request", "{e}");
        assert!(
            e["error"]["message"].as_str().unwrap().contains(field),
            "{field}: {e}"
        );
        let (st, _) = s.get(&format!("/v1/tasks?effect_key={key}"), ACME).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "nothing stored");
    }

    // Cancel a running task: it ends canceled and its worker stops.
    let slow = json!({"kind": "generate_text", "model": "slow", "scope": "customer-42", "request": {"prompt": "long"}});
    let (st, t) = s.post("/v1/tasks", ACME, Some("slow-1"), &slow).await;
    assert_eq!(st, StatusCode::CREATED);
    let sid = t["id"].as_str().unwrap().to_string();
    let (st, c) = s
        .post(&format!("/v1/tasks/{sid}/cancel"), ACME, None, &json!({}))
        .await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(
        (c["status"].clone(), c["error"]["code"].clone()),
        (json!("canceled"), json!("WORKFLOW_AI_CANCELED"))
    );

    // Batch: each item on its own, in order.
    let batch = json!({"tasks": [
        {"kind": "classify", "scope": "b", "effect_key": "b-1", "request": classify("one")},
        {"kind": "nope", "scope": "b", "effect_key": "b-2", "request": {}},
        {"kind": "classify", "scope": "b", "effect_key": "e-1", "request": classify("one")},
        {"kind": "classify", "scope": "b", "request": classify("no key")},
        {"kind": "classify", "scope": "b", "effect_key": "b-5", "request": classify("five")}
    ]});
    let (st, r) = s.post("/v1/tasks/batch", ACME, None, &batch).await;
    assert_eq!(st, StatusCode::OK, "{r}");
    let statuses: Vec<u64> = r["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["status"].as_u64().unwrap())
        .collect();
    assert_eq!(statuses, vec![201, 422, 409, 422, 201], "{r}");

    // Release, unreleased-source pages, owner deletion.
    let (st, u) = s
        .get("/v1/scopes/customer-42/unreleased-sources", ACME)
        .await;
    assert_eq!(st, StatusCode::OK);
    let sources: Vec<&str> = u["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, vec!["msg-1", "msg-3", "msg-4"], "{u}");
    for key in ["e-1", "e-2"] {
        let (st, rel) = s
            .post(
                "/v1/tasks/release",
                ACME,
                None,
                &json!({"effect_key": key, "scope": "customer-42"}),
            )
            .await;
        assert_eq!((st, rel["released"].clone()), (StatusCode::OK, json!(true)));
    }
    let (st, _) = s
        .post(
            "/v1/tasks/release",
            ACME,
            None,
            &json!({"effect_key": "nope", "scope": "customer-42"}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (_, u) = s
        .get(
            "/v1/scopes/customer-42/unreleased-sources?after=msg-1",
            ACME,
        )
        .await;
    let sources: Vec<&str> = u["sources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, vec!["msg-3", "msg-4"], "{u}");
    let (st, _, d) = s
        .call(
            reqwest::Method::DELETE,
            "/v1/scopes/customer-42/tasks?source=msg-3",
            Some(ACME),
            &[],
            None,
        )
        .await;
    assert_eq!((st, d["deleted"].clone()), (StatusCode::OK, json!(1)));
    let (st, _) = s.get("/v1/tasks?effect_key=e-3", ACME).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "deleted with its owner");

    // Runs: create, a task of the run, cancel cascades.
    let (st, run) = s
        .post(
            "/v1/runs",
            ACME,
            None,
            &json!({"scope": "wf", "input": {"doc": 1}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{run}");
    let rid = run["id"].as_str().unwrap().to_string();
    let (st, rt) = s.post("/v1/tasks", ACME, Some("run-task"), &json!({"kind": "generate_text", "model": "slow", "run_id": rid, "request": {"prompt": "p"}})).await;
    assert_eq!(st, StatusCode::CREATED, "{rt}");
    assert_eq!(
        (rt["scope"].clone(), rt["run_id"].clone()),
        (json!("wf"), json!(rid))
    );
    let (st, got) = s.get(&format!("/v1/runs/{rid}"), ACME).await;
    assert_eq!(
        (st, got["state"].clone()),
        (StatusCode::OK, json!("running"))
    );
    let (st, c) = s
        .post(&format!("/v1/runs/{rid}/cancel"), ACME, None, &json!({}))
        .await;
    assert_eq!(
        (st, c["state"].clone()),
        (StatusCode::OK, json!("canceled"))
    );
    let t = s.wait_terminal(rt["id"].as_str().unwrap(), ACME).await;
    assert_eq!(t["status"], json!("canceled"));
    let (st, e) = s
        .post(
            "/v1/tasks",
            ACME,
            Some("run-task-2"),
            &json!({"kind": "generate_text", "run_id": rid, "request": {"prompt": "p"}}),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::CONFLICT,
        "a canceled run takes no task: {e}"
    );

    // Discovery and operations.
    let (st, k) = s.get("/v1/kinds", ACME).await;
    assert_eq!(
        (st, k["kinds"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(TaskKind::ALL.len()))
    );
    let (st, m) = s.get("/v1/models", ACME).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        m["models"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x["id"] == json!("default") && x["default"] == json!(true))
    );
    for path in ["/healthz", "/readyz", "/openapi.json", "/metrics"] {
        let (st, _, _) = s.call(reqwest::Method::GET, path, None, &[], None).await;
        assert_eq!(st, StatusCode::OK, "{path}");
    }
    let (_, _, metrics) = s
        .call(reqwest::Method::GET, "/metrics", None, &[], None)
        .await;
    assert!(
        metrics.as_str().unwrap_or_default().contains("tollgate_"),
        "metrics: {metrics}"
    );
}

async fn isolation(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    let (st, t) = s.post("/v1/tasks", ACME, Some("shared-key"), &json!({"kind": "generate_text", "model": "slow", "scope": "s", "source": {"id": "d", "revision": "v1"}, "request": {"prompt": "p"}})).await;
    assert_eq!(st, StatusCode::CREATED);
    let id = t["id"].as_str().unwrap().to_string();
    let (_, run) = s.post("/v1/runs", ACME, None, &json!({"scope": "s"})).await;
    let rid = run["id"].as_str().unwrap().to_string();
    // Every endpoint with beta's key on acme's rows: 404, and nothing changes.
    let (st, _) = s.get(&format!("/v1/tasks/{id}"), BETA).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s.get("/v1/tasks?effect_key=shared-key", BETA).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s
        .post(&format!("/v1/tasks/{id}/cancel"), BETA, None, &json!({}))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s
        .post(
            "/v1/tasks/release",
            BETA,
            None,
            &json!({"effect_key": "shared-key", "scope": "s"}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, u) = s.get("/v1/scopes/s/unreleased-sources", BETA).await;
    assert_eq!(
        (st, u["sources"].as_array().map(Vec::len)),
        (StatusCode::OK, Some(0))
    );
    let (st, _, d) = s
        .call(
            reqwest::Method::DELETE,
            "/v1/scopes/s/tasks",
            Some(BETA),
            &[],
            None,
        )
        .await;
    assert_eq!((st, d["deleted"].clone()), (StatusCode::OK, json!(0)));
    let (st, _) = s.get(&format!("/v1/runs/{rid}"), BETA).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s
        .post(&format!("/v1/runs/{rid}/cancel"), BETA, None, &json!({}))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    let (st, _) = s
        .post(
            "/v1/tasks",
            BETA,
            Some("beta-run-task"),
            &json!({"kind": "generate_text", "run_id": rid, "request": {"prompt": "p"}}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "another app's run is not found");
    // Beta's own use of the same effect key is independent.
    let (st, b) = s
        .post(
            "/v1/tasks",
            BETA,
            Some("shared-key"),
            &json!({"kind": "generate_text", "scope": "s", "request": {"prompt": "beta"}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED);
    assert_ne!(b["id"].as_str(), Some(id.as_str()));
    // Acme's task and run are untouched.
    let (_, t) = s.get(&format!("/v1/tasks/{id}"), ACME).await;
    assert!(
        ["queued", "running"].contains(&t["status"].as_str().unwrap()),
        "{t}"
    );
    let (_, r) = s.get(&format!("/v1/runs/{rid}"), ACME).await;
    assert_eq!(r["state"], json!("running"));
    // Authentication and subjects.
    let (st, _, e) = s
        .call(reqwest::Method::GET, "/v1/kinds", None, &[], None)
        .await;
    assert_eq!(
        (st, e["error"]["code"].clone()),
        (StatusCode::UNAUTHORIZED, json!("unauthorized"))
    );
    let (st, _) = s.get("/v1/kinds", "wrong-key-0123456789abcdef").await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);
    let (st, _, _) = s
        .call(
            reqwest::Method::GET,
            "/v1/kinds",
            Some(ACME),
            &[("x-tollgate-subject", "user:mallory")],
            None,
        )
        .await;
    assert_eq!(
        st,
        StatusCode::FORBIDDEN,
        "a plain key may not assert a subject"
    );
    // Subjects keep cache results apart.
    let req = scoped("subj", "doc", classify("same input"));
    let alice = [("x-tollgate-subject", "user:alice")];
    let bob = [("x-tollgate-subject", "user:bob")];
    let body = serde_json::to_vec(&req).unwrap();
    let (st, _, a1) = s
        .call(
            reqwest::Method::POST,
            "/v1/tasks?wait=15s",
            Some(ACME_ASSERTS),
            &[alice[0], ("idempotency-key", "subj-a1")],
            Some(body.clone()),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{a1}");
    let (_, _, a2) = s
        .call(
            reqwest::Method::POST,
            "/v1/tasks",
            Some(ACME_ASSERTS),
            &[alice[0], ("idempotency-key", "subj-a2")],
            Some(body.clone()),
        )
        .await;
    assert_eq!(
        a2["cached"],
        json!(true),
        "alice's repeat is a cache hit: {a2}"
    );
    let (_, _, b1) = s
        .call(
            reqwest::Method::POST,
            "/v1/tasks",
            Some(ACME_ASSERTS),
            &[bob[0], ("idempotency-key", "subj-b1")],
            Some(body),
        )
        .await;
    assert_eq!(
        b1["cached"],
        json!(false),
        "bob never sees alice's result: {b1}"
    );
}

async fn bad_input(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    // Exactly at the limit (measured on the stored canonical bytes) and one byte over.
    let fits = |n: usize| {
        let r = json!({"input": "x".repeat(n), "labels": ["spam", "ham"]});
        ValidatedRequest::new(TaskKind::Classify, &r, usize::MAX)
            .unwrap()
            .canonical()
            .len()
    };
    let overhead = fits(0);
    let at = LIMIT - overhead;
    assert_eq!(fits(at), LIMIT);
    // Whitespace the client sends does not count: pad the body generously.
    let padded = format!(
        "{{ \"kind\" : \"classify\" ,  \"scope\" : \"s\" , \"request\" : {{ \"labels\" : [ \"spam\" , \"ham\" ] ,    \"input\" : \"{}\" }} }}",
        "x".repeat(at)
    );
    let (st, _, t) = s
        .call(
            reqwest::Method::POST,
            "/v1/tasks",
            Some(ACME),
            &[("idempotency-key", "at-limit")],
            Some(padded.into_bytes()),
        )
        .await;
    assert_eq!(
        st,
        StatusCode::CREATED,
        "exactly at the limit is accepted: {t}"
    );
    let over = json!({"kind": "classify", "scope": "s", "request": {"input": "x".repeat(at + 1), "labels": ["spam", "ham"]}});
    let (st, e) = s.post("/v1/tasks", ACME, Some("over-limit"), &over).await;
    assert_eq!(
        (st, e["error"]["code"].clone()),
        (StatusCode::PAYLOAD_TOO_LARGE, json!("request_too_large")),
        "{e}"
    );
    let (st, _) = s.get("/v1/tasks?effect_key=over-limit", ACME).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "nothing stored");
    // A body far beyond the transport limit.
    let huge = format!(
        "{{\"kind\":\"classify\",\"scope\":\"s\",\"request\":{{\"input\":\"{}\",\"labels\":[\"a\",\"b\"]}}}}",
        "y".repeat(3 << 20)
    );
    let (st, _, e) = s
        .call(
            reqwest::Method::POST,
            "/v1/tasks",
            Some(ACME),
            &[("idempotency-key", "huge")],
            Some(huge.into_bytes()),
        )
        .await;
    assert_eq!(st, StatusCode::PAYLOAD_TOO_LARGE, "{e}");

    let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
    let cases: Vec<(&str, Vec<u8>, StatusCode)> = vec![
        ("malformed", b"{\"kind\": ".to_vec(), StatusCode::BAD_REQUEST),
        ("invalid-utf8", vec![b'{', 0xff, 0xfe, b'}'], StatusCode::BAD_REQUEST),
        ("wrong-type", serde_json::to_vec(&json!({"kind": 7, "scope": "s", "request": {}})).unwrap(), StatusCode::BAD_REQUEST),
        ("unknown-top-field", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "request": classify("x"), "budgte": "x"})).unwrap(), StatusCode::BAD_REQUEST),
        ("unknown-kind", serde_json::to_vec(&json!({"kind": "summarize", "scope": "s", "request": {}})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("unknown-request-field", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "request": {"input": "x", "labels": ["a"], "extra": 1}})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("both-owners", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "run_id": "x", "request": classify("x")})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("no-owner", serde_json::to_vec(&json!({"kind": "classify", "request": classify("x")})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("budget-not-allowed", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "budget": "secret", "source": {"id": "d", "revision": "1"}, "request": classify("x")})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("unknown-model", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "model": "gpt-9", "request": classify("x")})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("big-integer", serde_json::to_vec(&json!({"kind": "generate_text", "scope": "s", "request": {"prompt": "p", "max_output_tokens": 9_007_199_254_740_993u64}})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("big-integer-in-schema", serde_json::to_vec(&json!({"kind": "extract_data", "scope": "s", "request": {"input": "p", "schema": {"type": "integer", "maximum": 9_007_199_254_740_993u64}}})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("deep-nesting", format!("{{\"kind\":\"extract_data\",\"scope\":\"s\",\"request\":{{\"input\":\"p\",\"schema\":{deep}}}}}").into_bytes(), StatusCode::BAD_REQUEST),
        ("huge-label-list", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "request": {"input": "x", "labels": (0..1001).map(|i| format!("l{i}")).collect::<Vec<_>>()}})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("invalid-schema", serde_json::to_vec(&json!({"kind": "extract_data", "scope": "s", "request": {"input": "p", "schema": {"type": "no-such-type"}}})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("remote-ref", serde_json::to_vec(&json!({"kind": "extract_data", "scope": "s", "request": {"input": "p", "schema": {"$ref": "http://127.0.0.1:9/schema.json"}}})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("empty-effect-key", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "effect_key": "", "request": classify("x")})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("priority-too-high", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "priority": 10, "request": classify("x")})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("priority-negative", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "priority": -1, "request": classify("x")})).unwrap(), StatusCode::UNPROCESSABLE_ENTITY),
        ("priority-not-a-number", serde_json::to_vec(&json!({"kind": "classify", "scope": "s", "priority": "high", "request": classify("x")})).unwrap(), StatusCode::BAD_REQUEST),
    ];
    for (name, body, expected) in cases {
        let key = format!("bad-{name}");
        let (st, _, e) = s
            .call(
                reqwest::Method::POST,
                "/v1/tasks",
                Some(ACME),
                &[("idempotency-key", key.as_str())],
                Some(body),
            )
            .await;
        assert_eq!(st, expected, "{name}: {e}");
        assert!(
            e["error"]["code"].is_string() && e["error"]["message"].is_string(),
            "{name}: a JSON error body: {e}"
        );
        let (st, _) = s.get(&format!("/v1/tasks?effect_key={key}"), ACME).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{name}: nothing stored");
    }
    let (st, _, _) = s
        .call(
            reqwest::Method::POST,
            "/v1/tasks?wait=soon",
            Some(ACME),
            &[("idempotency-key", "w")],
            Some(
                serde_json::to_vec(
                    &json!({"kind": "classify", "scope": "s", "request": classify("x")}),
                )
                .unwrap(),
            ),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "wait must be a duration");
    let (st, _, _) = s
        .call(
            reqwest::Method::GET,
            "/v1/no-such-route",
            Some(ACME),
            &[],
            None,
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    // Admission over HTTP: 429 with Retry-After.
    let mut refused = None;
    for i in 0..5 {
        let body = json!({"kind": "classify", "scope": "rl", "budget": "tight", "source": {"id": format!("d{i}"), "revision": "v1"}, "request": classify(&format!("m{i}"))});
        let (st, h, e) = s
            .call(
                reqwest::Method::POST,
                "/v1/tasks",
                Some(ACME),
                &[("idempotency-key", &format!("rl-{i}"))],
                Some(serde_json::to_vec(&body).unwrap()),
            )
            .await;
        if st == StatusCode::TOO_MANY_REQUESTS {
            refused = Some((h, e));
            break;
        }
        assert_eq!(st, StatusCode::CREATED, "{e}");
    }
    let (h, e) = refused.expect("burst 2 refuses the third");
    assert_eq!(e["error"]["code"], json!("WORKFLOW_AI_RATE_LIMIT"));
    let retry: u64 = h["retry-after"].to_str().unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "retry after {retry}");
    assert_eq!(e["error"]["retry_after_s"], json!(retry));
}

/// `GET /v1/tasks/{id}?wait=`: the long-poll the clients' `wait` loops on.
async fn wait_on_a_task(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    // A task that takes 30 s: the wait ends after the given time, with the task unfinished.
    let slow = json!({"kind": "generate_text", "scope": "w", "model": "slow", "request": {"prompt": "slow"}});
    let (st, t) = s.post("/v1/tasks", ACME, Some("wait-slow"), &slow).await;
    assert_eq!(st, StatusCode::CREATED, "{t}");
    let id = t["id"].as_str().unwrap().to_string();
    let started = Instant::now();
    let (st, t) = s.get(&format!("/v1/tasks/{id}?wait=1s"), ACME).await;
    let waited = started.elapsed();
    assert_eq!(st, StatusCode::OK, "{t}");
    assert!(
        matches!(t["status"].as_str(), Some("queued" | "running")),
        "{t}"
    );
    assert!(
        waited >= Duration::from_millis(900),
        "answered after {waited:?}"
    );
    // Another app's key, and a wait that is not a duration.
    let (st, e) = s.get(&format!("/v1/tasks/{id}?wait=1s"), BETA).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    let (st, e) = s.get(&format!("/v1/tasks/{id}?wait=soon"), ACME).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(e["error"]["code"], json!("malformed_request"));
    // A cancellation ends the wait at once.
    let (st, _) = s
        .post(&format!("/v1/tasks/{id}/cancel"), ACME, None, &json!({}))
        .await;
    assert_eq!(st, StatusCode::OK);
    let (_, t) = s.get(&format!("/v1/tasks/{id}?wait=10s"), ACME).await;
    assert_eq!(t["status"], json!("canceled"), "{t}");

    // A quick task: the wait answers as soon as it is terminal.
    let quick = json!({"kind": "generate_text", "scope": "w", "request": {"prompt": "quick"}});
    let (_, t) = s.post("/v1/tasks", ACME, Some("wait-quick"), &quick).await;
    let id = t["id"].as_str().unwrap().to_string();
    let started = Instant::now();
    let (st, t) = s.get(&format!("/v1/tasks/{id}?wait=15s"), ACME).await;
    assert_eq!(st, StatusCode::OK, "{t}");
    assert_eq!(t["status"], json!("succeeded"), "{t}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
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

/// docs/conformance.md#priority over HTTP: a task carries its priority (default 5) in submissions, batches
/// and reads; an out-of-range one is refused naming the field and stores nothing.
async fn priority(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    let mut body = json!({"kind": "classify", "scope": "p", "request": classify("urgent")});
    body["priority"] = json!(8);
    let (st, t) = s.post("/v1/tasks", ACME, Some("prio-8"), &body).await;
    assert_eq!(st, StatusCode::CREATED, "{t}");
    assert_eq!(t["priority"], json!(8));
    let plain = json!({"kind": "classify", "scope": "p", "request": classify("whenever")});
    let (_, t) = s
        .post("/v1/tasks", ACME, Some("prio-default"), &plain)
        .await;
    assert_eq!(t["priority"], json!(5), "the default priority is 5");
    let batch = json!({"tasks": [
        {"kind": "classify", "scope": "p", "effect_key": "b-1", "priority": 0, "request": classify("low")},
        {"kind": "classify", "scope": "p", "effect_key": "b-2", "priority": 42, "request": classify("bad")},
    ]});
    let (st, answer) = s.post("/v1/tasks/batch", ACME, None, &batch).await;
    assert!(st.is_success(), "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results[0]["task"]["priority"], json!(0), "{answer}");
    assert_eq!(results[1]["status"], json!(422), "{answer}");
    let message = results[1]["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("priority"),
        "the error names the field: {answer}"
    );
    let (st, _) = s.get("/v1/tasks?effect_key=b-2", ACME).await;
    assert_eq!(
        st,
        StatusCode::NOT_FOUND,
        "nothing stored for the refused item"
    );
    let (st, _, e) = s
        .call(
            reqwest::Method::POST,
            "/v1/tasks",
            Some(ACME),
            &[("idempotency-key", "prio-bad")],
            Some(
                serde_json::to_vec(&json!({"kind": "classify", "scope": "p", "priority": 10, "request": classify("x")}))
                    .unwrap(),
            ),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("priority"),
        "{e}"
    );
}

on_both_backends!(lifecycle, isolation, bad_input, wait_on_a_task, priority);

#[test]
fn serve_without_keys_refuses_other_addresses() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--addr", "0.0.0.0:0", "--database-url"])
        .arg(format!("sqlite://{}", dir.path().join("t.db").display()))
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no API keys are configured"), "{err}");
}

#[test]
fn invalid_configuration_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key) in [
        (
            "[budgets.standard]\nmax_steps_per_source = 0\nsources_per_24_hours = 1\nscope_concurrent = 1\nburst = 1\ntasks_per_minute = 1\n",
            "budgets.standard.max_steps_per_source",
        ),
        (
            "[budgets.standard]\nmax_steps_per_source = -2\nsources_per_24_hours = 1\nscope_concurrent = 1\nburst = 1\ntasks_per_minute = 1\n",
            "budgets.standard.max_steps_per_source",
        ),
        (
            "[budgets.standard]\nmax_steps_per_source = 1.5\nsources_per_24_hours = 1\nscope_concurrent = 1\nburst = 1\ntasks_per_minute = 1\n",
            "budgets.standard.max_steps_per_source",
        ),
        (
            "[apps.acme]\napi_keys = [\"acme-key-0123456789abcdef\"]\n[apps.beta]\ndefault_budget = \"standard\"\n",
            "apps.beta.api_keys",
        ),
        ("[server]\naddr = \"nowhere\"\n", "server"),
    ] {
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--addr", "127.0.0.1:0", "--config"])
            .arg(&path)
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{text} must be refused");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(key), "the message names {key}: {err}");
    }
}
