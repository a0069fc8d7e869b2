//! Streams that start over, break off or carry structure (issue 30; docs/api.md
//! "Streaming a task", docs/openai.md "Streaming"): the real `tollgate serve` (SQLite and
//! PostgreSQL) calls a scripted OpenAI-compatible fake in this process
//! (`stream_fake`) that streams each answer and holds its last pieces until the test
//! releases them, so "arrived before the provider finished" is observed; its server
//! configuration and shared calls are in `stream_fake::http`.
//!
//! - a re-ask during a stream: a reader of `GET /v1/tasks/{id}/events` gets the invalid
//!   answer's pieces, a `restart`, the new answer's pieces (before the provider
//!   finished), then `end` with the validated output; both calls are counted and
//!   charged (the task, its attempt, the scope's usage);
//! - the door's structured call (`response_format: json_schema`, `stream: true`) is
//!   validated first, then sent whole: nothing arrives while the provider still holds
//!   its answer, no restart shows, the usage is both calls';
//! - a fallback to another deployment after text was sent ends the door's stream with a
//!   `stream_restarted` error event; the task goes on and its replay streams the answer;
//! - an error event mid-stream with no tries left ends the door's stream with a
//!   `provider_error` event and fails the task, charged its reservation; with tries
//!   left, the next attempt answers (the door ends `stream_restarted`, a reader of the
//!   events gets a `restart`), both attempts charged;
//! - a provider's own retry (`max_retries`) after its stream broke off: the events get
//!   a `restart`, then the retry's pieces, within one attempt;
//! - `classify_many` streams its raw text before the provider finished and ends with
//!   the validated (reordered) output;
//! - a `chat`'s tool-call pieces (door chunks and `delta` events) concatenate to the
//!   stored tool calls.

use reqwest::StatusCode;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::Duration;

#[macro_use]
mod common;
mod stream_fake;
use stream_fake::http::{
    ACME, assert_settled, attempts_cost, close, content, cost, door_error, start, task_id,
};
use stream_fake::{End, Events, Reply, until_sent};

on_both_backends!(
    a_reask_restarts_the_events_and_counts_both_calls,
    the_door_sends_a_structured_answer_whole_after_its_reask,
    a_fallback_after_text_was_sent_ends_the_door_stream_restarted,
    an_error_event_mid_stream_fails_the_task_and_settles,
    a_broken_stream_with_tries_left_is_answered_by_the_next_attempt,
    a_provider_retry_after_a_broken_stream_restarts_the_events,
    classify_many_streams_its_raw_text_and_ends_validated,
    tool_call_pieces_concatenate_to_the_stored_calls,
);

const PLACE: &str = r#"{"type": "object", "properties": {"city": {"type": "string"}},
    "required": ["city"], "additionalProperties": false}"#;

async fn a_reask_restarts_the_events_and_counts_both_calls(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[reask]";
    fake.script(
        tag,
        vec![
            // Not JSON: asked again.
            Reply::text(
                &[r#"{"city": "#, r#""Par"#],
                &[],
                End::Finish("stop", (20, 5)),
            ),
            Reply::text(
                &[r#"{"city": "#],
                &[r#""Paris"}"#],
                End::Finish("stop", (30, 6)),
            ),
        ],
    );
    let schema: Value = serde_json::from_str(PLACE).unwrap();
    let id = server
        .submit(
            json!({"kind": "extract_data", "model": "once", "scope": "reask",
            "request": {"input": format!("{tag} I live in Paris"), "schema": schema}}),
        )
        .await;
    let mut events = server.events(&id).await;
    assert_eq!(
        events.expect("delta").await,
        json!({"text": r#"{"city": "#})
    );
    assert_eq!(events.expect("delta").await, json!({"text": r#""Par"#}));
    let restart = events.expect("restart").await;
    assert!(
        restart["reason"].as_str().unwrap().contains("invalid"),
        "{restart}"
    );
    assert_eq!(
        events.expect("delta").await,
        json!({"text": r#"{"city": "#})
    );
    // The new answer's first piece came while the fake still holds its last.
    assert_eq!(fake.sent(tag), 3);
    fake.release();
    assert_eq!(events.expect("delta").await, json!({"text": r#""Paris"}"#}));
    let end = events.expect("end").await;
    assert!(events.next().await.is_none(), "`end` is the last event");
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["output"], json!({"city": "Paris"}), "{end}");
    // Both calls are counted and charged: 50 input and 11 output tokens.
    assert_eq!(end["usage"]["input_tokens"], 50, "{end}");
    assert_eq!(end["usage"]["output_tokens"], 11, "{end}");
    assert!(close(&end["usage"]["cost_usd"], cost(50, 11)), "{end}");
    let calls = fake.calls(tag);
    assert_eq!(calls.len(), 2);
    let asked = calls[1]["messages"].to_string();
    assert!(
        calls[1]["messages"].as_array().unwrap().len()
            > calls[0]["messages"].as_array().unwrap().len(),
        "the re-ask carries the invalid answer and its error: {asked}"
    );
    let task = server.ended(&id).await;
    assert_eq!(task["usage"], end["usage"], "{task}");
    assert!(close(&json!(attempts_cost(&task)), cost(50, 11)), "{task}");
    assert_settled(&server, "reask", cost(50, 11)).await;
}

async fn the_door_sends_a_structured_answer_whole_after_its_reask(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[door-json]";
    fake.script(
        tag,
        vec![
            // Valid JSON, invalid for the schema: asked again.
            Reply::text(&[r#"{"city": "#, "5}"], &[], End::Finish("stop", (20, 5))),
            Reply::text(
                &[r#"{"city": "#],
                &[r#""Paris"}"#],
                End::Finish("stop", (30, 6)),
            ),
        ],
    );
    let schema: Value = serde_json::from_str(PLACE).unwrap();
    let body = json!({"model": "once",
        "messages": [{"role": "user", "content": format!("{tag} Where do I live? Paris.")}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "place", "schema": schema}}});
    let call = {
        let server_http = server.http.clone();
        let (base, body) = (server.base.clone(), body.clone());
        tokio::spawn(async move {
            let mut body = body;
            body["stream"] = json!(true);
            body["stream_options"] = json!({"include_usage": true});
            server_http
                .post(format!("{base}/openai/v1/chat/completions"))
                .bearer_auth(ACME)
                .header("x-tollgate-scope", "door-json")
                .json(&body)
                .send()
                .await
                .unwrap()
        })
    };
    // Both answers' first pieces were sent (the first answer whole): the door still
    // answers nothing, since a structured answer is validated before it is sent.
    until_sent(&fake, tag, 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !call.is_finished(),
        "the door answered before the task ended"
    );
    fake.release();
    let response = call.await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let id = task_id(&response);
    let all = Events::of(response).rest().await;
    let pieces = content(&all);
    assert_eq!(pieces.len(), 1, "the validated JSON as one chunk: {all:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&pieces[0]).unwrap(),
        json!({"city": "Paris"})
    );
    assert!(all.iter().all(|(_, d)| !d.contains("\"error\"")), "{all:?}");
    assert_eq!(all.last().unwrap().1, "[DONE]");
    let usage: Value = serde_json::from_str(&all[all.len() - 2].1).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], 50, "{usage}");
    assert_eq!(usage["usage"]["completion_tokens"], 11, "{usage}");
    assert_eq!(fake.calls(tag).len(), 2);
    let task = server.ended(&id).await;
    assert_eq!(task["kind"], "extract_data", "{task}");
    assert_eq!(task["output"], json!({"city": "Paris"}), "{task}");
    assert_settled(&server, "door-json", cost(50, 11)).await;
}

async fn a_fallback_after_text_was_sent_ends_the_door_stream_restarted(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[fallback]";
    fake.script(
        tag,
        vec![
            Reply::text(&["Hello ", "wor"], &[], End::Drop),
            Reply::text(&["Bonjour "], &["le monde"], End::Finish("stop", (9, 4))),
        ],
    );
    let body = json!({"model": "routed",
        "messages": [{"role": "user", "content": format!("{tag} say hello")}]});
    let response = server.door("fb", Some("fb-1"), body.clone()).await;
    let id = task_id(&response);
    let all = Events::of(response).rest().await;
    assert_eq!(content(&all), ["Hello ", "wor"], "{all:?}");
    let error = door_error(&all);
    assert_eq!(error["code"], "stream_restarted", "{error}");
    assert_eq!(error["type"], "server_error", "{error}");
    assert!(error["message"].as_str().unwrap().contains(&id), "{error}");
    // The task goes on, on the next deployment.
    fake.release();
    let task = server.ended(&id).await;
    assert_eq!(task["status"], "succeeded", "{task}");
    assert_eq!(task["output"]["text"], "Bonjour le monde", "{task}");
    let models: Vec<Value> = fake.calls(tag).iter().map(|c| c["model"].clone()).collect();
    assert_eq!(models, [json!("flaky-model"), json!("good-model")]);
    let attempts = task["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{task}");
    assert_eq!(attempts[0]["deployment"], "fake/flaky-model", "{task}");
    assert_eq!(attempts[1]["deployment"], "fake/good-model", "{task}");
    // The broken call may have been billed: charged its bound; the answer its usage.
    assert!(
        attempts[0]["cost_usd"].as_f64().unwrap() > cost(0, 50),
        "{task}"
    );
    assert!(close(&attempts[1]["cost_usd"], cost(9, 4)), "{task}");
    assert_settled(&server, "fb", attempts_cost(&task)).await;
    // A replay of the key streams the answer, with no provider call.
    let calls = fake.all_calls();
    let replay = server.door("fb", Some("fb-1"), body).await;
    let all = Events::of(replay).rest().await;
    assert_eq!(content(&all).concat(), "Bonjour le monde");
    assert_eq!(all.last().unwrap().1, "[DONE]");
    assert_eq!(fake.all_calls(), calls);
}

async fn an_error_event_mid_stream_fails_the_task_and_settles(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[errevent]";
    fake.script(tag, vec![Reply::text(&["Hello "], &[], End::Error)]);
    let body = json!({"model": "once",
        "messages": [{"role": "user", "content": format!("{tag} say hello")}]});
    let response = server.door("err", None, body).await;
    let id = task_id(&response);
    let all = Events::of(response).rest().await;
    assert_eq!(content(&all), ["Hello "], "{all:?}");
    let error = door_error(&all);
    assert_eq!(error["code"], "provider_error", "{error}");
    assert_eq!(error["type"], "server_error", "{error}");
    let task = server.ended(&id).await;
    assert_eq!(task["status"], "failed", "{task}");
    assert_eq!(task["error"]["code"], "provider_error", "{task}");
    let message = task["error"]["message"].as_str().unwrap();
    assert!(message.contains("ended with an error"), "{task}");
    assert_eq!(fake.calls(tag).len(), 1, "max_attempts = 1: one call");
    // Charged its reservation (the bound: its input and 50 output tokens), settled.
    let attempts = task["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{task}");
    assert!(
        attempts[0]["cost_usd"].as_f64().unwrap() > cost(0, 50),
        "{task}"
    );
    assert_settled(&server, "err", attempts_cost(&task)).await;
}

async fn a_broken_stream_with_tries_left_is_answered_by_the_next_attempt(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[retry]";
    fake.script(
        tag,
        vec![
            Reply::text(&["Hello "], &[], End::Drop),
            Reply::text(&["Hello "], &["again"], End::Finish("stop", (11, 3))),
        ],
    );
    let body = json!({"model": "twice",
        "messages": [{"role": "user", "content": format!("{tag} say hello")}]});
    let response = server.door("retry", Some("r-1"), body).await;
    let id = task_id(&response);
    // A reader that joins now gets the execution from its start.
    let mut events = server.events(&id).await;
    let all = Events::of(response).rest().await;
    assert_eq!(content(&all), ["Hello "], "{all:?}");
    assert_eq!(door_error(&all)["code"], "stream_restarted");
    assert_eq!(events.expect("delta").await, json!({"text": "Hello "}));
    let restart = events.expect("restart").await;
    assert!(restart["reason"].is_string(), "{restart}");
    assert_eq!(events.expect("delta").await, json!({"text": "Hello "}));
    assert_eq!(fake.sent(tag), 2, "the fake still holds the rest");
    fake.release();
    assert_eq!(events.expect("delta").await, json!({"text": "again"}));
    let end = events.expect("end").await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["output"]["text"], "Hello again", "{end}");
    let task = server.ended(&id).await;
    let attempts = task["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2, "{task}");
    assert_eq!(attempts[0]["deployment"], attempts[1]["deployment"]);
    assert!(
        attempts[0]["cost_usd"].as_f64().unwrap() > cost(0, 50),
        "{task}"
    );
    assert!(close(&attempts[1]["cost_usd"], cost(11, 3)), "{task}");
    assert_settled(&server, "retry", attempts_cost(&task)).await;
}

async fn a_provider_retry_after_a_broken_stream_restarts_the_events(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[again]";
    fake.script(
        tag,
        vec![
            Reply::text(&["Hello "], &[], End::Drop),
            Reply::text(&["Hello "], &["again"], End::Finish("stop", (11, 3))),
        ],
    );
    let id = server
        .submit(
            json!({"kind": "generate_text", "model": "retried", "scope": "again",
            "request": {"prompt": format!("{tag} say hello")}}),
        )
        .await;
    let mut events = server.events(&id).await;
    assert_eq!(events.expect("delta").await, json!({"text": "Hello "}));
    let restart = events.expect("restart").await;
    let reason = restart["reason"].as_str().unwrap();
    assert!(reason.contains("broke off"), "{restart}");
    assert_eq!(events.expect("delta").await, json!({"text": "Hello "}));
    assert_eq!(fake.sent(tag), 2, "the fake still holds the rest");
    fake.release();
    assert_eq!(events.expect("delta").await, json!({"text": "again"}));
    let end = events.expect("end").await;
    assert_eq!(end["status"], "succeeded", "{end}");
    assert_eq!(end["output"]["text"], "Hello again", "{end}");
    // The provider's own retry (`max_retries = 1`) stays inside the call's one attempt.
    assert_eq!(fake.calls(tag).len(), 2);
    let task = server.ended(&id).await;
    let attempts = task["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 1, "{task}");
    // The try that broke off may have been billed: the call is charged its bound (its
    // input and 50 output tokens) besides the answer's reported usage
    // (docs/routes.md, "What is charged when"), and settled at that.
    assert!(
        task["usage"]["input_tokens"].as_u64().unwrap() > 11,
        "{task}"
    );
    assert_eq!(task["usage"]["output_tokens"], 3 + 50, "{task}");
    assert!(
        attempts[0]["cost_usd"].as_f64().unwrap() > cost(11, 3 + 50),
        "{task}"
    );
    assert_settled(&server, "again", attempts_cost(&task)).await;
}

async fn classify_many_streams_its_raw_text_and_ends_validated(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[many]";
    let first = r#"{"results": [{"id": "b", "label": "ham"}, "#;
    let rest = r#"{"id": "a", "label": "spam"}]}"#;
    fake.script(
        tag,
        vec![Reply::text(
            &[first],
            &[rest],
            End::Finish("stop", (40, 12)),
        )],
    );
    let id = server
        .submit(
            json!({"kind": "classify_many", "model": "once", "scope": "many",
            "request": {"labels": ["spam", "ham"], "items": [
                {"id": "a", "input": format!("{tag} Win a free cruise!")},
                {"id": "b", "input": "Lunch at noon?"}]}}),
        )
        .await;
    let mut events = server.events(&id).await;
    assert_eq!(events.expect("delta").await, json!({"text": first}));
    assert_eq!(fake.sent(tag), 1, "the fake still holds the rest");
    fake.release();
    assert_eq!(events.expect("delta").await, json!({"text": rest}));
    let end = events.expect("end").await;
    assert_eq!(end["status"], "succeeded", "{end}");
    // The raw text has the model's order; the validated output the items'.
    let raw: Value = serde_json::from_str(&format!("{first}{rest}")).unwrap();
    assert_eq!(raw["results"][0]["id"], "b");
    assert_eq!(
        end["output"],
        json!({"results": [{"id": "a", "label": "spam"}, {"id": "b", "label": "ham"}]}),
        "{end}"
    );
    assert_eq!(end["usage"]["input_tokens"], 40, "{end}");
    assert_eq!(end["usage"]["output_tokens"], 12, "{end}");
    assert_eq!(server.ended(&id).await["output"], end["output"]);
    assert_settled(&server, "many", cost(40, 12)).await;
}

/// One tool call put together from pieces: (id, name, arguments).
type Calls = BTreeMap<u64, (Option<String>, Option<String>, String)>;

fn gather(calls: &mut Calls, piece: &Value, name_at: &str) {
    let index = piece["index"].as_u64().expect("an index");
    let call = calls.entry(index).or_default();
    let first = call.0.is_none() && call.1.is_none();
    let id = piece["id"].as_str().map(String::from);
    let name = piece
        .pointer(name_at)
        .and_then(Value::as_str)
        .map(String::from);
    // The first piece of a call names it; later ones do not.
    assert_eq!(first, id.is_some(), "{piece}");
    assert_eq!(first, name.is_some(), "{piece}");
    if first {
        (call.0, call.1) = (id, name);
    }
    call.2.push_str(
        piece["arguments"]
            .as_str()
            .unwrap_or_else(|| piece["function"]["arguments"].as_str().expect("arguments")),
    );
}

fn stored(output: &Value) -> Calls {
    let calls = output["tool_calls"].as_array().expect("tool calls");
    (0..)
        .zip(calls)
        .map(|(i, c)| {
            let text = |p: &str| c.pointer(p).and_then(Value::as_str).map(String::from);
            (
                i,
                (
                    text("/id"),
                    text("/function/name"),
                    text("/function/arguments").unwrap(),
                ),
            )
        })
        .collect()
}

async fn tool_call_pieces_concatenate_to_the_stored_calls(backend: &str) {
    let Some((fake, server)) = start(backend).await else {
        return;
    };
    let tag = "[tools]";
    let piece = |index: u32, head: Option<(&str, &str)>, arguments: &str| {
        let mut p = json!({"index": index, "function": {"arguments": arguments}});
        if let Some((id, name)) = head {
            p["id"] = json!(id);
            p["type"] = json!("function");
            p["function"]["name"] = json!(name);
        }
        json!({ "tool_calls": [p] })
    };
    fake.script(
        tag,
        vec![Reply {
            now: vec![
                piece(0, Some(("call_1", "get_weather")), ""),
                piece(0, None, r#"{"ci"#),
                piece(1, Some(("call_2", "get_time")), ""),
            ],
            held: vec![
                piece(0, None, r#"ty":"Paris"}"#),
                piece(1, None, r#"{"tz":"CET"}"#),
            ],
            end: End::Finish("tool_calls", (25, 17)),
        }],
    );
    let tool = |name: &str, field: &str| {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object",
            "properties": {field: {"type": "string"}}, "required": [field]}}})
    };
    let body = json!({"model": "once",
        "messages": [{"role": "user", "content": format!("{tag} Weather and time in Paris?")}],
        "tools": [tool("get_weather", "city"), tool("get_time", "tz")]});
    let response = server.door("tools", None, body).await;
    let id = task_id(&response);
    let mut door = Events::of(response);
    let mut events = server.events(&id).await;
    // The door's role chunk, then the three pieces the fake sent — before it finished.
    let _role = door.expect("message").await;
    let (mut from_door, mut from_events) = (Calls::new(), Calls::new());
    for _ in 0..3 {
        let chunk = door.expect("message").await;
        gather(
            &mut from_door,
            &chunk["choices"][0]["delta"]["tool_calls"][0],
            "/function/name",
        );
        let delta = events.expect("delta").await;
        gather(&mut from_events, &delta["tool_call"], "/name");
    }
    assert_eq!(fake.sent(tag), 3, "the fake still holds the rest");
    fake.release();
    let rest = door.rest().await;
    let mut finish = None;
    for (_, data) in &rest[..rest.len() - 1] {
        let chunk: Value = serde_json::from_str(data).unwrap();
        if let Some(pieces) = chunk["choices"][0]["delta"]["tool_calls"].as_array() {
            gather(&mut from_door, &pieces[0], "/function/name");
        }
        if let Some(reason) = chunk["choices"][0]["finish_reason"].as_str() {
            finish = Some(reason.to_string());
        }
    }
    assert_eq!(rest.last().unwrap().1, "[DONE]");
    assert_eq!(finish.as_deref(), Some("tool_calls"));
    let end = loop {
        let (name, data) = events.next().await.expect("the end");
        let data: Value = serde_json::from_str(&data).unwrap();
        if name == "end" {
            break data;
        }
        assert_eq!(name, "delta", "{data}");
        gather(&mut from_events, &data["tool_call"], "/name");
    };
    assert_eq!(end["status"], "succeeded", "{end}");
    let calls = stored(&end["output"]);
    let expected: Calls = [
        (
            0,
            (
                Some("call_1".into()),
                Some("get_weather".into()),
                r#"{"city":"Paris"}"#.into(),
            ),
        ),
        (
            1,
            (
                Some("call_2".into()),
                Some("get_time".into()),
                r#"{"tz":"CET"}"#.into(),
            ),
        ),
    ]
    .into();
    assert_eq!(calls, expected, "{end}");
    assert_eq!(from_door, expected);
    assert_eq!(from_events, expected);
    assert_eq!(end["output"]["finish_reason"], "tool_calls", "{end}");
    assert_eq!(stored(&server.ended(&id).await["output"]), expected);
    assert_settled(&server, "tools", cost(25, 17)).await;
}
