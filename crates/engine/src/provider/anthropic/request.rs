//! The Messages API request body: the [`Prompt`]'s system messages as `system`, the rest
//! as `messages`, its structured output as a forced tool or `output_config.format`, the
//! model's `params` merged in, the request's own sampling fields over them.

use crate::config::StructuredOutput;
use crate::provider::ProviderCall;
use crate::provider::prompt::{
    AnswerShape, OutputFormat, Prompt, PromptMessage, PromptRole, ToolOffer,
};
use serde_json::{Map, Value, json};
use tollgate_core::kinds::{ToolChoice, ToolChoiceMode};

/// The Messages API body for a call whose structured output is asked for as `mode`
/// says, and how to read its answer.
pub fn request_body_as(call: &ProviderCall<'_>, mode: StructuredOutput) -> (Value, AnswerShape) {
    let prompt = Prompt::render_as(call, mode);
    (body(call, &prompt), prompt.shape)
}

/// The body fields that ask for `format`: `tools` with one tool whose `input_schema` is
/// the schema and `tool_choice` forcing it, or `output_config.format` (JSON outputs).
/// JSON mode without a schema does not exist in this API: its prompt states the schema
/// and sends no field (configuration refuses `json_object` for `anthropic`). The token
/// bound counts their JSON bytes.
pub fn format_fields(format: &OutputFormat) -> Vec<(&'static str, Value)> {
    match format {
        OutputFormat::Tool { name, schema, .. } => vec![
            (
                "tools",
                json!([{
                    "name": name,
                    "description": "Give the answer as this tool's input.",
                    "input_schema": schema,
                }]),
            ),
            ("tool_choice", json!({"type": "tool", "name": name})),
        ],
        OutputFormat::JsonSchema { schema, .. } => vec![(
            "output_config",
            json!({"format": {"type": "json_schema", "schema": schema}}),
        )],
        OutputFormat::JsonObject => Vec::new(),
    }
}

/// The body fields that offer a `chat`'s tools: `tools` (`{"name", "description",
/// "input_schema"}`) and `tool_choice` — `auto`, `any` for `required`, `tool` for a
/// named function, `none` — with `disable_parallel_tool_use` when
/// `parallel_tool_calls` is false. The token bound counts their JSON bytes.
pub fn tool_fields(offer: &ToolOffer) -> Vec<(&'static str, Value)> {
    let tools: Vec<Value> = offer
        .tools
        .iter()
        .map(|t| {
            let mut tool = json!({
                "name": t.function.name,
                "input_schema": t.function.parameters_schema(),
            });
            if let Some(d) = &t.function.description {
                tool["description"] = json!(d);
            }
            tool
        })
        .collect();
    let mut fields = vec![("tools", Value::Array(tools))];
    let mut choice = match &offer.tool_choice {
        None => None,
        Some(ToolChoice::Mode(ToolChoiceMode::Auto)) => Some(json!({"type": "auto"})),
        Some(ToolChoice::Mode(ToolChoiceMode::Required)) => Some(json!({"type": "any"})),
        Some(ToolChoice::Mode(ToolChoiceMode::None)) => Some(json!({"type": "none"})),
        Some(ToolChoice::Function(named)) => {
            Some(json!({"type": "tool", "name": named.function.name}))
        }
    };
    if offer.parallel_tool_calls == Some(false) {
        let choice = choice.get_or_insert_with(|| json!({"type": "auto"}));
        if choice["type"] != "none" {
            choice["disable_parallel_tool_use"] = json!(true);
        }
    }
    if let Some(choice) = choice {
        fields.push(("tool_choice", choice));
    }
    fields
}

/// The non-system messages as the Messages API takes them: text as a string; an
/// assistant's tool calls as `tool_use` blocks (after its text, if any); tool results as
/// `tool_result` blocks, consecutive ones in one user message (the API wants every
/// result of one turn's calls together, right after it).
fn messages(prompt: &Prompt) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    let mut results: Vec<Value> = Vec::new();
    for m in prompt
        .messages
        .iter()
        .filter(|m| m.role != PromptRole::System)
    {
        if m.role == PromptRole::Tool {
            results.push(json!({
                "type": "tool_result",
                "tool_use_id": m.tool_call_id.as_deref().unwrap_or_default(),
                "content": m.content,
            }));
            continue;
        }
        if !results.is_empty() {
            out.push(json!({"role": "user", "content": std::mem::take(&mut results)}));
        }
        out.push(message_value(m));
    }
    if !results.is_empty() {
        out.push(json!({"role": "user", "content": results}));
    }
    out
}

fn message_value(m: &PromptMessage) -> Value {
    if m.tool_calls.is_empty() {
        return json!({"role": m.role_name(), "content": m.content});
    }
    let mut blocks = Vec::new();
    if !m.content.is_empty() {
        blocks.push(json!({"type": "text", "text": m.content}));
    }
    for call in &m.tool_calls {
        // Parsed at submit: history arguments are JSON.
        let input: Value =
            serde_json::from_str(&call.function.arguments).unwrap_or_else(|_| json!({}));
        blocks.push(json!({
            "type": "tool_use",
            "id": call.id,
            "name": call.function.name,
            "input": input,
        }));
    }
    json!({"role": m.role_name(), "content": blocks})
}

/// The body of `call` whose prompt is `prompt`.
pub(super) fn body(call: &ProviderCall<'_>, prompt: &Prompt) -> Value {
    let mut body: Map<String, Value> = call.model.params.clone();
    body.insert("model".into(), json!(call.model.model));
    // The Messages API calls it `max_tokens` only.
    if !body.contains_key("max_tokens")
        && let Some(n) = body.remove("max_completion_tokens")
    {
        body.insert("max_tokens".into(), n);
    }
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
        if let Some(n) = s.max_output_tokens {
            body.insert("max_tokens".into(), json!(n));
        }
        if let Some(t) = s.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(p) = s.top_p {
            body.insert("top_p".into(), json!(p));
        }
        if let Some(stop) = &s.stop {
            body.insert("stop_sequences".into(), json!(stop));
        }
    }
    // A request's `seed` has no counterpart here: it is not sent.
    let system: Vec<&str> = prompt
        .messages
        .iter()
        .filter(|m| m.role == PromptRole::System)
        .map(|m| m.content.as_str())
        .collect();
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages(prompt)));
    Value::Object(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{ModelRef, TaskKind, TaskRequest};

    #[test]
    fn system_messages_are_hoisted_and_sampling_renamed() {
        let request = TaskRequest::parse(
            TaskKind::GenerateText,
            &json!({"system": "Be brief.", "messages": [
                {"role": "user", "content": "hi"}, {"role": "system", "content": "No emoji."}
            ], "stop": ["END"], "seed": 3, "max_output_tokens": 9}),
        )
        .unwrap();
        let schema = request.output_schema();
        let mut model = ModelRef::new("claude", "claude-x");
        model
            .params
            .insert("max_completion_tokens".into(), json!(50));
        model.params.insert("top_k".into(), json!(5));
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body_as(&call, StructuredOutput::Tool);
        assert_eq!(shape, AnswerShape::Text);
        assert_eq!(body["system"], "Be brief.\n\nNo emoji.");
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
        assert_eq!(body["max_tokens"], 9);
        assert_eq!(body["stop_sequences"], json!(["END"]));
        assert_eq!(body["top_k"], 5);
        assert!(body.get("seed").is_none() && body.get("max_completion_tokens").is_none());
        assert!(body.get("tools").is_none(), "free text needs no tool");
    }

    #[test]
    fn a_chat_maps_to_tool_use_and_tool_result_blocks() {
        let request = TaskRequest::parse(
            TaskKind::Chat,
            &json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather and time?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "t1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                    {"id": "t2", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "t1", "content": "Sunny"},
                {"role": "tool", "tool_call_id": "t2", "content": "10:00"},
                {"role": "user", "content": "Thanks"}],
              "tools": [
                {"type": "function", "function": {"name": "weather", "description": "The weather",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
                {"type": "function", "function": {"name": "time"}}],
              "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 30}),
        )
        .unwrap();
        let schema = request.output_schema();
        let model = ModelRef::new("claude", "claude-x");
        let call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let (body, shape) = request_body_as(&call, StructuredOutput::Tool);
        assert_eq!(shape, AnswerShape::Message);
        assert_eq!(body["system"], "Be brief.");
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": "Weather and time?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "t1", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "t2", "name": "time", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "Sunny"},
                    {"type": "tool_result", "tool_use_id": "t2", "content": "10:00"}]},
                {"role": "user", "content": "Thanks"}
            ])
        );
        assert_eq!(
            body["tools"],
            json!([
                {"name": "weather", "description": "The weather",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}},
                {"name": "time", "input_schema": {"type": "object", "properties": {}}}
            ])
        );
        assert_eq!(
            body["tool_choice"],
            json!({"type": "any", "disable_parallel_tool_use": true})
        );
        assert_eq!(body["max_tokens"], 30);
        // The other choices.
        let offer = |choice: Value| {
            let mut raw = request.to_value();
            raw["tool_choice"] = choice;
            raw.as_object_mut().unwrap().remove("parallel_tool_calls");
            let TaskRequest::Chat(r) = TaskRequest::parse(TaskKind::Chat, &raw).unwrap() else {
                unreachable!()
            };
            let fields = tool_fields(&ToolOffer {
                tools: r.tools.clone().unwrap(),
                tool_choice: r.tool_choice.clone(),
                parallel_tool_calls: r.parallel_tool_calls,
            });
            fields
                .into_iter()
                .find(|(k, _)| *k == "tool_choice")
                .map(|(_, v)| v)
        };
        assert_eq!(offer(json!("auto")), Some(json!({"type": "auto"})));
        assert_eq!(offer(json!("none")), Some(json!({"type": "none"})));
        assert_eq!(
            offer(json!({"type": "function", "function": {"name": "time"}})),
            Some(json!({"type": "tool", "name": "time"}))
        );
        assert_eq!(offer(Value::Null), None);
    }
}
