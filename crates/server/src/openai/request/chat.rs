//! Tool calling through the door: a request with `tools`, or with tool calls or tool
//! results in its history, becomes a `chat` task (docs/openai.md, "Tool calls"). The
//! messages keep OpenAI's shapes, which are `chat`'s; `tools`, `tool_choice` and
//! `parallel_tool_calls` pass as given, and core validates them (a bad one is a 400
//! naming the parameter, e.g. `tools[0].function.parameters`).

use super::{OpenAiError, wrong_type};
use serde_json::{Map, Value};

/// The tool parameters this door passes to a `chat` task.
pub(super) const TOOL_PARAMS: [&str; 3] = ["tools", "tool_choice", "parallel_tool_calls"];

/// Whether the call is a `chat`: it offers tools, or its history holds tool calls or
/// tool results. `tool_choice` / `parallel_tool_calls` without tools is refused, as
/// OpenAI does.
pub(super) fn is_chat<'m>(
    get: &impl Fn(&str) -> Option<&'m Value>,
    messages: &[Value],
) -> Result<bool, OpenAiError> {
    let offers_tools = get("tools").is_some();
    if !offers_tools {
        for param in ["tool_choice", "parallel_tool_calls"] {
            if get(param).is_some() {
                return Err(OpenAiError::invalid(
                    param,
                    format!("`{param}` is only allowed when `tools` are specified"),
                ));
            }
        }
    }
    let history = messages.iter().any(|m| {
        m.get("role").and_then(Value::as_str) == Some("tool")
            || m.get("tool_calls").is_some_and(|c| !c.is_null())
    });
    Ok(offers_tools || history)
}

/// Puts the tool parameters into the task request.
pub(super) fn insert_tool_params<'m>(
    get: &impl Fn(&str) -> Option<&'m Value>,
    request: &mut Map<String, Value>,
) {
    for param in TOOL_PARAMS {
        if let Some(v) = get(param) {
            request.insert(param.into(), v.clone());
        }
    }
}

/// A `chat` takes no structured-output format: only `text` (or none).
pub(super) fn check_format(format: Option<&Value>) -> Result<(), OpenAiError> {
    match format {
        None => Ok(()),
        Some(Value::Object(f)) if f.get("type").and_then(Value::as_str) == Some("text") => Ok(()),
        Some(Value::Object(_)) => Err(OpenAiError::unsupported(
            "response_format",
            "`response_format` json_object / json_schema together with tool calling is not \
             supported by Tollgate: use `text` or leave it out",
        )),
        Some(other) => Err(wrong_type("response_format", "an object", other)),
    }
}

/// A `tool` message: `{"role": "tool", "tool_call_id", "content"}` (its content text or
/// text parts, read by the caller).
pub(super) fn tool_message(map: &Map<String, Value>, content: String) -> Value {
    let mut message = Map::new();
    message.insert("role".into(), Value::String("tool".into()));
    if let Some(id) = map.get("tool_call_id") {
        message.insert("tool_call_id".into(), id.clone());
    }
    message.insert("content".into(), Value::String(content));
    Value::Object(message)
}
