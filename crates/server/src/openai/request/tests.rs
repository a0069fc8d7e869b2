use super::*;

fn ok(body: Value) -> ChatRequest {
    parse(&body).unwrap_or_else(|e| panic!("{body} should parse: {e:?}"))
}

fn refused(body: Value, param: &str) {
    let err = parse(&body).expect_err(&format!("{body} should be refused"));
    assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
    let text = format!("{err:?}");
    assert!(text.contains(&format!("param: Some({param:?})")), "{text}");
}

fn chat() -> Value {
    json!([{"role": "user", "content": "hi"}])
}

#[test]
fn text_requests_become_generate_text() {
    let r = ok(json!({
        "model": "default", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"role": "assistant", "content": "ok"}
        ],
        "max_completion_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stop": "END",
        "seed": 7, "n": 1, "user": "u-1", "metadata": {"k": "v"}
    }));
    assert_eq!(r.kind, TaskKind::GenerateText);
    assert_eq!(
        r.request,
        json!({
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "ab"},
                {"role": "assistant", "content": "ok"}
            ],
            "max_output_tokens": 5, "temperature": 0.5, "top_p": 0.9, "stop": ["END"], "seed": 7
        })
    );
    assert_eq!(r.max_tokens, Some(5));
}

#[test]
fn json_formats_become_extract_data() {
    let r =
        ok(json!({"model": "m", "messages": chat(), "response_format": {"type": "json_object"}}));
    assert_eq!(r.kind, TaskKind::ExtractData);
    assert_eq!(r.request["schema"], json!({"type": "object"}));
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let r = ok(
        json!({"model": "m", "messages": chat(), "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "thing", "schema": schema, "strict": true, "description": "d"}
        }}),
    );
    assert_eq!(r.request["schema"], schema);
    assert_eq!(r.request["instructions"], "d");
}

#[test]
fn unsupported_and_unknown_fields_are_refused_by_name() {
    refused(
        json!({"model": "m", "messages": chat(), "functions": [{"name": "f"}]}),
        "functions",
    );
    refused(
        json!({"model": "m", "messages": chat(), "tool_choice": "auto"}),
        "tool_choice",
    );
    refused(
        json!({"model": "m", "messages": chat(), "parallel_tool_calls": false}),
        "parallel_tool_calls",
    );
    refused(
        json!({"model": "m", "messages": chat(), "tools": [{"type": "function", "function": {"name": "f"}}],
               "response_format": {"type": "json_object"}}),
        "response_format",
    );
    refused(json!({"model": "m", "messages": chat(), "n": 2}), "n");
    refused(
        json!({"model": "m", "messages": chat(), "logprobs": true}),
        "logprobs",
    );
    refused(
        json!({"model": "m", "messages": chat(), "frobnicate": 1}),
        "frobnicate",
    );
    refused(
        json!({"model": "m", "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "x"}}]}]}),
        "messages[0].content[0]",
    );
    refused(
        json!({"model": "m", "messages": [{"role": "function", "name": "f", "content": "x"}]}),
        "messages[0].role",
    );
    refused(
        json!({"model": "m", "messages": [{"role": "user", "content": "x", "tool_call_id": "c"}]}),
        "messages[0].tool_call_id",
    );
    refused(
        json!({"model": "m", "messages": chat(), "stream_options": {"include_usage": true}}),
        "stream_options",
    );
    refused(json!({"messages": chat()}), "model");
    refused(
        json!({"model": "m", "messages": chat(), "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}),
        "response_format.json_schema.name",
    );
    // Values that ask for nothing are not refused.
    ok(
        json!({"model": "m", "messages": chat(), "logprobs": false, "tools": null, "presence_penalty": 0}),
    );
}

#[test]
fn tools_and_tool_history_become_chat() {
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let r = ok(json!({
        "model": "m", "messages": [
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "refusal": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "42"}]}
        ],
        "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
        "max_tokens": 9, "response_format": {"type": "text"}
    }));
    assert_eq!(r.kind, TaskKind::Chat);
    assert_eq!(
        r.request,
        json!({
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "tools": tools, "tool_choice": "required", "parallel_tool_calls": false,
            "max_output_tokens": 9
        })
    );
    // History alone (the tools left out of a follow-up call) is a chat too.
    let r = ok(json!({"model": "m", "messages": [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}
    ]}));
    assert_eq!(r.kind, TaskKind::Chat);
    // Without tools nothing changes.
    assert_eq!(
        ok(json!({"model": "m", "messages": chat(), "tools": null})).kind,
        TaskKind::GenerateText
    );
}
