//! End to end: `tollgate serve` exporting its traces (docs/telemetry.md) to an OTLP
//! receiver inside the test, over HTTP/protobuf and over gRPC, on SQLite and (with
//! `TOLLGATE_TEST_DATABASE_URL`) on PostgreSQL. The exported spans are decoded and their
//! tree and attributes asserted: one trace per task continuing the caller's
//! `traceparent`, GenAI attributes on the provider call, no prompt or output text unless
//! the app allows it.

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::Server;

const ACME: &str = "acme-key-0123456789abcdef";
const OPEN: &str = "open-key-0123456789abcdef";
/// What the caller's span is: the test plays an instrumented application.
const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";
/// Text that must never reach a span of an app without `trace_content`.
const SECRET: &str = "the secret prompt text";

/// One exported span with its service name.
#[derive(Debug, Clone)]
struct Exported {
    service: String,
    span: Span,
}

/// Everything a receiver got, shared with the test.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<Exported>>>);

impl Received {
    fn add(&self, request: ExportTraceServiceRequest) {
        let mut all = self.0.lock().unwrap();
        for rs in request.resource_spans {
            let service = rs
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                .and_then(|a| a.value.as_ref())
                .and_then(|v| match &v.value {
                    Some(Any::StringValue(s)) => Some(s.clone()),
                    _ => None,
                })
                .unwrap_or_default();
            for ss in rs.scope_spans {
                for span in ss.spans {
                    all.push(Exported {
                        service: service.clone(),
                        span,
                    });
                }
            }
        }
    }

    /// The spans of trace `trace` (hex), once one of each name in `names` arrived (the
    /// server's request span ends after its answer is sent, so it may come in a later
    /// export batch than the task's own last span).
    async fn trace(&self, trace: &str, names: &[&str]) -> Vec<Exported> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let spans: Vec<Exported> = self
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|e| hex(&e.span.trace_id) == trace)
                .cloned()
                .collect();
            if names
                .iter()
                .all(|name| spans.iter().any(|e| e.span.name == *name))
            {
                return spans;
            }
            let got: Vec<&str> = spans.iter().map(|e| e.span.name.as_str()).collect();
            assert!(
                Instant::now() < deadline,
                "not every span of {names:?} of trace {trace} arrived; got {got:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body.
async fn http_receiver() -> (String, Received) {
    use axum::body::Bytes;
    use axum::routing::post;
    let received = Received::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("an OTLP request");
                sink.add(request);
                (
                    [("content-type", "application/x-protobuf")],
                    ExportTraceServiceResponse::default().encode_to_vec(),
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), received)
}

/// The OTLP/gRPC receiver: `TraceService/Export`.
struct GrpcSink(Received);

#[tonic::async_trait]
impl TraceService for GrpcSink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.add(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

async fn grpc_receiver() -> (String, Received) {
    let received = Received::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = TraceServiceServer::new(GrpcSink(received.clone()));
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await
    });
    (format!("http://{addr}"), received)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn config_text(database_url: &str, telemetry: &str) -> String {
    format!(
        r#"
[database]
url = "{database_url}"

{telemetry}

[models.default]
provider = "dev"
model = "dev-1"

[budgets.standard]
max_steps_per_source = 50
sources_per_24_hours = 1000
scope_concurrent = 50
burst = 100
tasks_per_minute = 600

[apps.acme]
api_keys = ["{ACME}"]
default_budget = "standard"

[apps.open]
api_keys = ["{OPEN}"]
default_budget = "standard"
trace_content = true

[workers]
concurrency = 2
"#
    )
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a Any> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| v.value.as_ref())
}

fn text_attr(span: &Span, key: &str) -> Option<String> {
    match attr(span, key) {
        Some(Any::StringValue(s)) => Some(s.clone()),
        _ => None,
    }
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match attr(span, key) {
        Some(Any::IntValue(i)) => Some(*i),
        _ => None,
    }
}

fn named<'a>(spans: &'a [Exported], name: &str) -> &'a Span {
    let found: Vec<&Span> = spans
        .iter()
        .map(|e| &e.span)
        .filter(|s| s.name == name)
        .collect();
    assert_eq!(found.len(), 1, "one `{name}` span: {spans:#?}");
    found[0]
}

fn assert_child(child: &Span, parent: &Span) {
    assert_eq!(
        hex(&child.parent_span_id),
        hex(&parent.span_id),
        "`{}` is a child of `{}`",
        child.name,
        parent.name
    );
}

/// Every attribute value of the trace, as text.
fn all_text(spans: &[Exported]) -> String {
    spans
        .iter()
        .flat_map(|e| e.span.attributes.iter())
        .map(|a| format!("{}={:?}", a.key, a.value))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Submits a classify task as `key` with the caller's `traceparent`, waits for it, and
/// returns its view.
async fn submit_traced(s: &Server, key: &str, effect_key: &str) -> Value {
    let body = json!({
        "kind": "classify",
        "scope": "inbox",
        "source": {"id": "mail-1", "revision": effect_key},
        "request": {"input": SECRET, "labels": ["spam", "ham"]},
    });
    let response = s
        .http
        .post(format!("{}/v1/tasks?wait=20s", s.base))
        .bearer_auth(key)
        .header("idempotency-key", effect_key)
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&body)
        .send()
        .await
        .expect("the server answers");
    assert_eq!(response.status(), StatusCode::CREATED);
    let task: Value = response.json().await.unwrap();
    assert_eq!(task["status"], json!("succeeded"), "{task}");
    task
}

/// The tree one task's trace must have, under the caller's span.
fn assert_task_tree(spans: &[Exported], task_id: &str) {
    let http = named(spans, "POST /v1/tasks");
    assert_eq!(
        hex(&http.parent_span_id),
        CALLER_SPAN,
        "the caller's span is continued"
    );
    assert_eq!(http.kind, 2, "SERVER");
    assert_eq!(int_attr(http, "http.response.status_code"), Some(201));
    let submit = named(spans, "submit");
    assert_child(submit, http);
    let admission = named(spans, "admission");
    assert_child(admission, submit);
    assert_eq!(
        text_attr(admission, "tollgate.admission.decision").as_deref(),
        Some("created")
    );
    assert_eq!(
        text_attr(admission, "tollgate.task.id").as_deref(),
        Some(task_id)
    );
    let queue = named(spans, "queue");
    assert_child(queue, submit);
    assert!(queue.end_time_unix_nano >= queue.start_time_unix_nano);
    let execute = named(spans, "execute");
    assert_child(execute, submit);
    assert!(text_attr(execute, "tollgate.worker").is_some());
    let chat = named(spans, "chat dev-1");
    assert_child(chat, execute);
    assert_eq!(chat.kind, 3, "CLIENT");
    assert_eq!(text_attr(chat, "gen_ai.system").as_deref(), Some("dev"));
    assert_eq!(
        text_attr(chat, "gen_ai.operation.name").as_deref(),
        Some("chat")
    );
    assert_eq!(
        text_attr(chat, "gen_ai.request.model").as_deref(),
        Some("dev-1")
    );
    assert!(int_attr(chat, "gen_ai.usage.input_tokens").is_some_and(|t| t > 0));
    assert!(int_attr(chat, "gen_ai.usage.output_tokens").is_some_and(|t| t > 0));
    assert_eq!(int_attr(chat, "tollgate.attempt"), Some(0));
    let validate = named(spans, "validate");
    assert_child(validate, execute);
    assert_eq!(
        attr(validate, "tollgate.output.valid"),
        Some(&Any::BoolValue(true))
    );
    let settle = named(spans, "settle");
    assert_child(settle, execute);
    assert_eq!(
        text_attr(settle, "tollgate.outcome").as_deref(),
        Some("succeeded")
    );
    for e in spans {
        assert_eq!(e.service, "tollgate-under-test");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_over_http_protobuf_sqlite() {
    over_http("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_over_http_protobuf_postgres() {
    over_http("postgres").await;
}

/// The standard variables alone turn traces on (HTTP/protobuf); the app without
/// `trace_content` gets no prompt or output text in any span.
async fn over_http(backend: &str) {
    let (endpoint, received) = http_receiver().await;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ("OTEL_SERVICE_NAME", "tollgate-under-test"),
        ("OTEL_BSP_SCHEDULE_DELAY", "100"),
    ];
    let Some(s) = common::start_with_env(backend, "traces", |db| config_text(db, ""), &env) else {
        return;
    };
    let task = submit_traced(&s, ACME, "t-1").await;
    assert_eq!(task["trace_id"], json!(CALLER_TRACE), "{task}");
    let id = task["id"].as_str().unwrap();
    let spans = received
        .trace(CALLER_TRACE, &["settle", "POST /v1/tasks"])
        .await;
    assert_task_tree(&spans, id);
    let text = all_text(&spans);
    assert!(!text.contains(SECRET), "no prompt text by default:\n{text}");
    assert!(!text.contains("gen_ai.input.messages"), "{text}");
    assert!(!text.contains("gen_ai.output.messages"), "{text}");
    // The task read back carries the same trace id.
    let read: Value = s
        .http
        .get(format!("{}/v1/tasks/{id}", s.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(read["trace_id"], json!(CALLER_TRACE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_over_grpc_sqlite() {
    over_grpc("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn traces_over_grpc_postgres() {
    over_grpc("postgres").await;
}

/// `[telemetry]` in the file turns traces on (gRPC); the app with `trace_content = true`
/// gets its prompt and output on the provider call's span.
async fn over_grpc(backend: &str) {
    let (endpoint, received) = grpc_receiver().await;
    let telemetry = format!(
        "[telemetry]\nenabled = true\nprotocol = \"grpc\"\nendpoint = \"{endpoint}\"\n\
         service_name = \"tollgate-under-test\"\n"
    );
    let env = [("OTEL_BSP_SCHEDULE_DELAY", "100")];
    let Some(s) = common::start_with_env(backend, "traces", |db| config_text(db, &telemetry), &env)
    else {
        return;
    };
    let task = submit_traced(&s, OPEN, "g-1").await;
    assert_eq!(task["trace_id"], json!(CALLER_TRACE), "{task}");
    let spans = received
        .trace(CALLER_TRACE, &["settle", "POST /v1/tasks"])
        .await;
    assert_task_tree(&spans, task["id"].as_str().unwrap());
    let chat = named(&spans, "chat dev-1");
    let input = text_attr(chat, "gen_ai.input.messages").expect("the prompt, allowed");
    assert!(input.contains(SECRET), "{input}");
    let output = text_attr(chat, "gen_ai.output.messages").expect("the output, allowed");
    assert!(output.contains("label"), "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_telemetry_tasks_have_no_trace() {
    let Some(s) = common::start("sqlite", "traces", |db| config_text(db, "")) else {
        return;
    };
    let task = submit_traced(&s, ACME, "n-1").await;
    assert_eq!(task["trace_id"], Value::Null, "{task}");
}
