//! The Messages API request body: the [`Prompt`]'s system messages as `system`, the rest
//! as `messages`, its structured output as a forced tool or `output_config.format`, the
//! model's `params` merged in, the request's own sampling fields over them.

use crate::config::StructuredOutput;
use crate::provider::ProviderCall;
use crate::provider::prompt::{AnswerShape, OutputFormat, Prompt};
use serde_json::{Map, Value, json};
use tollgate_core::TaskRequest;
use tollgate_core::kinds::ChatRole;

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
    let (max_output_tokens, temperature, top_p, stop) = match call.request {
        TaskRequest::GenerateText(r) => (
            r.max_output_tokens,
            r.temperature,
            r.top_p,
            r.stop.as_deref(),
        ),
        TaskRequest::ExtractData(r) => (
            r.max_output_tokens,
            r.temperature,
            r.top_p,
            r.stop.as_deref(),
        ),
        TaskRequest::Classify(_) | TaskRequest::ClassifyMany(_) | TaskRequest::Embed(_) => {
            (None, None, None, None)
        }
    };
    if let Some(n) = max_output_tokens {
        body.insert("max_tokens".into(), json!(n));
    }
    if let Some(t) = temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(stop) = stop {
        body.insert("stop_sequences".into(), json!(stop));
    }
    // A request's `seed` has no counterpart here: it is not sent.
    let system: Vec<&str> = prompt
        .messages
        .iter()
        .filter(|m| m.role == ChatRole::System)
        .map(|m| m.content.as_str())
        .collect();
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    let messages: Vec<Value> = prompt
        .messages
        .iter()
        .filter(|m| m.role != ChatRole::System)
        .map(|m| json!({"role": m.role_name(), "content": m.content}))
        .collect();
    body.insert("messages".into(), Value::Array(messages));
    Value::Object(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::{ModelRef, TaskKind};

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
}
