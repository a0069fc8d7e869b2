//! Pipelines end to end: the real `tollgate serve` binary on a free 127.0.0.1 port with
//! the dev provider, on SQLite and (with `TOLLGATE_TEST_DATABASE_URL`) on PostgreSQL. The
//! invoice example of docs/pipelines.md is registered over HTTP and through the
//! `tollgate pipeline` commands and run to success; another app sees none of it; bad
//! definitions are refused precisely and leave nothing behind.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::io::Write;
use std::process::{Command, Stdio};

mod common;
use common::Server;

const ACME: &str = "acme-key-0123456789abcdef";
const BETA: &str = "beta-key-0123456789abcdef";

/// The worked example of docs/pipelines.md, as `tollgate pipeline register` takes it.
const INVOICE: &str = include_str!("../../../docs/examples/invoice-pipeline.json");

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

[apps.acme]
api_keys = ["{ACME}"]

[apps.beta]
api_keys = ["{BETA}"]

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

async fn start(backend: &str) -> Option<Server> {
    common::start(backend, "pipes", config_text)
}

impl Server {
    async fn send(
        &self,
        method: reqwest::Method,
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
        let response = rb.send().await.expect("the server answers");
        let status = response.status();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn post(&self, path: &str, key: &str, body: &Value) -> (StatusCode, Value) {
        let bytes = serde_json::to_vec(body).unwrap();
        self.send(reqwest::Method::POST, path, key, &[], Some(bytes))
            .await
    }

    async fn get(&self, path: &str, key: &str) -> (StatusCode, Value) {
        self.send(reqwest::Method::GET, path, key, &[], None).await
    }

    /// Runs `tollgate ARGS` as a client of this server (as ACME), with `stdin`; returns
    /// its JSON output.
    fn cli(&self, args: &[&str], stdin: Option<&str>) -> Value {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .env("TOLLGATE_URL", &self.base)
            .env("TOLLGATE_API_KEY", ACME)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        if let Some(text) = stdin {
            input.write_all(text.as_bytes()).unwrap();
        }
        drop(input);
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "tollgate {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("JSON output")
    }
}

fn key_of(app: &str) -> &'static str {
    match app {
        "acme" => ACME,
        _ => BETA,
    }
}

fn invoice() -> Value {
    serde_json::from_str(INVOICE).expect("docs/examples/invoice-pipeline.json is JSON")
}

fn invoice_input(id: &str) -> Value {
    json!({
        "invoice_id": id,
        "revision": "v1",
        "text": "INVOICE 2026-117 from Nimbus Cloud GmbH. Hosting, November. Total due: 1,234.50 EUR."
    })
}

/// Checks a finished invoice run: succeeded, every step succeeded once with its task and
/// output, and the run's output built from them.
fn assert_invoice_succeeded(run: &Value) {
    assert_eq!(run["state"], json!("succeeded"), "{run:#}");
    let steps = run["pipeline"]["steps"].as_array().expect("steps");
    let keys: Vec<&str> = steps.iter().map(|s| s["key"].as_str().unwrap()).collect();
    assert_eq!(keys, ["extract", "category", "summary"]);
    for s in steps {
        assert_eq!(s["status"], json!("succeeded"), "{s}");
        assert_eq!(s["attempts"], json!(1));
        assert!(s["task_id"].is_string(), "{s}");
        assert!(s["output"].is_object(), "{s}");
    }
    let output = &run["output"];
    assert_eq!(output["vendor"], steps[0]["output"]["vendor"]);
    assert_eq!(output["category"], steps[1]["output"]["label"]);
    assert_eq!(output["summary"], steps[2]["output"]["text"]);
    assert!(
        ["software", "travel", "office", "other"].contains(&output["category"].as_str().unwrap())
    );
    assert_eq!(output["currency"].as_str().map(str::len), Some(3));
}

async fn invoice_pipeline_over_http(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    // Register: 201 with the version, then the same definition again: 200, same version.
    let (st, registered) = s.post("/v1/pipelines", ACME, &invoice()).await;
    assert_eq!(st, StatusCode::CREATED, "{registered}");
    assert_eq!(registered["name"], json!("invoice"));
    assert_eq!(registered["created"], json!(true));
    let version = registered["version"].as_str().unwrap().to_string();
    assert_eq!(version.len(), 64);
    let (st, again) = s.post("/v1/pipelines", ACME, &invoice()).await;
    assert_eq!(st, StatusCode::OK, "{again}");
    assert_eq!(
        (again["created"].clone(), again["version"].as_str()),
        (json!(false), Some(version.as_str()))
    );
    let (st, got) = s.get("/v1/pipelines/invoice", ACME).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(got["version"], json!(version));
    assert_eq!(got["definition"]["steps"][0]["key"], json!("extract"));
    let (st, got) = s
        .get(&format!("/v1/pipelines/invoice?version={version}"), ACME)
        .await;
    assert_eq!(
        (st, got["version"].as_str()),
        (StatusCode::OK, Some(version.as_str()))
    );
    let (st, e) = s.get("/v1/pipelines/invoice?version=abc", ACME).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");

    // Run it to the end in one call.
    let (st, run) = s
        .post(
            "/v1/pipelines/invoice/runs?wait=15s",
            ACME,
            &json!({"scope": "customer-42", "input": invoice_input("inv-117")}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{run}");
    assert_eq!(run["pipeline"]["version"], json!(version));
    assert_invoice_succeeded(&run);
    let run_id = run["id"].as_str().unwrap().to_string();
    let (st, read) = s.get(&format!("/v1/runs/{run_id}"), ACME).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(read["pipeline"], run["pipeline"]);
    assert_eq!(read["output"], run["output"]);
    // The steps' tasks are run-owned tasks of the run, in its scope; the bound step has
    // its source.
    let extract_task = run["pipeline"]["steps"][0]["task_id"].as_str().unwrap();
    let (st, task) = s.get(&format!("/v1/tasks/{extract_task}"), ACME).await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(task["run_id"], json!(run_id));
    assert_eq!(task["scope"], json!("customer-42"));
    assert_eq!(task["source"], json!({"id": "inv-117", "revision": "v1"}));
    assert_eq!(task["effect_key"], json!(format!("run:{run_id}:extract")));

    // Without ?wait the answer is the started run; GET ?wait= follows it to the end.
    let (st, started) = s
        .post(
            "/v1/pipelines/invoice/runs",
            ACME,
            &json!({"scope": "customer-42", "input": invoice_input("inv-118"), "version": version}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{started}");
    assert!(
        ["running", "waiting", "succeeded"].contains(&started["state"].as_str().unwrap()),
        "{started}"
    );
    assert_eq!(started["pipeline"]["steps"].as_array().unwrap().len(), 3);
    let id = started["id"].as_str().unwrap();
    let (st, finished) = s.get(&format!("/v1/runs/{id}?wait=15s"), ACME).await;
    assert_eq!(st, StatusCode::OK);
    assert_invoice_succeeded(&finished);

    // A plain workflow run shows no pipeline.
    let (st, plain) = s
        .post("/v1/runs", ACME, &json!({"scope": "customer-42"}))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    assert!(plain.get("pipeline").is_none(), "{plain}");

    // Another app sees none of it: not the pipeline, not the run, not the step's task.
    for path in [
        "/v1/pipelines/invoice".to_string(),
        format!("/v1/pipelines/invoice?version={version}"),
        format!("/v1/runs/{run_id}"),
        format!("/v1/tasks/{extract_task}"),
    ] {
        let (st, e) = s.get(&path, BETA).await;
        assert_eq!(st, StatusCode::NOT_FOUND, "{path}: {e}");
        assert_eq!(e["error"]["code"], json!("not_found"));
    }
    let (st, e) = s
        .post(
            "/v1/pipelines/invoice/runs",
            BETA,
            &json!({"scope": "customer-42", "input": invoice_input("inv-119")}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    let (st, e) = s
        .post(&format!("/v1/runs/{run_id}/cancel"), BETA, &json!({}))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    // Its own pipeline of the same name is its own.
    let (st, theirs) = s.post("/v1/pipelines", BETA, &invoice()).await;
    assert_eq!(
        (st, theirs["created"].clone()),
        (StatusCode::CREATED, json!(true))
    );

    // Runs refuse what cannot work, before anything runs.
    let (st, e) = s
        .post(
            "/v1/pipelines/invoice/runs",
            ACME,
            &json!({"scope": "customer-42", "input": {"text": "no id"}}),
        )
        .await;
    assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{e}");
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reads /input/invoice_id"),
        "{e}"
    );
    // An Idempotency-Key starts the run once: the retry answers it (200), another start
    // under the key is a conflict, and another app's key of the same text is its own.
    let keyed = |key: &'static str, body: Value| {
        let s = &s;
        async move {
            s.send(
                reqwest::Method::POST,
                "/v1/pipelines/invoice/runs",
                key_of(key),
                &[("idempotency-key", "start-117")],
                Some(serde_json::to_vec(&body).unwrap()),
            )
            .await
        }
    };
    let start_body = json!({"scope": "customer-42", "input": invoice_input("inv-300")});
    let (st, first) = keyed("acme", start_body.clone()).await;
    assert_eq!(st, StatusCode::CREATED, "{first}");
    let reordered = json!({"input": {"text": invoice_input("inv-300")["text"], "revision": "v1", "invoice_id": "inv-300"}, "scope": "customer-42"});
    let (st, again) = keyed("acme", reordered).await;
    assert_eq!(st, StatusCode::OK, "{again}");
    assert_eq!(again["id"], first["id"]);
    let (st, e) = keyed(
        "acme",
        json!({"scope": "customer-42", "input": invoice_input("inv-301")}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{e}");
    assert_eq!(e["error"]["code"], json!("idempotency_key_conflict"));
    assert!(
        e["error"]["message"]
            .as_str()
            .unwrap()
            .contains("different input"),
        "{e}"
    );
    let (st, e) = keyed(
        "acme",
        json!({"scope": "customer-43", "input": invoice_input("inv-300")}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{e}");
    let (st, theirs) = keyed("beta", start_body).await;
    assert_eq!(st, StatusCode::CREATED, "{theirs}");
    assert_ne!(theirs["id"], first["id"]);
    let (st, e) = s
        .post(
            "/v1/pipelines/nope/runs",
            ACME,
            &json!({"scope": "s", "input": {}}),
        )
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
}

async fn bad_definitions_are_refused_and_nothing_is_stored(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    let with = |name: &str, f: &dyn Fn(&mut Value)| {
        let mut body = invoice();
        body["name"] = json!(name);
        f(&mut body["definition"]);
        body
    };
    let cases: Vec<(Value, &str)> = vec![
        (
            with("cycle", &|d| {
                d["steps"][0]["depends_on"] = json!(["summary"])
            }),
            "definition.steps: depends_on forms a cycle among: extract, category, summary",
        ),
        (
            with("unknown-dep", &|d| {
                d["steps"][1]["depends_on"] = json!(["extrct"])
            }),
            "definition.steps[1] (category).depends_on[0]: unknown step `extrct`",
        ),
        (
            with("unknown-kind", &|d| {
                d["steps"][2]["kind"] = json!("summarize")
            }),
            "definition.steps[2] (summary).kind: unknown kind \"summarize\"",
        ),
        (
            with("bad-ref", &|d| {
                d["steps"][1]["request"]["input"] = json!({"$from": "/steps/summary/output/text"})
            }),
            "definition.steps (category).request.input: reference \"/steps/summary/output/text\" needs step `summary`, which is not among this step's dependencies",
        ),
        (
            with("unknown-model", &|d| {
                d["steps"][0]["model"] = json!("gpt-9")
            }),
            "definition.steps (extract).model",
        ),
        (
            with("bad-output", &|d| d["output"]["x"] = json!("/elsewhere")),
            "definition.output.x: reference \"/elsewhere\" must start with /input or /steps/<key>/output",
        ),
        (
            with("bad-request", &|d| {
                d["steps"][1]["request"] = json!({"input": "x", "labels": []})
            }),
            "definition.steps (category).request.labels",
        ),
        (
            with("unknown-field", &|d| d["steps"][0]["retry"] = json!(1)),
            "definition.steps[0] (extract): unknown field `retry`",
        ),
        (
            with("bad name!", &|_| {}),
            "name: pipeline name \"bad name!\" may only hold letters, digits",
        ),
    ];
    for (body, expected) in cases {
        let (st, e) = s.post("/v1/pipelines", ACME, &body).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{expected}: {e}");
        assert_eq!(e["error"]["code"], json!("invalid_request"), "{e}");
        let message = e["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with(&format!("invalid {expected}")),
            "expected {expected:?}, got {message:?}"
        );
        // Nothing was stored.
        let name = body["name"].as_str().unwrap();
        if !name.contains(' ') {
            let (st, _) = s.get(&format!("/v1/pipelines/{name}"), ACME).await;
            assert_eq!(st, StatusCode::NOT_FOUND, "{name} was stored");
        }
    }
    // Not JSON, or not the body's shape: 400.
    let (st, e) = s
        .send(
            reqwest::Method::POST,
            "/v1/pipelines",
            ACME,
            &[],
            Some(b"{\"name\": \"x\", \"definition\": ".to_vec()),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert_eq!(e["error"]["code"], json!("malformed_request"));
    let (st, e) = s
        .post("/v1/pipelines", ACME, &json!({"definition": {}}))
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("name"),
        "{e}"
    );
}

async fn pipeline_commands(backend: &str) {
    let Some(s) = start(backend).await else {
        return;
    };
    let registered = s.cli(&["pipeline", "register", "-"], Some(INVOICE));
    assert_eq!(registered["created"], json!(true), "{registered}");
    let version = registered["version"].as_str().unwrap().to_string();
    // A file holding only the definition, with --name.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("definition.json");
    std::fs::write(&file, invoice()["definition"].to_string()).unwrap();
    let again = s.cli(
        &[
            "pipeline",
            "register",
            "--name",
            "invoice",
            file.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(
        (again["created"].clone(), again["version"].as_str()),
        (json!(false), Some(version.as_str()))
    );
    let got = s.cli(&["pipeline", "get", "invoice"], None);
    assert_eq!(got["version"], json!(version));
    let input = invoice_input("inv-200").to_string();
    let run = s.cli(
        &[
            "pipeline",
            "run",
            "invoice",
            "--scope",
            "customer-7",
            "--input",
            "-",
            "--wait",
            "15s",
        ],
        Some(&input),
    );
    assert_invoice_succeeded(&run);
    // With --idempotency-key, running the command again prints the run it started.
    let keyed_args = [
        "pipeline",
        "run",
        "invoice",
        "--scope",
        "customer-7",
        "--input",
        "-",
        "--idempotency-key",
        "cli-start-1",
    ];
    let first = s.cli(&keyed_args, Some(&input));
    let again = s.cli(&keyed_args, Some(&input));
    assert_eq!(first["id"], again["id"]);
    assert_ne!(first["id"], run["id"]);
    let read = s.cli(&["run", "get", run["id"].as_str().unwrap()], None);
    assert_eq!(read["pipeline"], run["pipeline"]);
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
    invoice_pipeline_over_http,
    bad_definitions_are_refused_and_nothing_is_stored,
    pipeline_commands,
);
