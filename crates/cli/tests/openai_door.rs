//! The OpenAI-compatible door end to end: the real `tollgate serve` binary, its model
//! calls going to a scripted fake OpenAI-compatible provider in this process that counts
//! them, on SQLite and (with `TOLLGATE_TEST_DATABASE_URL`) PostgreSQL.
//!
//! - Request-shape errors: each a 400 in OpenAI's error shape, with nothing stored and
//!   no provider call.
//! - A call that outlives the server's longest wait: a 504 naming the task.
//! - The official SDKs (`tests/openai-sdk/`: the `openai` Python package under pytest,
//!   the `openai` npm package under `node --test`), unchanged except for base URL and
//!   key. With `TOLLGATE_REQUIRE_OPENAI_SDKS=1` (CI) a missing SDK fails the test;
//!   otherwise it is skipped with a printed notice.

use axum::extract::State;
use axum::routing::{get, post};
use axum::{Json, Router};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Arc, Mutex};

#[macro_use]
mod common;
use common::Server;

const ACME: &str = "acme-key-0123456789abcdef";
const BETA: &str = "beta-key-0123456789abcdef";

/// What the fake provider has seen.
#[derive(Default)]
struct Seen {
    count: u64,
    last: Option<Value>,
    /// Lets a `gated:` stream send its last piece (`POST /release`).
    release: Arc<tokio::sync::Notify>,
}

/// A scripted OpenAI-compatible chat completions server on 127.0.0.1.
struct FakeProvider {
    url: String,
    seen: Arc<Mutex<Seen>>,
}

impl FakeProvider {
    async fn start() -> FakeProvider {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let app = Router::new()
            .route("/v1/chat/completions", post(fake_completion))
            .route("/calls", get(fake_calls))
            .route(
                "/release",
                post(|State(seen): State<Arc<Mutex<Seen>>>| async move {
                    seen.lock().unwrap().release.notify_one();
                }),
            )
            .with_state(seen.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        FakeProvider { url, seen }
    }

    fn count(&self) -> u64 {
        self.seen.lock().unwrap().count
    }
}

/// How long the fake takes for a last message starting with `slow:`: longer than the
/// server's `max_wait` (6 s), so the first wait of such a call times out.
const SLOW_ANSWER: std::time::Duration = std::time::Duration::from_secs(8);

/// `json_schema` → a person; `json_object` → `{"ok": true}`; text → an echo of the last
/// message (after [`SLOW_ANSWER`] for `slow:` messages). Always 11 prompt and 7
/// completion tokens.
async fn fake_completion(
    State(seen): State<Arc<Mutex<Seen>>>,
    Json(body): Json<Value>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default();
    if body["stream"] == true && last.starts_with("gated:") {
        return gated_stream(seen, body);
    }
    if body.get("tools").is_some() {
        let message = tool_answer(&body);
        {
            let mut s = seen.lock().unwrap();
            s.count += 1;
            s.last = Some(body);
        }
        let finish = if message.get("tool_calls").is_some() {
            "tool_calls"
        } else {
            "stop"
        };
        return Json(json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1, "model": "fake-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
        }))
        .into_response();
    }
    let content = match body
        .pointer("/response_format/type")
        .and_then(Value::as_str)
    {
        Some("json_schema") => r#"{"name": "Ada Lovelace", "year": 1815}"#.to_string(),
        Some("json_object") => r#"{"ok": true}"#.to_string(),
        _ => {
            let last = body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .and_then(|m| m["content"].as_str())
                .unwrap_or_default();
            format!("fake answer to: {last}")
        }
    };
    let slow = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .is_some_and(|c| c.starts_with("slow:"));
    if slow {
        tokio::time::sleep(SLOW_ANSWER).await;
    }
    {
        let mut s = seen.lock().unwrap();
        s.count += 1;
        s.last = Some(body);
    }
    Json(json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
                  "prompt_tokens_details": {"cached_tokens": 4}}
    }))
    .into_response()
}

/// A streamed answer (`gated:` messages): "piece one " and "piece two " at once, then —
/// once the test posts `/release` — "the end", the finish, the usage (11 + 3 tokens)
/// and `[DONE]`. A client that reads a piece before releasing proves the stream is live.
fn gated_stream(seen: Arc<Mutex<Seen>>, body: Value) -> axum::response::Response {
    use axum::response::IntoResponse;
    let release = {
        let mut s = seen.lock().unwrap();
        s.count += 1;
        s.last = Some(body);
        s.release.clone()
    };
    let chunk = |delta: Value, finish: Value| {
        let c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                       "model": "fake-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        Ok::<_, std::io::Error>(format!("data: {c}\n\n"))
    };
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tokio::spawn(async move {
        let _ = tx
            .send(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            ))
            .await;
        let _ = tx
            .send(chunk(json!({"content": "piece one "}), Value::Null))
            .await;
        let _ = tx
            .send(chunk(json!({"content": "piece two "}), Value::Null))
            .await;
        release.notified().await;
        let _ = tx
            .send(chunk(json!({"content": "the end"}), Value::Null))
            .await;
        let _ = tx.send(chunk(json!({}), json!("stop"))).await;
        let usage = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "choices": [],
                           "usage": {"prompt_tokens": 11, "completion_tokens": 3, "total_tokens": 14}});
        let _ = tx
            .send(Ok(format!("data: {usage}\n\ndata: [DONE]\n\n")))
            .await;
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut response = axum::body::Body::from_stream(body).into_response();
    response.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("text/event-stream"),
    );
    response
}

/// With tools: after tool results, a text answer quoting them; otherwise a call of each
/// of the first two tools at once (one with `parallel_tool_calls: false`), every
/// required argument the string "Paris".
fn tool_answer(body: &Value) -> Value {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let results: Vec<String> = messages
        .iter()
        .rev()
        .take_while(|m| m["role"] == "tool")
        .map(|m| {
            format!(
                "{}={}",
                m["tool_call_id"].as_str().unwrap_or(""),
                m["content"].as_str().unwrap_or("")
            )
        })
        .collect();
    if !results.is_empty() {
        let mut results = results;
        results.reverse();
        return json!({"role": "assistant", "content": format!("fake answer to tool results: {}", results.join(", "))});
    }
    let take = if body["parallel_tool_calls"] == false {
        1
    } else {
        2
    };
    let calls: Vec<Value> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .take(take)
        .enumerate()
        .map(|(i, tool)| {
            let mut arguments = serde_json::Map::new();
            for name in tool["function"]["parameters"]["required"].as_array().into_iter().flatten() {
                arguments.insert(name.as_str().unwrap_or("").to_string(), json!("Paris"));
            }
            json!({"id": format!("call_{i}"), "type": "function",
                   "function": {"name": tool["function"]["name"], "arguments": Value::Object(arguments).to_string()}})
        })
        .collect();
    json!({"role": "assistant", "content": null, "tool_calls": calls})
}

async fn fake_calls(State(seen): State<Arc<Mutex<Seen>>>) -> Json<Value> {
    let s = seen.lock().unwrap();
    Json(json!({"count": s.count, "last": s.last}))
}

fn config_text(database_url: &str, provider_url: &str) -> String {
    format!(
        r#"
[server]
max_wait = "6s"

[database]
url = "{database_url}"

[models.default]
provider = "fake"
model = "fake-model"

[models.slow]
provider = "dev"
model = "dev-1"
params = {{ latency_ms = 60000 }}

[models.embed]
provider = "dev"
model = "dev-embed"
params = {{ dimensions = 8 }}

[providers.fake]
kind = "openai"
base_url = "{provider_url}/v1"
max_retries = 0

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
burst = 1
tasks_per_minute = 1

[budgets.five]
max_steps_per_source = 50
sources_per_24_hours = 5
scope_concurrent = 50
burst = 100
tasks_per_minute = 600

[apps.acme]
api_keys = ["{ACME}"]
default_budget = "standard"
allowed_budgets = ["standard", "tight", "five"]

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

async fn start(backend: &str, fake: &FakeProvider) -> Option<Server> {
    let url = fake.url.clone();
    common::start(backend, "openai", |db| config_text(db, &url))
}

impl Server {
    async fn chat(
        &self,
        key: Option<&str>,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> (StatusCode, reqwest::header::HeaderMap, Value) {
        let mut rb = self
            .http
            .post(format!("{}/openai/v1/chat/completions", self.base))
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = key {
            rb = rb.bearer_auth(k);
        }
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        let response = rb.send().await.expect("the server answers");
        let status = response.status();
        let headers = response.headers().clone();
        let text = response.text().await.unwrap();
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, headers, value)
    }

    async fn embeddings(
        &self,
        key: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> (StatusCode, Value) {
        let mut rb = self
            .http
            .post(format!("{}/openai/v1/embeddings", self.base))
            .bearer_auth(key)
            .json(body);
        for (k, v) in headers {
            rb = rb.header(*k, *v);
        }
        let response = rb.send().await.expect("the server answers");
        let status = response.status();
        (status, response.json().await.unwrap_or(Value::Null))
    }

    async fn task_by_key(&self, effect_key: &str) -> StatusCode {
        self.http
            .get(format!("{}/v1/tasks?effect_key={effect_key}", self.base))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap()
            .status()
    }
}

/// An error answer in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
#[track_caller]
fn assert_openai_error(body: &Value, ty: &str, param: Option<&str>, code: &str) {
    let e = &body["error"];
    let keys: Vec<&String> = e.as_object().expect("an error object").keys().collect();
    assert_eq!(keys.len(), 4, "{body}");
    assert!(
        e["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert_eq!(e["type"], ty, "{body}");
    assert_eq!(e["param"].as_str(), param, "{body}");
    assert_eq!(e["code"], code, "{body}");
}

fn chat() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

fn with(extra: Value) -> Value {
    let mut body = json!({"model": "default", "messages": chat()});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

on_both_backends!(
    embeddings_are_answered_in_openai_shape,
    request_shape_errors_are_400_in_openai_shape_and_store_nothing,
    a_call_answers_a_chat_completion_backed_by_a_task,
    a_call_longer_than_the_longest_wait_names_its_task,
    the_official_sdks_work_unchanged,
    calls_without_a_source_are_unsourced,
    a_tool_call_round_trip_is_a_chat_task,
);

/// Issue 30: `tools` make a `chat` task; the answer is OpenAI's tool-call shape; the
/// client's tool results in the next call make a text answer.
async fn a_tool_call_round_trip_is_a_chat_task(backend: &str) {
    let fake = FakeProvider::start().await;
    let Some(server) = start(backend, &fake).await else {
        return;
    };
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ]);
    let question = json!({"role": "user", "content": "Weather and time in Paris?"});
    let body = json!({"model": "default", "messages": [question], "tools": tools});
    let (status, headers, answer) = server
        .chat(
            Some(ACME),
            &[("idempotency-key", "tools-1")],
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    assert!(choice["message"]["content"].is_null(), "{answer}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 2, "{answer}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[1]["function"]["arguments"], "{\"city\":\"Paris\"}");
    let sent = fake.seen.lock().unwrap().last.clone().unwrap();
    assert_eq!(
        sent["tools"], tools,
        "the tools reach the provider as given"
    );
    let id = headers["x-tollgate-task-id"].to_str().unwrap().to_string();
    let task: Value = server
        .http
        .get(format!("{}/v1/tasks/{id}", server.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(task["kind"], "chat", "{task}");
    assert_eq!(task["output"]["tool_calls"], json!(calls));

    // A replay of the same key answers the same calls without a provider call.
    let before = fake.count();
    let (_, _, replay) = server
        .chat(
            Some(ACME),
            &[("idempotency-key", "tools-1")],
            serde_json::to_vec(&body).unwrap(),
        )
        .await;
    assert_eq!(replay["choices"][0]["message"]["tool_calls"], json!(calls));
    assert_eq!(fake.count(), before);

    // The client ran both tools: their results make a text answer.
    let mut follow_up = body.clone();
    follow_up["messages"] = json!([
        question,
        choice["message"],
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "Sunny"},
        {"role": "tool", "tool_call_id": calls[1]["id"], "content": "10:00"}
    ]);
    let (status, _, answer) = server
        .chat(Some(ACME), &[], serde_json::to_vec(&follow_up).unwrap())
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "fake answer to tool results: call_0=Sunny, call_1=10:00"
    );
    let sent = fake.seen.lock().unwrap().last.clone().unwrap();
    assert_eq!(sent["messages"][1]["tool_calls"], json!(calls));
    assert_eq!(
        sent["messages"][2],
        json!({"role": "tool", "tool_call_id": "call_0", "content": "Sunny"})
    );

    // Streamed, the calls arrive as one tool_calls delta with their indexes.
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    streamed["parallel_tool_calls"] = json!(false);
    let response = server
        .http
        .post(format!("{}/openai/v1/chat/completions", server.base))
        .bearer_auth(ACME)
        .json(&streamed)
        .send()
        .await
        .unwrap();
    let text = response.text().await.unwrap();
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"].get("tool_calls"))
        .collect();
    assert_eq!(deltas.len(), 1, "{text}");
    assert_eq!(deltas[0][0]["index"], 0, "{text}");
    assert_eq!(
        deltas[0].as_array().unwrap().len(),
        1,
        "one call without parallel calls"
    );
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "tool_calls", "{text}");
}

/// Issue 26 item 2: with `sources_per_24_hours = 5`, six calls without
/// `X-Tollgate-Source` are all answered (a call without a source is unsourced, not a new
/// source); with the header each names a source, and the sixth new one is refused.
async fn calls_without_a_source_are_unsourced(backend: &str) {
    let fake = FakeProvider::start().await;
    let Some(server) = start(backend, &fake).await else {
        return;
    };
    let body = serde_json::to_vec(&with(json!({}))).unwrap();
    let policy = [("x-tollgate-budget", "five"), ("x-tollgate-scope", "five")];
    for i in 0..6 {
        let (status, headers, answer) = server.chat(Some(ACME), &policy, body.clone()).await;
        assert_eq!(status, StatusCode::OK, "call {i}: {answer}");
        let id = headers["x-tollgate-task-id"].to_str().unwrap().to_string();
        let task: Value = server
            .http
            .get(format!("{}/v1/tasks/{id}", server.base))
            .bearer_auth(ACME)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(task["source"].is_null(), "{task}");
    }
    for i in 0..6 {
        let source = format!("mailbox-{i}");
        let mut headers = policy.to_vec();
        headers.push(("x-tollgate-source", source.as_str()));
        let (status, _, answer) = server.chat(Some(ACME), &headers, body.clone()).await;
        if i < 5 {
            assert_eq!(status, StatusCode::OK, "source {i}: {answer}");
        } else {
            assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{answer}");
            assert_eq!(
                answer["error"]["code"], "WORKFLOW_AI_DAILY_BUDGET",
                "{answer}"
            );
        }
    }
}

async fn request_shape_errors_are_400_in_openai_shape_and_store_nothing(backend: &str) {
    let fake = FakeProvider::start().await;
    let Some(server) = start(backend, &fake).await else {
        return;
    };
    let user = |content: Value| json!([{"role": "user", "content": content}]);
    let cases: Vec<(Value, Option<&str>, &str)> = vec![
        (
            with(json!({"tools": [{"type": "function", "function": {"name": "has space"}}]})),
            Some("tools[0].function.name"),
            "invalid_request",
        ),
        (
            with(
                json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]}),
            ),
            Some("tools[0].function.parameters"),
            "invalid_request",
        ),
        (
            with(
                json!({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}),
            ),
            Some("tool_choice.function.name"),
            "invalid_request",
        ),
        (
            with(json!({"tool_choice": "auto"})),
            Some("tool_choice"),
            "invalid_request",
        ),
        (
            with(json!({"functions": [{"name": "f"}]})),
            Some("functions"),
            "unsupported_parameter",
        ),
        (
            with(json!({"audio": {"voice": "alloy", "format": "wav"}})),
            Some("audio"),
            "unsupported_parameter",
        ),
        (
            with(json!({"modalities": ["text", "audio"]})),
            Some("modalities"),
            "unsupported_parameter",
        ),
        (with(json!({"n": 2})), Some("n"), "unsupported_parameter"),
        (
            with(json!({"logprobs": true})),
            Some("logprobs"),
            "unsupported_parameter",
        ),
        (
            with(json!({"top_logprobs": 2})),
            Some("top_logprobs"),
            "unsupported_parameter",
        ),
        (
            with(json!({"frobnicate": 1})),
            Some("frobnicate"),
            "unsupported_parameter",
        ),
        (
            with(
                json!({"messages": user(json!([{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]))}),
            ),
            Some("messages[0].content[0]"),
            "unsupported_parameter",
        ),
        (
            with(
                json!({"messages": user(json!([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]))}),
            ),
            Some("messages[0].content[0]"),
            "unsupported_parameter",
        ),
        (
            with(json!({"messages": [{"role": "tool", "tool_call_id": "c1", "content": "42"}]})),
            Some("messages[0].tool_call_id"),
            "invalid_request",
        ),
        (
            with(json!({"messages": [{"role": "tool", "content": "42"}]})),
            Some("messages[0]"),
            "invalid_request",
        ),
        (
            with(
                json!({"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "c1"}]}]}),
            ),
            Some("messages[0].tool_calls[0]"),
            "invalid_request",
        ),
        (
            with(json!({"messages": [{"role": "user", "name": "ada", "content": "hi"}]})),
            Some("messages[0].name"),
            "unsupported_parameter",
        ),
        (
            json!({"model": "default"}),
            Some("messages"),
            "invalid_request",
        ),
        (
            with(json!({"messages": []})),
            Some("messages"),
            "invalid_request",
        ),
        (
            with(json!({"temperature": 5})),
            Some("temperature"),
            "invalid_request",
        ),
        (with(json!({"top_p": 0})), Some("top_p"), "invalid_request"),
        (
            with(json!({"stop": ["a", "b", "c", "d", "e"]})),
            Some("stop"),
            "invalid_request",
        ),
        (
            with(json!({"max_tokens": 0})),
            Some("max_tokens"),
            "invalid_request",
        ),
        (
            with(json!({"seed": "seven"})),
            Some("seed"),
            "invalid_request",
        ),
        (
            with(json!({"stream_options": {"include_usage": true}})),
            Some("stream_options"),
            "invalid_request",
        ),
        (
            with(
                json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}}),
            ),
            Some("response_format.json_schema.name"),
            "invalid_request",
        ),
        (
            with(
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}}),
            ),
            Some("response_format.json_schema.schema"),
            "invalid_request",
        ),
        (
            with(json!({"response_format": {"type": "yaml"}})),
            Some("response_format.type"),
            "invalid_request",
        ),
        (
            with(json!({"metadata": {"k": 1}})),
            Some("metadata.k"),
            "invalid_request",
        ),
        (json!(["not", "an", "object"]), None, "invalid_request"),
    ];
    for (i, (body, param, code)) in cases.iter().enumerate() {
        let key = format!("bad-{i}");
        let (status, _, answer) = server
            .chat(
                Some(ACME),
                &[("idempotency-key", &key)],
                serde_json::to_vec(body).unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} → {answer}");
        assert_openai_error(&answer, "invalid_request_error", *param, code);
        assert_eq!(
            server.task_by_key(&format!("openai-{key}")).await,
            StatusCode::NOT_FOUND,
            "{body} stored a task"
        );
    }
    // Not JSON at all.
    let (status, _, answer) = server.chat(Some(ACME), &[], b"{not json".to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_openai_error(&answer, "invalid_request_error", None, "invalid_request");
    // An unknown model is OpenAI's 404, an unknown key its 401, both in the same shape.
    let (status, _, answer) = server
        .chat(
            Some(ACME),
            &[("idempotency-key", "bad-model")],
            serde_json::to_vec(&json!({"model": "gpt-9", "messages": chat()})).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_openai_error(&answer, "not_found_error", Some("model"), "model_not_found");
    assert_eq!(
        server.task_by_key("openai-bad-model").await,
        StatusCode::NOT_FOUND
    );
    let (status, _, answer) = server
        .chat(
            Some("nobody-0123456789abcdef"),
            &[],
            serde_json::to_vec(&with(json!({}))).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_openai_error(&answer, "authentication_error", None, "unauthorized");
    // A budget policy the app may not use, from the header.
    let (status, _, answer) = server
        .chat(
            Some(BETA),
            &[("x-tollgate-budget", "tight")],
            serde_json::to_vec(&with(json!({}))).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "budget_not_allowed");
    // A path the door does not have.
    let response = server
        .http
        .post(format!("{}/openai/v1/audio/speech", server.base))
        .bearer_auth(ACME)
        .json(&json!({"model": "default", "input": "x", "voice": "alloy"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let answer: Value = response.json().await.unwrap();
    assert_openai_error(&answer, "not_found_error", None, "not_found");
    // A key named twice is ambiguous, as on /v1/tasks (it ran the last one before).
    let (status, headers, answer) = server
        .chat(
            Some(ACME),
            &[("idempotency-key", "dup-json")],
            br#"{"model":"slow","model":"default","messages":[{"role":"user","content":"hi"}]}"#
                .to_vec(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["code"], "ambiguous_request", "{answer}");
    assert!(
        headers.contains_key("x-request-id"),
        "door answers carry x-request-id"
    );
    assert_eq!(server.task_by_key("dup-json").await, StatusCode::NOT_FOUND);
    // Repeated headers are ambiguous too (the first one counted before).
    for name in ["idempotency-key", "x-tollgate-scope", "x-tollgate-source"] {
        let (status, _, answer) = server
            .chat(
                Some(ACME),
                &[(name, "one"), (name, "two")],
                serde_json::to_vec(&with(json!({}))).unwrap(),
            )
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {answer}");
        assert_eq!(
            answer["error"]["code"], "ambiguous_request",
            "{name}: {answer}"
        );
    }
    // A method a door route does not take: 405 with the error body.
    let response = server
        .http
        .delete(format!("{}/openai/v1/chat/completions", server.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert!(response.headers().contains_key("x-request-id"));
    let answer: Value = response.json().await.expect("a JSON body");
    assert_eq!(answer["error"]["code"], "method_not_allowed", "{answer}");
    assert_eq!(fake.count(), 0, "no refused call reached the provider");
}

async fn a_call_answers_a_chat_completion_backed_by_a_task(backend: &str) {
    let fake = FakeProvider::start().await;
    let Some(server) = start(backend, &fake).await else {
        return;
    };
    let body = serde_json::to_vec(&with(json!({
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "door"}]}],
        "response_format": {"type": "text"}
    })))
    .unwrap();
    let (status, headers, answer) = server
        .chat(
            Some(ACME),
            &[
                ("idempotency-key", "hello-1"),
                ("x-tollgate-scope", "customer-7"),
            ],
            body.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let task_id = headers["x-tollgate-task-id"].to_str().unwrap().to_string();
    assert_eq!(answer["id"], format!("chatcmpl-{task_id}"));
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        "fake answer to: Hello, door"
    );
    // The provider's prompt-cache count is recorded and shown (cached tokens where known).
    assert_eq!(
        answer["usage"],
        json!({"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18,
               "prompt_tokens_details": {"cached_tokens": 4}})
    );
    // The task behind it, seen through Tollgate's own API.
    let task: Value = server
        .http
        .get(format!("{}/v1/tasks/{task_id}", server.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(task["effect_key"], "openai-hello-1");
    assert_eq!(task["kind"], "generate_text");
    assert_eq!(task["step"], "openai-chat");
    assert_eq!(task["scope"], "customer-7");
    assert_eq!(task["status"], "succeeded");
    // No X-Tollgate-Source: the call is unsourced (docs/budgets.md).
    assert!(task["source"].is_null(), "{task}");
    // Replayed: the same answer, no second provider call.
    let (status, _, again) = server
        .chat(
            Some(ACME),
            &[
                ("idempotency-key", "hello-1"),
                ("x-tollgate-scope", "customer-7"),
            ],
            body,
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again, answer);
    assert_eq!(fake.count(), 1);
    // The same key with another request: the engine's conflict, in OpenAI's shape, naming
    // the key's task, and no provider call.
    let (status, headers, conflict) = server
        .chat(
            Some(ACME),
            &[
                ("idempotency-key", "hello-1"),
                ("x-tollgate-scope", "customer-7"),
            ],
            serde_json::to_vec(&with(json!({}))).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{conflict}");
    assert_openai_error(
        &conflict,
        "invalid_request_error",
        None,
        "idempotency_key_conflict",
    );
    assert!(
        conflict["error"]["message"]
            .as_str()
            .unwrap()
            .contains("different request"),
        "{conflict}"
    );
    assert_eq!(headers["x-tollgate-task-id"].to_str().unwrap(), task_id);
    assert_eq!(headers["x-should-retry"], "false");
    assert_eq!(fake.count(), 1);
    // The same key from another app is another app's call.
    let (status, headers, other) = server
        .chat(
            Some(BETA),
            &[("idempotency-key", "hello-1")],
            serde_json::to_vec(&with(json!({}))).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{other}");
    assert_ne!(headers["x-tollgate-task-id"].to_str().unwrap(), task_id);
    assert_eq!(fake.count(), 2);
    // json_object runs as extract_data: JSON mode at the provider, an object back.
    let (status, _, json_answer) = server
        .chat(
            Some(ACME),
            &[],
            serde_json::to_vec(&with(json!({"response_format": {"type": "json_object"}}))).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json_answer}");
    let content: Value = serde_json::from_str(
        json_answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(content, json!({"ok": true}));
    // A json_schema answer that breaks the schema is asked again, a bounded number of
    // times, and never answered as a success.
    let before = fake.count();
    let strict = json!({"type": "json_schema", "json_schema": {"name": "place", "schema": {
        "type": "object", "properties": {"city": {"type": "string"}},
        "required": ["city"], "additionalProperties": false
    }}});
    let (status, headers, failed) = server
        .chat(
            Some(ACME),
            &[("idempotency-key", "place-1")],
            serde_json::to_vec(&with(json!({"response_format": strict}))).unwrap(),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{failed}");
    assert_openai_error(&failed, "server_error", None, "invalid_model_output");
    assert_eq!(headers["x-should-retry"], "false");
    assert_eq!(fake.count(), before + 3, "one call and two re-asks");
    // Streaming: the chunks and [DONE], as server-sent events.
    let response = server
        .http
        .post(format!("{}/openai/v1/chat/completions", server.base))
        .bearer_auth(ACME)
        .json(&with(json!({"stream": true})))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"),
        "{:?}",
        response.headers()
    );
    let text = response.text().await.unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"), "{text}");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(streamed, "fake answer to: hi");
    assert!(
        chunks.iter().all(|c| c.get("usage").is_none()),
        "no usage unless asked"
    );
}

async fn a_call_longer_than_the_longest_wait_names_its_task(backend: &str) {
    let fake = FakeProvider::start().await;
    let Some(server) = start(backend, &fake).await else {
        return;
    };
    let body = serde_json::to_vec(&json!({"model": "slow", "messages": chat()})).unwrap();
    let (status, headers, answer) = server
        .chat(Some(ACME), &[("idempotency-key", "slow-1")], body.clone())
        .await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{answer}");
    assert_openai_error(&answer, "timeout_error", None, "task_pending");
    let task_id = headers["x-tollgate-task-id"].to_str().unwrap().to_string();
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&task_id)
    );
    // With a key, the SDKs' own retry picks the same task up again.
    assert_eq!(headers["x-should-retry"], "true");
    let canceled = server
        .http
        .post(format!("{}/v1/tasks/{task_id}/cancel", server.base))
        .bearer_auth(ACME)
        .send()
        .await
        .unwrap();
    assert_eq!(canceled.status(), StatusCode::OK);
    // The replay answers the task as it ended, and says a retry cannot change it.
    let (status, headers, answer) = server
        .chat(Some(ACME), &[("idempotency-key", "slow-1")], body)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{answer}");
    assert_openai_error(
        &answer,
        "invalid_request_error",
        None,
        "WORKFLOW_AI_CANCELED",
    );
    assert_eq!(headers["x-tollgate-task-id"].to_str().unwrap(), task_id);
    assert_eq!(headers["x-should-retry"], "false");
}

/// `tests/openai-sdk/` in the repository.
fn sdk_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/openai-sdk")
}

/// Whether a runner is installed; without it the test fails in CI and is skipped (with a
/// notice) elsewhere.
fn runner_available(what: &str, probe: &mut Command) -> bool {
    let ok = probe.output().is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var("TOLLGATE_REQUIRE_OPENAI_SDKS").is_ok_and(|v| v == "1") {
            panic!(
                "TOLLGATE_REQUIRE_OPENAI_SDKS=1 but {what} is not installed (see tests/openai-sdk/)"
            );
        }
        eprintln!("skipping the {what} tests: not installed (see tests/openai-sdk/)");
    }
    ok
}

async fn run_sdk_tests(server: &Server, fake: &FakeProvider, what: &str, mut command: Command) {
    command
        .current_dir(sdk_dir())
        .env(
            "TOLLGATE_OPENAI_BASE_URL",
            format!("{}/openai/v1", server.base),
        )
        .env("TOLLGATE_ACME_KEY", ACME)
        .env("TOLLGATE_BETA_KEY", BETA)
        .env("TOLLGATE_FAKE_PROVIDER_URL", &fake.url)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        // The SDKs must not pick up a real key or endpoint from the environment.
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL");
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("{what} runs: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{what}:\n{stdout}\n{stderr}");
    assert!(
        output.status.success(),
        "{what} failed:\n{stdout}\n{stderr}"
    );
}

async fn the_official_sdks_work_unchanged(backend: &str) {
    let python = runner_available(
        "openai Python package",
        Command::new("python3").args(["-c", "import openai, pytest"]),
    );
    let node = runner_available(
        "openai npm package",
        Command::new("node")
            .current_dir(sdk_dir())
            .args(["-e", "require.resolve('openai')"]),
    );
    if !python && !node {
        return;
    }
    let fake = FakeProvider::start().await;
    let Some(server) = start(backend, &fake).await else {
        return;
    };
    if python {
        let mut pytest = Command::new("python3");
        pytest.args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "test_openai_sdk.py",
        ]);
        run_sdk_tests(&server, &fake, "pytest (openai Python SDK)", pytest).await;
    }
    if node {
        let mut node_test = Command::new("node");
        node_test.args(["--test", "openai_sdk.test.mjs"]);
        run_sdk_tests(&server, &fake, "node --test (openai npm SDK)", node_test).await;
    }
}

/// `POST /openai/v1/embeddings`: OpenAI's answer shape (floats and base64), the item
/// cache (a second call of the same texts is charged nothing), a replayed key answering
/// the same task, and refusals in OpenAI's shape that store nothing.
async fn embeddings_are_answered_in_openai_shape(backend: &str) {
    let fake = FakeProvider::start().await;
    let Some(s) = start(backend, &fake).await else {
        return;
    };
    let body = json!({"model": "embed", "input": ["first text", "second text"]});
    let key = [("idempotency-key", "emb-1")];
    let (st, a) = s.embeddings(ACME, &key, &body).await;
    assert_eq!(st, StatusCode::OK, "{a}");
    assert_eq!(a["object"], "list");
    assert_eq!(a["model"], "embed");
    let data = a["data"].as_array().unwrap();
    assert_eq!(data.len(), 2);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["object"], "embedding");
        assert_eq!(d["index"], i);
        assert_eq!(d["embedding"].as_array().unwrap().len(), 8);
    }
    let tokens = a["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(tokens > 0);
    assert_eq!(a["usage"]["total_tokens"], tokens);
    assert_eq!(s.task_by_key("openai-emb-1").await, StatusCode::OK);
    // The same key again: the same task and answer.
    let (st, again) = s.embeddings(ACME, &key, &body).await;
    assert_eq!((st, &again), (StatusCode::OK, &a));
    // Other calls with the same texts: every vector from the item cache, nothing charged;
    // base64 is the same vectors' little-endian f32 bytes.
    let (st, b) = s
        .embeddings(ACME, &[], &json!({"model": "embed", "input": ["second text", "first text"], "encoding_format": "base64"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    assert_eq!(b["usage"]["prompt_tokens"], 0);
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b["data"][1]["embedding"].as_str().unwrap())
        .unwrap();
    let decoded: Vec<f64> = bytes
        .chunks(4)
        .map(|c| f64::from(f32::from_le_bytes(c.try_into().unwrap())))
        .collect();
    let floats: Vec<f64> = data[0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| f64::from(x.as_f64().unwrap() as f32))
        .collect();
    assert_eq!(decoded, floats);
    // Refusals: 400 in OpenAI's shape, nothing stored.
    for (bad, param, code) in [
        (
            json!({"model": "embed", "input": [[1, 2, 3]]}),
            "input",
            "unsupported_parameter",
        ),
        (
            json!({"model": "embed", "input": []}),
            "input",
            "invalid_request",
        ),
        (json!({"model": "embed"}), "input", "invalid_request"),
        (
            json!({"model": "embed", "input": "x", "encoding_format": "int8"}),
            "encoding_format",
            "invalid_request",
        ),
        (
            json!({"model": "embed", "input": "x", "dimensions": 0}),
            "dimensions",
            "invalid_request",
        ),
    ] {
        let (st, e) = s
            .embeddings(ACME, &[("idempotency-key", "emb-bad")], &bad)
            .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{bad}: {e}");
        assert_openai_error(&e, "invalid_request_error", Some(param), code);
        assert_eq!(s.task_by_key("openai-emb-bad").await, StatusCode::NOT_FOUND);
    }
    let (st, e) = s
        .embeddings(ACME, &[], &json!({"model": "nope", "input": "x"}))
        .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{e}");
    assert_eq!(
        fake.count(),
        0,
        "the dev model answered; the fake saw nothing"
    );
}
