//! The `chat` kind end to end, on SQLite and PostgreSQL: the dev provider's tool call and
//! its answer to the results; caching and idempotency; and, against a scripted
//! OpenAI-compatible server on 127.0.0.1, a re-ask of an invalid tool call, the tools
//! sent as given, and a reservation that counts the tool schemas exactly as sent.

mod common;

use axum::Json;
use axum::extract::State;
use common::*;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::{SourceId, SourceRevision, TaskKind, TaskStatus};
use tollgate_engine::config::{BudgetPolicy, ModelConfig, ModelPrices, ProviderConfig};
use tollgate_engine::cost::{TokenCounter, body_input_tokens};
use tollgate_engine::{EngineConfig, Submission};

on_both_backends!(
    the_dev_provider_calls_a_tool_then_answers_its_results,
    a_chat_is_idempotent_and_cached,
    an_invalid_tool_call_is_asked_again_and_the_reservation_counts_the_tools,
);

fn weather_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "minLength": 1}},
                "required": ["city"],
                "additionalProperties": false
            }
        }
    })
}

fn ask(extra: Value) -> Value {
    let mut request = json!({
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [weather_tool(), {"type": "function", "function": {"name": "get_time"}}]
    });
    for (k, v) in extra.as_object().unwrap() {
        request[k] = v.clone();
    }
    request
}

fn submission(effect_key: &str, request: Value) -> Submission {
    Submission::application(app(), scope(), key(effect_key), TaskKind::Chat, request)
}

fn sourced(effect_key: &str, request: Value, source: &str) -> Submission {
    submission(effect_key, request).with_source(
        SourceId::new(source).unwrap(),
        SourceRevision::new("r1").unwrap(),
    )
}

async fn the_dev_provider_calls_a_tool_then_answers_its_results(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let handle = engine.start().await.unwrap();
    let first = engine
        .submit(submission("ask", ask(json!({}))))
        .await
        .unwrap();
    let done = finished(&engine, first.task.id).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    let output = done.output.unwrap();
    assert_eq!(output["finish_reason"], "tool_calls", "{output}");
    assert!(output["content"].is_null());
    let call = output["tool_calls"][0].clone();
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        arguments,
        json!({"city": "x"}),
        "the smallest valid arguments"
    );

    // The client runs the tool and sends its result: the dev model answers in text.
    let round_trip = ask(json!({"messages": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [call.clone()]},
        {"role": "tool", "tool_call_id": call["id"], "content": "Sunny, 21 C"}
    ]}));
    let second = engine
        .submit(submission("answer", round_trip))
        .await
        .unwrap();
    let done = finished(&engine, second.task.id).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    let output = done.output.unwrap();
    assert_eq!(output["finish_reason"], "stop", "{output}");
    let text = output["content"].as_str().unwrap();
    assert!(text.contains("tool results: Sunny, 21 C"), "{text}");

    // `none` forbids calls, a named choice forces its tool.
    let none = engine
        .submit(submission("none", ask(json!({"tool_choice": "none"}))))
        .await
        .unwrap();
    let out = finished(&engine, none.task.id).await.output.unwrap();
    assert!(
        out.get("tool_calls").is_none() && out["content"].is_string(),
        "{out}"
    );
    let named = ask(json!({"tool_choice": {"type": "function", "function": {"name": "get_time"}}}));
    let named = engine.submit(submission("named", named)).await.unwrap();
    let out = finished(&engine, named.task.id).await.output.unwrap();
    assert_eq!(out["tool_calls"][0]["function"]["name"], "get_time");
    assert_eq!(out["tool_calls"][0]["function"]["arguments"], "{}");

    // Bad input is refused at submit, naming the field, and stores nothing.
    let err = engine
        .submit(submission(
            "bad",
            ask(json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}})),
        ))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("request.tool_choice.function.name"),
        "{err}"
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn a_chat_is_idempotent_and_cached(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let handle = engine.start().await.unwrap();
    let first = engine
        .submit(sourced("c1", ask(json!({})), "doc-1"))
        .await
        .unwrap();
    let done = finished(&engine, first.task.id).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    // The same effect key is the same task.
    let again = engine
        .submit(sourced("c1", ask(json!({})), "doc-1"))
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.task.id, first.task.id);
    // Another key, the same chat about the same source revision: a cache hit.
    let hit = engine
        .submit(sourced("c2", ask(json!({})), "doc-1"))
        .await
        .unwrap();
    assert!(hit.created);
    assert_eq!(hit.task.status, TaskStatus::Succeeded);
    assert_eq!(hit.task.cached_from, Some(first.task.id));
    assert_eq!(hit.task.output, done.output);
    // Another tool choice is another request: no hit.
    let miss = engine
        .submit(sourced("c3", ask(json!({"tool_choice": "none"})), "doc-1"))
        .await
        .unwrap();
    assert!(miss.task.cached_from.is_none());
    handle.shutdown(Duration::from_secs(5)).await;
}

/// Scripted assistant messages, each answered with 10 prompt and 5 completion tokens.
#[derive(Default)]
struct Fake {
    messages: Mutex<VecDeque<Value>>,
    requests: Mutex<Vec<Value>>,
}

async fn reply(State(fake): State<Arc<Fake>>, Json(body): Json<Value>) -> Json<Value> {
    fake.requests.lock().unwrap().push(body);
    let message = fake
        .messages
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| json!({"role": "assistant", "content": "done"}));
    let finish = if message.get("tool_calls").is_some() {
        "tool_calls"
    } else {
        "stop"
    };
    Json(json!({
        "id": "chatcmpl-fake", "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    }))
}

const MAX_OUTPUT: u64 = 20;

fn fake_chat_config(url: &str) -> EngineConfig {
    let mut c = fast_config();
    let mut provider = ProviderConfig::openai(url.to_string());
    provider.max_retries = 0;
    c.providers.insert("fake".into(), provider);
    c.models.insert(
        "default".into(),
        ModelConfig {
            provider: "fake".into(),
            model: "fake-model".into(),
            prices: Some(ModelPrices {
                input_per_million: 1_000.0,
                output_per_million: 1_000.0,
                cached_input_per_million: None,
                cache_write_input_per_million: None,
            }),
            max_output_tokens: Some(MAX_OUTPUT as u32),
            ..ModelConfig::default()
        },
    );
    c.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            usd_per_24_hours: Some(1_000.0),
            ..BudgetPolicy::default()
        },
    );
    c
}

fn tool_call(id: &str, name: &str, arguments: &str) -> Value {
    json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
}

async fn an_invalid_tool_call_is_asked_again_and_the_reservation_counts_the_tools(db: TestDb) {
    let fake = Arc::new(Fake::default());
    fake.messages.lock().unwrap().extend([
        json!({"role": "assistant", "content": null, "tool_calls": [tool_call("call_1", "get_wether", "{\"city\":\"Paris\"}")]}),
        json!({"role": "assistant", "content": null, "tool_calls": [
            tool_call("call_2", "get_weather", "{\"city\":\"Paris\"}"),
            tool_call("call_3", "get_time", "{}")
        ]}),
    ]);
    let app_router = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(reply))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app_router).await;
    });

    let engine = db.engine(fake_chat_config(&url)).await;
    let request = ask(json!({"tool_choice": "required", "parallel_tool_calls": true}));
    let task = engine
        .submit(sourced("reask", request, "doc-r"))
        .await
        .unwrap()
        .task;
    let first_reservation = task.reservation.expect("a reservation");
    let handle = engine.start().await.unwrap();
    let done = finished(&engine, task.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    let output = done.output.unwrap();
    assert_eq!(output["finish_reason"], "tool_calls");
    assert_eq!(
        output["tool_calls"].as_array().unwrap().len(),
        2,
        "{output}"
    );
    assert_eq!(output["tool_calls"][1]["id"], "call_3");
    assert_eq!(
        done.usage.map(|u| (u.input_tokens, u.output_tokens)),
        Some((20, 10)),
        "both answers are counted"
    );

    let requests = fake.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "one re-ask");
    let sent = &requests[0];
    assert_eq!(
        sent["tools"],
        json!([weather_tool(), {"type": "function", "function": {"name": "get_time"}}])
    );
    assert_eq!(sent["tool_choice"], "required");
    assert_eq!(sent["parallel_tool_calls"], true);
    assert!(sent.get("response_format").is_none());
    let correction = requests[1]["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        correction.contains("`get_wether`, which is not one of the tools"),
        "{correction}"
    );
    // The reservation is the first attempt exactly as sent: its messages and its tool
    // definitions (counted in bytes for a model without a known tokenizer), plus the
    // output bound.
    let counted = body_input_tokens(TokenCounter::bytes(), sent);
    assert_eq!(first_reservation.tokens, counted + MAX_OUTPUT);
    let tools_bytes = sent["tools"].to_string().len() as u64;
    assert!(
        counted > tools_bytes,
        "{counted} counts the {tools_bytes} bytes of tools"
    );
    let stored = engine.get(&app(), task.id).await.unwrap().unwrap();
    let reask = body_input_tokens(TokenCounter::bytes(), &requests[1]) + MAX_OUTPUT;
    assert_eq!(
        stored.reservation.map(|r| r.tokens),
        Some(first_reservation.tokens + reask),
        "the re-ask is reserved as sent"
    );
    let w = db
        .store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .unwrap();
    assert_eq!(w.reserved_nano, 0, "nothing stays reserved");
}
