//! `chat`: request parsing (every bad input named by its field) and answer validation.

use super::*;
use crate::kinds::test_support::*;
use crate::kinds::{TaskKind, TaskRequest, check_output_fits, output_schema, validate_output};
use proptest::prelude::*;
use serde_json::json;

fn weather() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {
                "type": "object",
                "properties": { "city": { "type": "string" }, "days": { "type": "integer", "minimum": 1 } },
                "required": ["city"],
                "additionalProperties": false
            }
        }
    })
}

fn time() -> Value {
    json!({ "type": "function", "function": { "name": "get_time" } })
}

fn user(text: &str) -> Value {
    json!({ "role": "user", "content": text })
}

fn with(extra: Value) -> Value {
    let mut base = json!({ "messages": [user("Weather in Paris?")], "tools": [weather(), time()] });
    for (k, v) in extra.as_object().unwrap() {
        base[k] = v.clone();
    }
    base
}

fn call(id: &str, name: &str, arguments: &str) -> Value {
    json!({ "id": id, "type": "function", "function": { "name": name, "arguments": arguments } })
}

fn chat(value: Value) -> TaskRequest {
    accepts(TaskKind::Chat, value)
}

#[test]
fn a_round_trip_with_parallel_calls_parses_and_normalizes() {
    let value = json!({
        "messages": [
            { "role": "system", "content": "Be brief." },
            user("Weather in Paris and the time?"),
            { "role": "assistant", "content": null, "tool_calls": [
                call("c1", "get_weather", "{\"city\":\"Paris\"}"),
                call("c2", "get_time", "{}")
            ] },
            { "role": "tool", "tool_call_id": "c1", "content": "Sunny" },
            { "role": "tool", "tool_call_id": "c2", "content": "10:00" }
        ],
        "tools": [weather(), time()],
        "tool_choice": "auto",
        "parallel_tool_calls": true,
        "max_output_tokens": 100,
        "temperature": 0.5,
        "seed": 3
    });
    let r = chat(value.clone());
    assert_eq!(r.kind(), TaskKind::Chat);
    assert_eq!(r.to_value(), value);
    let TaskRequest::Chat(c) = &r else { panic!() };
    assert_eq!(c.messages.len(), 5);
    assert!(matches!(&c.messages[4], ChatTurn::Tool { tool_call_id, .. } if tool_call_id == "c2"));
    assert_eq!(
        c.tool("get_time").unwrap().parameters_schema(),
        json!({"type": "object", "properties": {}})
    );
    // Serde's derived form reads the normalized value back.
    let back: ChatRequest = serde_json::from_value(r.to_value()).unwrap();
    assert_eq!(TaskRequest::Chat(back), r);
    // Named tool choice.
    chat(with(
        json!({ "tool_choice": { "type": "function", "function": { "name": "get_time" } } }),
    ));
    // A chat without tools is text only.
    let plain = chat(json!({ "messages": [user("hi")] }));
    let TaskRequest::Chat(p) = &plain else {
        panic!()
    };
    assert_eq!(
        p.effective_tool_choice(),
        ToolChoice::Mode(ToolChoiceMode::None)
    );
}

#[test]
fn bad_messages_are_named() {
    let k = TaskKind::Chat;
    rejects(k, json!({}), "request", "missing field `messages`");
    rejects(
        k,
        json!({ "messages": [] }),
        "request.messages",
        "at least one message",
    );
    rejects(
        k,
        json!({ "messages": "hi" }),
        "request.messages",
        "expected an array",
    );
    rejects(
        k,
        json!({ "messages": [7] }),
        "request.messages[0]",
        "must be a JSON object",
    );
    rejects(
        k,
        json!({ "messages": [{ "content": "x" }] }),
        "request.messages[0]",
        "missing field `role`",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": "bot", "content": "x" }] }),
        "request.messages[0].role",
        "unknown role `bot`",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": "developer", "content": "x" }] }),
        "request.messages[0].role",
        "unknown role",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": 1 }] }),
        "request.messages[0].role",
        "must be a string",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": "user" }] }),
        "request.messages[0]",
        "missing field `content`",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": "user", "content": "x", "tool_calls": [] }] }),
        "request.messages[0]",
        "unknown field `tool_calls`",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": "assistant", "content": null }] }),
        "request.messages[0]",
        "needs `content` or `tool_calls`",
    );
    // A tool result needs the id of an earlier call.
    rejects(
        k,
        json!({ "messages": [{ "role": "tool", "content": "42" }] }),
        "request.messages[0]",
        "missing field `tool_call_id`",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": "tool", "tool_call_id": "c9", "content": "42" }] }),
        "request.messages[0].tool_call_id",
        "not the id of a tool call",
    );
    rejects(
        k,
        json!({ "messages": [{ "role": "tool", "tool_call_id": 5, "content": "42" }] }),
        "request.messages[0].tool_call_id",
        "invalid type",
    );
    let calls = |calls: Value| json!({ "messages": [{ "role": "assistant", "content": null, "tool_calls": calls }] });
    rejects(
        k,
        calls(json!([{ "id": "c1" }])),
        "request.messages[0].tool_calls[0]",
        "missing field",
    );
    rejects(
        k,
        calls(json!([call("c1", "f", "{not json")])),
        "request.messages[0].tool_calls[0].function.arguments",
        "string of JSON",
    );
    rejects(
        k,
        calls(json!([call("", "f", "{}")])),
        "request.messages[0].tool_calls[0].id",
        "1 to 256 bytes",
    );
    rejects(
        k,
        calls(json!([call("c1", "f", "{}"), call("c1", "g", "{}")])),
        "request.messages[0].tool_calls[1].id",
        "ids must be unique",
    );
    let many: Vec<Value> = (0..=MAX_CHAT_MESSAGES).map(|_| user("x")).collect();
    rejects(
        k,
        json!({ "messages": many }),
        "request.messages",
        "over the limit of 1000",
    );
    rejects(
        k,
        json!({ "messages": [user("x")], "prompt": "p" }),
        "request",
        "unknown field `prompt`",
    );
}

#[test]
fn bad_tools_are_named() {
    let k = TaskKind::Chat;
    let tools = |tools: Value| json!({ "messages": [user("x")], "tools": tools });
    rejects(k, tools(json!([])), "request.tools", "at least one tool");
    rejects(k, tools(json!({})), "request.tools", "expected an array");
    rejects(
        k,
        tools(json!([{ "type": "retrieval" }])),
        "request.tools[0].type",
        "must be \"function\"",
    );
    rejects(
        k,
        tools(json!([{ "function": { "name": "f" } }])),
        "request.tools[0]",
        "missing field `type`",
    );
    rejects(
        k,
        tools(json!([{ "type": "function" }])),
        "request.tools[0]",
        "missing field `function`",
    );
    rejects(
        k,
        tools(json!([{ "type": "function", "function": {} }])),
        "request.tools[0].function",
        "missing field `name`",
    );
    rejects(
        k,
        tools(json!([{ "type": "function", "function": { "name": "has space" } }])),
        "request.tools[0].function.name",
        "not a tool name",
    );
    rejects(
        k,
        tools(json!([{ "type": "function", "function": { "name": "x".repeat(65) } }])),
        "request.tools[0].function.name",
        "not a tool name",
    );
    rejects(
        k,
        tools(json!([{ "type": "function", "function": { "name": "f", "color": 1 } }])),
        "request.tools[0].function",
        "unknown field `color`",
    );
    rejects(
        k,
        tools(json!([weather(), time(), weather()])),
        "request.tools[2].function.name",
        "names must be unique",
    );
    // Not an object schema.
    for (parameters, reason) in [
        (json!("object"), "must be a JSON Schema object"),
        (json!(true), "must be a JSON Schema object"),
        (json!({ "type": "array" }), "must describe an object"),
        (json!({ "type": "thing" }), "must describe an object"),
        (
            json!({ "type": "object", "properties": { "a": { "type": 5 } } }),
            "not a valid JSON Schema",
        ),
        (
            json!({ "$ref": "https://example.com/s.json" }),
            "not a local reference",
        ),
    ] {
        rejects(
            k,
            tools(
                json!([{ "type": "function", "function": { "name": "f", "parameters": parameters } }]),
            ),
            "request.tools[0].function.parameters",
            reason,
        );
    }
    let many: Vec<Value> = (0..=MAX_CHAT_TOOLS)
        .map(|i| json!({ "type": "function", "function": { "name": format!("f{i}") } }))
        .collect();
    rejects(
        k,
        tools(Value::Array(many)),
        "request.tools",
        "over the limit of 128",
    );
}

#[test]
fn bad_tool_choices_are_named() {
    let k = TaskKind::Chat;
    rejects(
        k,
        with(json!({ "tool_choice": "always" })),
        "request.tool_choice",
        "unknown tool choice",
    );
    rejects(
        k,
        with(json!({ "tool_choice": 1 })),
        "request.tool_choice",
        "string or an object",
    );
    rejects(
        k,
        with(json!({ "tool_choice": { "type": "function", "function": { "name": "nope" } } })),
        "request.tool_choice.function.name",
        "not one of the offered tools",
    );
    rejects(
        k,
        with(json!({ "tool_choice": { "type": "function" } })),
        "request.tool_choice",
        "missing field `function`",
    );
    rejects(
        k,
        json!({ "messages": [user("x")], "tool_choice": "required" }),
        "request.tool_choice",
        "needs `tools`",
    );
    rejects(
        k,
        json!({ "messages": [user("x")], "tool_choice": { "type": "function", "function": { "name": "f" } } }),
        "request.tool_choice.function.name",
        "not one of the offered tools",
    );
    rejects(
        k,
        with(json!({ "parallel_tool_calls": "yes" })),
        "request.parallel_tool_calls",
        "invalid type",
    );
    rejects(
        k,
        with(json!({ "temperature": 9 })),
        "request.temperature",
        "from 0 to 2",
    );
    rejects(
        k,
        with(json!({ "max_output_tokens": 0 })),
        "request.max_output_tokens",
        "at least 1",
    );
    accepts(k, json!({ "messages": [user("x")], "tool_choice": "none" }));
}

#[test]
fn answers_are_validated_against_the_tools() {
    let r = chat(with(json!({})));
    let ok = validate_output(
        &r,
        &json!({ "content": null, "tool_calls": [call("c1", "get_weather", "{\"city\": \"Paris\"}")], "finish_reason": "tool_calls" }),
    )
    .unwrap();
    assert_eq!(
        ok,
        json!({ "content": null, "tool_calls": [call("c1", "get_weather", "{\"city\": \"Paris\"}")], "finish_reason": "tool_calls" })
    );
    // Text, a missing finish reason, and parallel calls.
    assert_eq!(
        validate_output(&r, &json!({ "content": "Sunny" })).unwrap(),
        json!({ "content": "Sunny", "finish_reason": "stop" })
    );
    assert_eq!(
        validate_output(&r, &json!({ "content": "Sun", "finish_reason": "length" })).unwrap()["finish_reason"],
        "length"
    );
    let two = json!({ "content": "Checking.", "tool_calls": [
        call("c1", "get_weather", "{\"city\":\"Paris\"}"), call("c2", "get_time", "{}")
    ], "finish_reason": "stop" });
    assert_eq!(
        validate_output(&r, &two).unwrap()["finish_reason"],
        "tool_calls"
    );
    // A call's `type` may be left out; it is normalized in.
    let untyped = json!({ "content": null, "tool_calls": [{ "id": "c1", "function": { "name": "get_time", "arguments": "{}" } }] });
    assert_eq!(
        validate_output(&r, &untyped).unwrap()["tool_calls"][0]["type"],
        "function"
    );

    violates(
        &r,
        json!({ "content": null, "tool_calls": [call("c1", "get_wether", "{}")] }),
        "not one of the tools: `get_weather`, `get_time`",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [call("c1", "get_weather", "{city: Paris}")] }),
        "not valid JSON",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [call("c1", "get_weather", "[1]")] }),
        "must be a JSON object",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [call("c1", "get_weather", "{}")] }),
        "do not match the parameters of `get_weather`",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [call("c1", "get_weather", "{\"city\":\"P\",\"days\":0}")] }),
        "at /days",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [call("c1", "get_time", "{}"), call("c1", "get_time", "{}")] }),
        "appears more than once",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [{ "id": "c1", "function": { "name": "get_time", "arguments": {} } }] }),
        "must be a string of JSON",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [{ "function": { "name": "get_time", "arguments": "{}" } }] }),
        "missing field `id`",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": [{ "id": "c", "type": "code", "function": { "name": "get_time", "arguments": "{}" } }] }),
        "must be \"function\"",
    );
    violates(
        &r,
        json!({ "content": null, "tool_calls": {} }),
        "must be an array",
    );
    violates(
        &r,
        json!({ "content": null }),
        "neither `content` nor `tool_calls`",
    );
    violates(&r, json!({ "content": 5 }), "string or null");
    violates(
        &r,
        json!({ "content": "x", "why": 1 }),
        "unexpected field `why`",
    );
    violates(&r, json!("hi"), "must be a JSON object");
    let plain = chat(json!({ "messages": [user("x")] }));
    violates(
        &plain,
        json!({ "content": null, "tool_calls": [call("c1", "f", "{}")] }),
        "no tools were offered",
    );
}

#[test]
fn the_tool_choice_is_honoured() {
    let calls = |names: &[&str]| {
        let calls: Vec<Value> = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                call(
                    &format!("c{i}"),
                    n,
                    if *n == "get_weather" {
                        "{\"city\":\"x\"}"
                    } else {
                        "{}"
                    },
                )
            })
            .collect();
        json!({ "content": null, "tool_calls": calls })
    };
    let none = chat(with(json!({ "tool_choice": "none" })));
    violates(&none, calls(&["get_time"]), "tool_choice is `none`");
    assert!(validate_output(&none, &json!({ "content": "ok" })).is_ok());
    let required = chat(with(json!({ "tool_choice": "required" })));
    violates(
        &required,
        json!({ "content": "ok" }),
        "tool_choice is `required`",
    );
    assert!(validate_output(&required, &calls(&["get_time"])).is_ok());
    let named = chat(with(
        json!({ "tool_choice": { "type": "function", "function": { "name": "get_time" } } }),
    ));
    violates(
        &named,
        json!({ "content": "ok" }),
        "names `get_time`: call it",
    );
    violates(
        &named,
        calls(&["get_time", "get_weather"]),
        "call only it, not `get_weather`",
    );
    assert!(validate_output(&named, &calls(&["get_time"])).is_ok());
    let single = chat(with(json!({ "parallel_tool_calls": false })));
    violates(
        &single,
        calls(&["get_time", "get_weather"]),
        "parallel_tool_calls is false",
    );
    assert!(validate_output(&single, &calls(&["get_weather"])).is_ok());
}

#[test]
fn schemas_and_limits_cover_chat() {
    let r = chat(with(json!({})));
    let answer = json!({ "content": null, "tool_calls": [call("c1", "get_time", "{}")], "finish_reason": "tool_calls" });
    assert!(schema_valid(&r.output_schema(), &answer));
    assert!(schema_valid(
        &output_schema(TaskKind::Chat),
        &validate_output(&r, &answer).unwrap()
    ));
    assert!(!schema_valid(
        &r.output_schema(),
        &json!({ "content": null, "tool_calls": [call("c1", "nope", "{}")], "finish_reason": "tool_calls" })
    ));
    assert!(schema_valid(
        &crate::kinds::request_schema(TaskKind::Chat),
        &r.to_value()
    ));
    // The smallest answer must fit the output limit.
    assert!(check_output_fits(&r, 36).is_ok());
    let err = check_output_fits(&r, 35).unwrap_err();
    assert!(err.to_string().contains("no output could fit"), "{err}");
    // A tool schema too costly to validate against is refused, named.
    let mut defs = serde_json::Map::new();
    for i in 0..40 {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(
            format!("d{i}"),
            json!({ "anyOf": [{ "$ref": next }, { "$ref": next }] }),
        );
    }
    defs.insert("d40".into(), json!({ "type": "string" }));
    rejects(
        TaskKind::Chat,
        json!({ "messages": [user("x")], "tools": [{ "type": "function", "function": {
            "name": "f", "parameters": { "type": "object", "$defs": defs, "properties": { "a": { "$ref": "#/$defs/d0" } } }
        } }] }),
        "request.tools[0].function.parameters",
        "more than 10000 subschemas",
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn validation_is_idempotent_and_never_panics(output in arb_json()) {
        let r = chat(with(json!({})));
        if let Ok(normalized) = validate_output(&r, &output) {
            prop_assert_eq!(validate_output(&r, &normalized), Ok(normalized.clone()));
        }
    }
}
