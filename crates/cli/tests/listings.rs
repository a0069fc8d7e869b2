//! docs/conformance.md#listings over HTTP against the real `tollgate serve`, on both backends: every filter
//! of `GET /v1/tasks` and `GET /v1/runs`, keyset pages without gaps or duplicates while
//! tasks are inserted concurrently, pipelines with their versions, scopes with their
//! budget state, stats, the task answer's claim/heartbeat/worker/attempts, and bad
//! cursors and filters refused with 400 (the JSON envelope) changing nothing.

mod common;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use std::collections::BTreeSet;

const ACME: &str = "acme-list-key-0123456789";
const BETA: &str = "beta-list-key-0123456789";

fn start(backend: &str, workers: u32) -> Option<common::Server> {
    common::start(backend, "listings", |db| {
        format!(
            r#"
[database]
url = "{db}"

[budgets.standard]
max_steps_per_source = 50
sources_per_24_hours = 10000
scope_concurrent = 1000
burst = 1000
tasks_per_minute = 1

[apps.acme]
api_keys = ["{ACME}"]

[apps.beta]
api_keys = ["{BETA}"]

[workers]
concurrency = {workers}
heartbeat_interval = "200ms"
"#
        )
    })
}

async fn call(
    s: &common::Server,
    method: Method,
    path: &str,
    key: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let mut rb = s
        .http
        .request(method, format!("{}{path}", s.base))
        .bearer_auth(key);
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

async fn get(s: &common::Server, path: &str) -> (StatusCode, Value) {
    call(s, Method::GET, path, ACME, None).await
}

/// Submits a task; `source` makes it scoped (admitted).
async fn submit(
    s: &common::Server,
    key: &str,
    scope: &str,
    kind: &str,
    step: &str,
    source: Option<&str>,
) -> String {
    let request = match kind {
        "classify" => json!({"input": key, "labels": ["a", "b"]}),
        _ => json!({"prompt": key}),
    };
    let mut body = json!({"kind": kind, "scope": scope, "effect_key": key, "step": step,
                          "request": request});
    if let Some(src) = source {
        body["source"] = json!({"id": src, "revision": "v1"});
    }
    let (st, t) = call(s, Method::POST, "/v1/tasks", ACME, Some(body)).await;
    assert!(st.is_success(), "{st} {t}");
    t["id"].as_str().unwrap().to_string()
}

fn ids(page: &Value, field: &str) -> Vec<String> {
    page[field]
        .as_array()
        .unwrap_or_else(|| panic!("a page: {page}"))
        .iter()
        .map(|t| t["id"].as_str().unwrap().to_string())
        .collect()
}

async fn listed(s: &common::Server, query: &str) -> BTreeSet<String> {
    let (st, page) = get(s, &format!("/v1/tasks?limit=500&{query}")).await;
    assert_eq!(st, StatusCode::OK, "{query}: {page}");
    assert!(page.get("next").is_none(), "one page: {page}");
    ids(&page, "tasks").into_iter().collect()
}

fn set(items: &[&String]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

async fn filters(backend: &str) {
    let Some(s) = start(backend, 0) else {
        return;
    };
    let a = submit(&s, "a", "s1", "classify", "label", Some("doc-1")).await;
    let b = submit(&s, "b", "s1", "generate_text", "write", Some("doc-2")).await;
    let c = submit(&s, "c", "s2", "classify", "label", None).await;
    let (st, run) = call(
        &s,
        Method::POST,
        "/v1/runs",
        ACME,
        Some(json!({"scope": "wf"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let r = run["id"].as_str().unwrap().to_string();
    let (st, rt) = call(
        &s,
        Method::POST,
        "/v1/tasks",
        ACME,
        Some(
            json!({"kind": "generate_text", "run_id": r, "effect_key": "rt",
                    "request": {"prompt": "p"}}),
        ),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{rt}");
    let rt = rt["id"].as_str().unwrap().to_string();
    let (st, _) = call(
        &s,
        Method::POST,
        &format!("/v1/tasks/{b}/cancel"),
        ACME,
        Some(json!({})),
    )
    .await;
    assert_eq!(st, StatusCode::OK);
    // Another app's task in the same scope never shows.
    let (st, _) = call(
        &s,
        Method::POST,
        "/v1/tasks",
        BETA,
        Some(
            json!({"kind": "classify", "scope": "s1", "effect_key": "beta",
                    "request": {"input": "x", "labels": ["a", "b"]}}),
        ),
    )
    .await;
    assert!(st.is_success());

    assert_eq!(listed(&s, "").await, set(&[&a, &b, &c, &rt]));
    assert_eq!(listed(&s, "scope=s1").await, set(&[&a, &b]));
    assert_eq!(listed(&s, "status=queued").await, set(&[&a, &c, &rt]));
    assert_eq!(listed(&s, "status=canceled,succeeded").await, set(&[&b]));
    assert_eq!(
        listed(&s, "status=").await.len(),
        4,
        "an empty list filters nothing"
    );
    assert_eq!(listed(&s, "status=queued&scope=s1").await, set(&[&a]));
    assert_eq!(listed(&s, "kind=classify").await, set(&[&a, &c]));
    assert_eq!(listed(&s, "step=label").await, set(&[&a, &c]));
    assert_eq!(listed(&s, "source=doc-2").await, set(&[&b]));
    assert_eq!(listed(&s, &format!("run_id={r}")).await, set(&[&rt]));
    // Creation time: after/before the middle task's own instant.
    let (_, middle) = get(&s, &format!("/v1/tasks/{c}")).await;
    let at = middle["created_at"].as_str().unwrap().replace('+', "%2B");
    let after = listed(&s, &format!("created_after={at}")).await;
    assert!(
        after.contains(&c) && after.contains(&rt) && !after.contains(&a),
        "{after:?}"
    );
    let before = listed(&s, &format!("created_before={at}")).await;
    assert!(
        before.contains(&a) && !before.contains(&c) && !before.contains(&rt),
        "{before:?}"
    );
    // Newest first.
    let (_, page) = get(&s, "/v1/tasks").await;
    assert_eq!(
        ids(&page, "tasks"),
        vec![rt.clone(), c.clone(), b.clone(), a.clone()]
    );
    // The effect-key read is unchanged: one task, with its request.
    let (st, one) = get(&s, "/v1/tasks?effect_key=a").await;
    assert_eq!((st, one["id"].as_str()), (StatusCode::OK, Some(a.as_str())));
    assert_eq!(one["request"]["input"], json!("a"), "{one}");
    let (st, _) = get(&s, "/v1/tasks?effect_key=nope").await;
    assert_eq!(st, StatusCode::NOT_FOUND);

    // Runs: scope and state filters; the plain run has no pipeline.
    let (st, runs) = get(&s, "/v1/runs?scope=wf&state=running,waiting").await;
    assert_eq!(st, StatusCode::OK, "{runs}");
    assert_eq!(ids(&runs, "runs"), vec![r.clone()]);
    assert_eq!(runs["runs"][0]["pipeline"], Value::Null);
    let (_, none) = get(&s, "/v1/runs?state=succeeded").await;
    assert_eq!(ids(&none, "runs"), Vec::<String>::new());
    let (_, none) = get(&s, "/v1/runs?scope=s1").await;
    assert_eq!(ids(&none, "runs"), Vec::<String>::new());

    // Pipelines with their versions, newest first; runs filtered by pipeline.
    let def = |label: &str| {
        json!({"name": "pipe", "definition": {
            "steps": [{"key": "label", "kind": "classify",
                       "request": {"input": {"$from": "/input/text"}, "labels": [label, "b"]}}],
            "output": {"label": "/steps/label/output"}}})
    };
    let (_, v1) = call(&s, Method::POST, "/v1/pipelines", ACME, Some(def("a"))).await;
    let (_, v2) = call(&s, Method::POST, "/v1/pipelines", ACME, Some(def("z"))).await;
    let mut other = def("a");
    other["name"] = json!("another");
    call(&s, Method::POST, "/v1/pipelines", ACME, Some(other)).await;
    let (st, pipes) = get(&s, "/v1/pipelines").await;
    assert_eq!(st, StatusCode::OK, "{pipes}");
    assert_eq!(pipes["pipelines"][0]["name"], json!("another"));
    assert_eq!(pipes["pipelines"][1]["name"], json!("pipe"));
    let versions: Vec<&Value> = pipes["pipelines"][1]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| &v["version"])
        .collect();
    assert_eq!(versions, vec![&v2["version"], &v1["version"]], "{pipes}");
    let (_, first) = get(&s, "/v1/pipelines?limit=1").await;
    let next = first["next"].as_str().expect("a next page").to_string();
    let (_, second) = get(&s, &format!("/v1/pipelines?limit=1&next={next}")).await;
    assert_eq!(second["pipelines"][0]["name"], json!("pipe"));
    assert!(second.get("next").is_none(), "{second}");
    let (st, pr) = call(
        &s,
        Method::POST,
        "/v1/pipelines/pipe/runs",
        ACME,
        Some(json!({"scope": "wf", "input": {"text": "x"}})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{pr}");
    let (_, by_pipe) = get(&s, "/v1/runs?pipeline=pipe").await;
    assert_eq!(
        ids(&by_pipe, "runs"),
        vec![pr["id"].as_str().unwrap().to_string()]
    );
    assert_eq!(by_pipe["runs"][0]["pipeline"]["name"], json!("pipe"));

    // Scopes: s1 had two admissions (doc-1, doc-2); s2's task was unscoped.
    let (st, scopes) = get(&s, "/v1/scopes").await;
    assert_eq!(st, StatusCode::OK, "{scopes}");
    let names: Vec<&str> = scopes["scopes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["scope"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"s1") && !names.contains(&"s2"), "{scopes}");
    let (st, s1) = get(&s, "/v1/scopes/s1").await;
    assert_eq!(st, StatusCode::OK, "{s1}");
    assert_eq!(s1["sources_in_window"], json!(2), "{s1}");
    assert_eq!(s1["admissions_in_window"], json!(2), "{s1}");
    assert_eq!(s1["active"], json!(1), "a queued, b canceled: {s1}");
    assert_eq!(s1["busiest_source_steps"], json!(1), "{s1}");
    assert_eq!(s1["policy"]["burst"], json!(1000));
    // docs/conformance.md#cost-reservation: the dev model has no prices and no output bound: no money, no tokens
    // reserved; the canceled task settled at nothing (it never ran).
    assert_eq!(s1["cost"]["spent_micros"], json!(0), "{s1}");
    let tokens = s1["bucket_tokens"].as_f64().unwrap();
    assert!((998.0..999.0).contains(&tokens), "two tokens taken: {s1}");
    let (_, quiet) = get(&s, "/v1/scopes/never-used").await;
    assert_eq!(
        (quiet["active"].clone(), quiet["bucket_tokens"].clone()),
        (json!(0), json!(1000.0))
    );

    // Stats: from the database, for this app only.
    let (st, stats) = get(&s, "/v1/stats").await;
    assert_eq!(st, StatusCode::OK, "{stats}");
    assert_eq!(stats["source"], json!("database"));
    let queued = stats["queued"].as_u64().unwrap();
    assert!(
        (3..=4).contains(&queued),
        "a, c, rt (and the pipeline's step once driven): {stats}"
    );
    assert_eq!(stats["canceled"], json!(1), "{stats}");
    assert_eq!(stats["failures_by_code"][0]["count"], json!(1), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_sqlite() {
    filters("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_postgres() {
    filters("postgres").await;
}

/// Pages of 7 read while another client inserts: every task that existed when the first
/// page was read shows exactly once, in (created_at, id) order, newest first.
async fn paging_under_concurrent_inserts(backend: &str) {
    let Some(s) = start(backend, 0) else {
        return;
    };
    let mut existing = BTreeSet::new();
    for i in 0..60 {
        existing.insert(submit(&s, &format!("old-{i}"), "p", "generate_text", "w", None).await);
    }
    let inserter = {
        let http = s.http.clone();
        let base = s.base.clone();
        tokio::spawn(async move {
            for i in 0..40 {
                let r = http
                    .post(format!("{base}/v1/tasks"))
                    .bearer_auth(ACME)
                    .json(&json!({"kind": "generate_text", "scope": "p",
                                  "effect_key": format!("new-{i}"), "request": {"prompt": "n"}}))
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success());
            }
        })
    };
    let mut seen = Vec::new();
    let mut times = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let path = match &next {
            Some(n) => format!("/v1/tasks?scope=p&limit=7&next={n}"),
            None => "/v1/tasks?scope=p&limit=7".to_string(),
        };
        let (st, page) = get(&s, &path).await;
        assert_eq!(st, StatusCode::OK, "{page}");
        for t in page["tasks"].as_array().unwrap() {
            seen.push(t["id"].as_str().unwrap().to_string());
            times.push(t["created_at"].as_str().unwrap().to_string());
        }
        match page.get("next").and_then(Value::as_str) {
            Some(n) => next = Some(n.to_string()),
            None => break,
        }
    }
    inserter.await.unwrap();
    let unique: BTreeSet<String> = seen.iter().cloned().collect();
    assert_eq!(unique.len(), seen.len(), "no task shows twice");
    let missing: Vec<_> = existing.difference(&unique).collect();
    assert!(
        missing.is_empty(),
        "every existing task shows: {missing:?} missing"
    );
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| b.cmp(a));
    assert_eq!(times, sorted, "newest first");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_under_concurrent_inserts_sqlite() {
    paging_under_concurrent_inserts("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paging_under_concurrent_inserts_postgres() {
    paging_under_concurrent_inserts("postgres").await;
}

/// Bad cursors, filters and parameters: 400 with the JSON envelope, nothing changed.
async fn bad_queries_are_400(backend: &str) {
    let Some(s) = start(backend, 0) else {
        return;
    };
    submit(&s, "x", "s", "classify", "label", Some("doc")).await;
    let (_, run) = call(
        &s,
        Method::POST,
        "/v1/runs",
        ACME,
        Some(json!({"scope": "s"})),
    )
    .await;
    let run_cursor = format!("r1.1.{}", run["id"].as_str().unwrap());
    let snapshot = || async {
        (
            get(&s, "/v1/tasks?limit=500").await,
            get(&s, "/v1/runs").await,
            get(&s, "/v1/scopes/s").await.1["admissions_in_window"].clone(),
        )
    };
    let before = snapshot().await;
    for path in [
        "/v1/tasks?limit=0".to_string(),
        "/v1/tasks?limit=501".into(),
        "/v1/tasks?limit=ten".into(),
        "/v1/tasks?status=bogus".into(),
        "/v1/tasks?status=queued,".into(),
        "/v1/tasks?kind=poem".into(),
        "/v1/tasks?run_id=not-a-run".into(),
        "/v1/tasks?scope=%20padded".into(),
        "/v1/tasks?created_after=yesterday".into(),
        "/v1/tasks?created_before=2026-02-30T00:00:00Z".into(),
        "/v1/tasks?next=garbage".into(),
        format!("/v1/tasks?next={run_cursor}"),
        "/v1/tasks?color=blue".into(),
        "/v1/tasks?effect_key=x&scope=s".into(),
        "/v1/tasks?scope=a&scope=b".into(),
        "/v1/runs?state=asleep".into(),
        "/v1/runs?next=t1.1.0190a0a0-0000-7000-8000-000000000000".into(),
        "/v1/runs?limit=9999".into(),
        "/v1/runs?pipeline=%00".into(),
        // Invalid UTF-8 once percent-decoded (it was read as U+FFFD and matched).
        "/v1/tasks?scope=%FF".into(),
        "/v1/tasks?effect_key=%C3%28".into(),
        "/v1/runs?scope=s%80".into(),
        "/v1/tasks/00000000-0000-0000-0000-000000000000?wait=%FF".into(),
        // The pipeline-name rule of registration.
        "/v1/runs?pipeline=bad%20name".into(),
        "/v1/runs?pipeline=.hidden".into(),
        "/v1/pipelines?next=s1.s".into(),
        "/v1/pipelines?after=x".into(),
        "/v1/scopes?next=zz".into(),
        "/v1/scopes/s?limit=1".into(),
        "/v1/stats?window=1h".into(),
    ] {
        let (st, e) = get(&s, &path).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{path}: {e}");
        assert!(
            e["error"]["code"].is_string() && e["error"]["message"].is_string(),
            "{path}: the envelope: {e}"
        );
    }
    assert_eq!(snapshot().await, before, "nothing changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_are_400_sqlite() {
    bad_queries_are_400("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_queries_are_400_postgres() {
    bad_queries_are_400("postgres").await;
}

/// docs/conformance.md#listings: a task shows when it was claimed and heartbeated, which worker ran it and
/// its attempts with their usage.
async fn task_answers_show_the_run(backend: &str) {
    let Some(s) = start(backend, 2) else {
        return;
    };
    let id = submit(&s, "ran", "s", "generate_text", "w", None).await;
    let (st, t) = get(&s, &format!("/v1/tasks/{id}?wait=20s")).await;
    assert_eq!(
        (st, t["status"].as_str()),
        (StatusCode::OK, Some("succeeded")),
        "{t}"
    );
    assert!(
        t["claimed_at"].is_string() && t["worker"].is_string(),
        "{t}"
    );
    assert!(t["request"].is_object(), "{t}");
    let attempts = t["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{t}");
    // docs/routes.md, "Attempts": its one attempt, on the model's deployment.
    assert_eq!(attempts[0]["n"], json!(1));
    assert_eq!(attempts[0]["outcome"], json!("succeeded"), "{t}");
    assert!(
        attempts[0]["deployment"]
            .as_str()
            .is_some_and(|d| d.starts_with("dev/")),
        "{t}"
    );
    assert!(
        attempts[0]["started_at"].is_string() && attempts[0]["ended_at"].is_string(),
        "{t}"
    );
    for field in ["input_tokens", "output_tokens"] {
        assert_eq!(attempts[0]["usage"][field], t["usage"][field], "{t}");
    }
    assert!(attempts[0]["error"].is_null(), "{t}");
    let (_, page) = get(&s, "/v1/tasks?status=succeeded").await;
    assert_eq!(page["tasks"][0]["worker"], t["worker"]);
    assert!(
        page["tasks"][0].get("request").is_none() && page["tasks"][0].get("attempts").is_none(),
        "pages stay small: {page}"
    );
    let (_, stats) = get(&s, "/v1/stats").await;
    assert_eq!(stats["succeeded"], json!(1), "{stats}");
    assert!(stats["latency_ms"]["p50"].is_i64(), "{stats}");
    assert_eq!(stats["cache_hit_rate"], json!(0.0), "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_answers_show_the_run_sqlite() {
    task_answers_show_the_run("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_answers_show_the_run_postgres() {
    task_answers_show_the_run("postgres").await;
}
