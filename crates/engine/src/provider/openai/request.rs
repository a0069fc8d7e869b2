//! The chat completions request body: the [`Prompt`]'s messages and its structured
//! output (`response_format`, or a forced tool), the model's `params` merged in, the
//! request's own sampling fields over them.

use crate::config::StructuredOutput;
use crate::provider::ProviderCall;
use crate::provider::prompt::{AnswerShape, OutputFormat, Prompt, PromptMessage, ToolOffer};
use serde_json::{Map, Value, json};
use tollgate_core::kinds::Sampling;

/// The chat completions request body for a call in the default `json_schema` mode, and
/// how to read its answer.
pub fn request_body(call: &ProviderCall<'_>) -> (Value, AnswerShape) {
    request_body_as(call, StructuredOutput::JsonSchema)
}

/// The chat completions request body for a call whose structured output is asked for
/// as `mode` says, and how to read its answer.
pub fn request_body_as(call: &ProviderCall<'_>, mode: StructuredOutput) -> (Value, AnswerShape) {
    let prompt = Prompt::render_as(call, mode);
    (body(call, &prompt), prompt.shape)
}

/// The body fields that ask for `format`: `response_format`
/// (`{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}` or
/// `{"type": "json_object"}`), or `tools` with one function and `tool_choice` forcing
/// it. The token bound counts their JSON bytes.
pub fn format_fields(format: &OutputFormat) -> Vec<(&'static str, Value)> {
    match format {
        OutputFormat::JsonSchema {
            name,
            schema,
            strict,
        } => vec![(
            "response_format",
            json!({
                "type": "json_schema",
                "json_schema": { "name": name, "schema": schema, "strict": strict }
            }),
        )],
        OutputFormat::JsonObject => vec![("response_format", json!({"type": "json_object"}))],
        OutputFormat::Tool {
            name,
            schema,
            strict,
        } => {
            let mut function = json!({
                "name": name,
                "description": "Give the answer as this function's arguments.",
                "parameters": schema,
            });
            if *strict {
                function["strict"] = json!(true);
            }
            vec![
                (
                    "tools",
                    json!([{ "type": "function", "function": function }]),
                ),
                (
                    "tool_choice",
                    json!({"type": "function", "function": { "name": name }}),
                ),
            ]
        }
    }
}

/// The body fields that offer a `chat`'s tools: `tools` as given, `tool_choice` and
/// `parallel_tool_calls` when the request set them. The token bound counts their JSON
/// bytes.
pub fn tool_fields(offer: &ToolOffer) -> Vec<(&'static str, Value)> {
    let mut fields = vec![("tools", json!(offer.tools))];
    if let Some(choice) = &offer.tool_choice {
        fields.push(("tool_choice", json!(choice)));
    }
    if let Some(parallel) = offer.parallel_tool_calls {
        fields.push(("parallel_tool_calls", json!(parallel)));
    }
    fields
}

/// One message as chat completions take it: `{"role", "content"}`, an assistant's
/// `tool_calls` (its content `null` when it has none), a tool result's `tool_call_id`.
pub fn message_value(m: &PromptMessage) -> Value {
    let mut message = json!({"role": m.role, "content": m.content});
    if !m.tool_calls.is_empty() {
        if m.content.is_empty() {
            message["content"] = Value::Null;
        }
        message["tool_calls"] = json!(m.tool_calls);
    }
    if let Some(id) = &m.tool_call_id {
        message["tool_call_id"] = json!(id);
    }
    message
}

/// The body of `call` whose prompt is `prompt`.
pub(super) fn body(call: &ProviderCall<'_>, prompt: &Prompt) -> Value {
    let mut body: Map<String, Value> = call.model.params.clone();
    body.insert("model".into(), json!(call.model.model));
    if let Some(format) = &prompt.format {
        for (key, value) in format_fields(format) {
            body.insert(key.into(), value);
        }
    }
    if let Some(offer) = &prompt.tools {
        for (key, value) in tool_fields(offer) {
            body.insert(key.into(), value);
        }
    }
    if let Some(s) = call.request.sampling() {
        insert_sampling(&mut body, s);
    }
    let messages: Vec<Value> = prompt.messages.iter().map(message_value).collect();
    body.insert("messages".into(), Value::Array(messages));
    Value::Object(body)
}

/// The request's sampling fields win over the model's `params`; `max_output_tokens` is
/// sent as `max_tokens` (what every OpenAI-compatible server reads).
fn insert_sampling(body: &mut Map<String, Value>, s: &Sampling) {
    if let Some(t) = s.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(n) = s.max_output_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    if let Some(p) = s.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(stop) = &s.stop {
        body.insert("stop".into(), json!(stop));
    }
    if let Some(seed) = s.seed {
        body.insert("seed".into(), json!(seed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::openai::parse_answer;
    use tollgate_core::{ModelRef, TaskKind, TaskRequest};

    fn call_for(kind: TaskKind, raw: Value) -> (TaskRequest, Value) {
        let request = TaskRequest::parse(kind, &raw).unwrap();
        let schema = request.output_schema();
        (request, schema)
    }

    #[test]
    fn classify_asks_for_strict_nested_json_schema() {
        let (request, schema) = call_for(
            TaskKind::Classify,
            json!({"input": "Win a cruise", "labels": ["spam", "ham"]}),
        );
        let mut model = ModelRef::new("openai", "gpt-x");
        model.params.insert("temperature".into(), json!(0));
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: Some("label `eggs` is not one of the labels"),
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body(&call);
        assert_eq!(shape, AnswerShape::Json);
        assert_eq!(body["model"], "gpt-x");
        assert_eq!(body["temperature"], 0);
        assert_eq!(body["response_format"]["type"], "json_schema");
        assert_eq!(body["response_format"]["json_schema"]["strict"], true);
        assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
        let messages = body["messages"].as_array().unwrap();
        assert!(
            messages.last().unwrap()["content"]
                .as_str()
                .unwrap()
                .contains("eggs")
        );
    }

    #[test]
    fn non_object_extract_schemas_are_wrapped_and_unwrapped() {
        let (request, schema) = call_for(
            TaskKind::ExtractData,
            json!({"input": "x", "schema": {
                "type": "array", "items": {"$ref": "#/$defs/n"},
                "$defs": {"n": {"type": "integer"}}
            }}),
        );
        let model = ModelRef::new("openai", "m");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body(&call);
        assert_eq!(shape, AnswerShape::WrappedJson);
        let sent = &body["response_format"]["json_schema"]["schema"];
        assert_eq!(sent["properties"]["value"]["type"], "array");
        assert_eq!(sent["$defs"]["n"]["type"], "integer");
        let answer = json!({
            "choices": [{"message": {"content": "{\"value\": [1, 2]}"}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3}
        });
        let parsed = parse_answer(&answer, shape).unwrap();
        assert_eq!(parsed.output, json!([1, 2]));
        assert_eq!(parsed.usage.input_tokens, 7);
        assert_eq!(parsed.usage.output_tokens, 3);
    }

    #[test]
    fn a_chat_extract_is_sent_as_given_with_its_sampling() {
        let schema = json!({
            "type": "object", "properties": {"a": {"type": "integer"}},
            "required": ["a"], "additionalProperties": false
        });
        let (request, output_schema) = call_for(
            TaskKind::ExtractData,
            json!({
                "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                "schema": schema, "top_p": 0.5, "stop": ["END"], "seed": 9,
                "max_output_tokens": 20, "temperature": 0.1
            }),
        );
        let model = ModelRef::new("openai", "m");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &output_schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body(&call);
        assert_eq!(shape, AnswerShape::Json);
        assert_eq!(
            body["messages"],
            json!([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
        );
        assert_eq!(body["response_format"]["json_schema"]["schema"], schema);
        assert_eq!(body["response_format"]["json_schema"]["strict"], true);
        assert_eq!(
            (
                &body["top_p"],
                &body["stop"],
                &body["seed"],
                &body["max_tokens"]
            ),
            (&json!(0.5), &json!(["END"]), &json!(9), &json!(20))
        );
        assert_eq!(body["temperature"], 0.1);
    }

    #[test]
    fn any_object_is_json_mode() {
        let (request, output_schema) = call_for(
            TaskKind::ExtractData,
            json!({"messages": [{"role": "user", "content": "u"}], "schema": {"type": "object"}}),
        );
        let model = ModelRef::new("openai", "m");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &output_schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, _) = request_body(&call);
        assert_eq!(body["response_format"], json!({"type": "json_object"}));
    }

    #[test]
    fn a_chat_sends_its_conversation_and_tools_as_given() {
        let tools = json!([{"type": "function", "function": {"name": "time", "strict": true,
            "parameters": {"type": "object", "properties": {}, "additionalProperties": false}}}]);
        let (request, output_schema) = call_for(
            TaskKind::Chat,
            json!({"messages": [
                {"role": "user", "content": "Time?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "10:00"}],
              "tools": tools, "tool_choice": {"type": "function", "function": {"name": "time"}},
              "parallel_tool_calls": false, "temperature": 0.3, "max_output_tokens": 12}),
        );
        let model = ModelRef::new("openai", "m");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &output_schema,
            previous_error: Some("tool_calls[0] calls `tme`"),
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        for mode in [
            StructuredOutput::JsonSchema,
            StructuredOutput::Tool,
            StructuredOutput::Prompt,
        ] {
            let (body, shape) = request_body_as(&call, mode);
            assert_eq!(shape, AnswerShape::Message);
            assert!(body.get("response_format").is_none(), "{mode:?}");
            assert_eq!(body["tools"], tools);
            assert_eq!(
                body["tool_choice"],
                json!({"type": "function", "function": {"name": "time"}})
            );
            assert_eq!(body["parallel_tool_calls"], false);
            assert_eq!(
                (&body["temperature"], &body["max_tokens"]),
                (&json!(0.3), &json!(12))
            );
            let messages = body["messages"].as_array().unwrap();
            assert_eq!(
                messages[..3],
                [
                    json!({"role": "user", "content": "Time?"}),
                    json!({"role": "assistant", "content": null, "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "time", "arguments": "{}"}}]}),
                    json!({"role": "tool", "content": "10:00", "tool_call_id": "c1"})
                ]
            );
            assert!(messages[3]["content"].as_str().unwrap().contains("`tme`"));
        }
    }
}
