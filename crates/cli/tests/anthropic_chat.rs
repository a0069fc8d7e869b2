//! Issue 30: the `chat` kind on an Anthropic route end to end — the real `tollgate serve`
//! binary, called through the OpenAI-compatible door with `tools`, its model calls going
//! over HTTP to a scripted fake of Anthropic's Messages API in this process — on SQLite
//! and (with `TOLLGATE_TEST_DATABASE_URL`) PostgreSQL.
//!
//! The fake answers a question with two parallel `tool_use` blocks and the tool results
//! (`tool_result` blocks) with text. The test checks what Anthropic is sent (tools with
//! `input_schema`, `tool_choice`, the round trip's `tool_use` / `tool_result` blocks),
//! what the client gets (OpenAI's `tool_calls`, then the text), and the usage and cost
//! recorded on each task and its attempt (cache reads and writes priced at their own
//! prices).

use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::post;
use axum::{Json, Router};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

#[macro_use]
mod common;
use common::Server;

const KEY: &str = "acme-key-0123456789abcdef";
const ANTHROPIC_KEY: &str = "sk-ant-test-0123456789";

on_both_backends!(an_anthropic_chat_calls_tools_in_parallel_and_answers_their_results);

/// The requests the fake received: (headers, body).
type Seen = Arc<Mutex<Vec<(HeaderMap, Value)>>>;

/// A scripted Messages API: tool results → text; otherwise two `tool_use` blocks. Usage:
/// 100 input tokens, 1,000 read from the prompt cache, 200 written to it, 30 output.
async fn messages(
    State(seen): State<Seen>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> Json<Value> {
    let answers_results = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_array())
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"));
    seen.lock().unwrap().push((headers, body));
    let (content, stop_reason) = if answers_results {
        (
            json!([{"type": "text", "text": "Sunny in Paris; it is 10:00 there."}]),
            "end_turn",
        )
    } else {
        (
            json!([
                {"type": "text", "text": "Let me look both up."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
                {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {"city": "Paris"}}
            ]),
            "tool_use",
        )
    };
    Json(json!({
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": content, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": 100, "output_tokens": 30,
                  "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 200}
    }))
}

async fn fake_anthropic() -> (String, Seen) {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route("/v1/messages", post(messages))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, seen)
}

fn config_text(database_url: &str, anthropic_url: &str) -> String {
    format!(
        r#"
default_model = "claude"

[database]
url = "{database_url}"

[models.claude]
provider = "claude"
model = "claude-sonnet-4-5"
max_output_tokens = 512
prices = {{ input_per_million = 3.0, output_per_million = 15.0, cached_input_per_million = 0.3, cache_write_input_per_million = 3.75 }}

[providers.claude]
kind = "anthropic"
base_url = "{anthropic_url}"
api_key_env = "TOLLGATE_TEST_ANTHROPIC_KEY"
max_retries = 0

[apps.acme]
api_keys = ["{KEY}"]

[workers]
concurrency = 2
heartbeat_interval = "200ms"
"#
    )
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    ])
}

async fn chat(server: &Server, body: &Value) -> (String, Value) {
    let response = server
        .http
        .post(format!("{}/openai/v1/chat/completions", server.base))
        .bearer_auth(KEY)
        .json(body)
        .send()
        .await
        .expect("the server answers");
    let status = response.status();
    let id = response
        .headers()
        .get("x-tollgate-task-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{answer}");
    (id, answer)
}

async fn task(server: &Server, id: &str) -> Value {
    server
        .http
        .get(format!("{}/v1/tasks/{id}", server.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// 100 × $3 + 1,000 × $0.30 + 200 × $3.75 + 30 × $15 per million tokens.
const CALL_COST_USD: f64 = 0.0018;

#[track_caller]
fn assert_usage_and_cost(task: &Value) {
    assert_eq!(task["status"], "succeeded", "{task}");
    let usage = &task["usage"];
    assert_eq!(usage["input_tokens"], 1300, "{task}");
    assert_eq!(usage["output_tokens"], 30, "{task}");
    assert_eq!(usage["cached_input_tokens"], 1000, "{task}");
    let cost = usage["cost_usd"].as_f64().expect("a cost");
    assert!((cost - CALL_COST_USD).abs() < 1e-9, "{cost} in {task}");
    let attempts = task["attempts"].as_array().expect("attempts");
    assert_eq!(attempts.len(), 1, "{task}");
    assert_eq!(attempts[0]["deployment"], "claude/claude-sonnet-4-5");
    assert_eq!(attempts[0]["outcome"], "succeeded");
    let charged = attempts[0]["cost_usd"].as_f64().expect("an attempt cost");
    assert!(
        (charged - CALL_COST_USD).abs() < 1e-9,
        "{charged} in {task}"
    );
}

async fn an_anthropic_chat_calls_tools_in_parallel_and_answers_their_results(backend: &str) {
    let (url, seen) = fake_anthropic().await;
    let Some(server) = common::start_with_env(
        backend,
        "anthropic_chat",
        |db| config_text(db, &url),
        &[("TOLLGATE_TEST_ANTHROPIC_KEY", ANTHROPIC_KEY)],
    ) else {
        return;
    };
    let question = json!({"role": "user", "content": "Weather and time in Paris?"});
    let body = json!({"model": "claude", "messages": [
        {"role": "system", "content": "Be brief."}, question
    ], "tools": tools(), "parallel_tool_calls": true});
    let (id, answer) = chat(&server, &body).await;

    // The client gets both calls in OpenAI's shape, the text beside them.
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
    let message = choice["message"].clone();
    assert_eq!(message["content"], "Let me look both up.", "{answer}");
    let calls = message["tool_calls"].as_array().unwrap().clone();
    assert_eq!(calls.len(), 2, "{answer}");
    for (call, (id, name)) in calls
        .iter()
        .zip([("toolu_01", "get_weather"), ("toolu_02", "get_time")])
    {
        assert_eq!(call["id"], id);
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], name);
        let arguments: Value =
            serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
        assert_eq!(arguments, json!({"city": "Paris"}));
    }
    assert_eq!(answer["usage"]["prompt_tokens"], 1300, "{answer}");
    assert_eq!(answer["usage"]["completion_tokens"], 30, "{answer}");

    // Anthropic was sent its own dialect: the key, the system prompt apart, the tools
    // with `input_schema`, no `tool_choice` (its default: `auto`, parallel calls allowed).
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 1);
        let (headers, sent) = &seen[0];
        assert_eq!(headers["x-api-key"], ANTHROPIC_KEY);
        assert!(headers.get("anthropic-version").is_some());
        assert_eq!(sent["model"], "claude-sonnet-4-5");
        assert_eq!(sent["max_tokens"], 512);
        assert_eq!(sent["system"], "Be brief.");
        assert_eq!(sent["messages"], json!([question]));
        assert_eq!(
            sent["tools"],
            json!([
                {"name": "get_weather", "description": "The weather in a city", "input_schema":
                    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                {"name": "get_time", "input_schema":
                    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
            ])
        );
        assert!(
            sent.get("tool_choice").is_none(),
            "no choice given: Anthropic's default, `auto` with parallel calls: {sent}"
        );
    }
    let first = task(&server, &id).await;
    assert_eq!(first["kind"], "chat", "{first}");
    assert_eq!(first["output"]["tool_calls"], json!(calls), "{first}");
    assert_usage_and_cost(&first);

    // The client ran both tools: their results go back as `tool_result` blocks in one
    // user message after the assistant's `tool_use` blocks, and the answer is text.
    let mut follow_up = body.clone();
    follow_up["messages"] = json!([
        {"role": "system", "content": "Be brief."},
        question,
        message,
        {"role": "tool", "tool_call_id": "toolu_01", "content": "Sunny, 21 C"},
        {"role": "tool", "tool_call_id": "toolu_02", "content": "10:00"}
    ]);
    let (id, answer) = chat(&server, &follow_up).await;
    let choice = &answer["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "{answer}");
    assert_eq!(
        choice["message"]["content"],
        "Sunny in Paris; it is 10:00 there."
    );
    assert!(choice["message"].get("tool_calls").is_none(), "{answer}");
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2);
        let sent = &seen[1].1;
        assert_eq!(
            sent["messages"],
            json!([
                question,
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me look both up."},
                    {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_02", "name": "get_time", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_01", "content": "Sunny, 21 C"},
                    {"type": "tool_result", "tool_use_id": "toolu_02", "content": "10:00"}
                ]}
            ])
        );
    }
    let second = task(&server, &id).await;
    assert_eq!(second["output"]["finish_reason"], "stop", "{second}");
    assert_usage_and_cost(&second);

    // Both calls are in the app's spend.
    let usage: Value = server
        .http
        .get(format!("{}/v1/usage", server.base))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let settled = usage["settled_usd"].as_f64().unwrap_or(f64::NAN);
    assert!(
        (settled - 2.0 * CALL_COST_USD).abs() < 1e-9,
        "both calls are settled: {usage}"
    );
    assert_eq!(usage["reserved_usd"].as_f64(), Some(0.0), "{usage}");
}
