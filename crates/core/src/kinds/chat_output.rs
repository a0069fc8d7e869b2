//! `chat`'s answer: the assistant message a model gave, validated against the request —
//! tool names among those offered, arguments a JSON object valid against the tool's
//! `parameters`, `tool_choice` and `parallel_tool_calls` honoured — and normalized to
//! `{"content", "tool_calls"?, "finish_reason"}` (docs/kinds.md#chat).

use std::collections::HashSet;

use serde_json::{Map, Value, json};

use super::chat::{ChatRequest, ToolChoice, ToolChoiceMode};
use super::extract_data::{at_pointer, compile_schema};
use super::messages::{clip, clip_long, describe, list_quoted};
use crate::error::OutputViolation;

/// How many schema errors one tool call's violation reports.
const MAX_REPORTED_ARGUMENT_ERRORS: usize = 3;

/// `{"content":"","finish_reason":"stop"}`: the smallest valid answer, in bytes.
pub(super) const CHAT_OUTPUT_FLOOR: u64 = 36;

/// The finish reasons an answer may end with.
pub const FINISH_REASONS: [&str; 4] = ["stop", "length", "tool_calls", "content_filter"];

/// Validates and normalizes a `chat` answer (see the module docs). `finish_reason` is
/// `tool_calls` when the answer calls tools, else the model's `length` or
/// `content_filter`, else `stop`.
pub(super) fn validate_chat(
    request: &ChatRequest,
    output: &Value,
) -> Result<Value, OutputViolation> {
    let Value::Object(map) = output else {
        return Err(violation(format!(
            "output must be a JSON object, not {}",
            describe(output)
        )));
    };
    if let Some(key) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "content" | "tool_calls" | "finish_reason"))
    {
        return Err(violation(format!(
            "unexpected field `{}` (allowed: `content`, `tool_calls`, `finish_reason`)",
            clip(key)
        )));
    }
    let content = match map.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(other) => {
            return Err(violation(format!(
                "`content` must be a string or null, not {}",
                describe(other)
            )));
        }
    };
    let calls = match map.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(i, call)| tool_call(request, i, call))
            .collect::<Result<Vec<Value>, OutputViolation>>()?,
        Some(other) => {
            return Err(violation(format!(
                "`tool_calls` must be an array, not {}",
                describe(other)
            )));
        }
    };
    let mut ids = HashSet::new();
    for (i, call) in calls.iter().enumerate() {
        if !ids.insert(call["id"].as_str().unwrap_or_default()) {
            return Err(violation(format!(
                "tool_calls[{i}].id appears more than once: every call needs its own id"
            )));
        }
    }
    check_choice(request, &calls)?;
    if calls.is_empty() && content.is_none() {
        return Err(violation(
            "the answer has neither `content` nor `tool_calls`",
        ));
    }
    let finish_reason = match map.get("finish_reason") {
        None | Some(Value::Null) => "stop",
        Some(Value::String(reason)) => match reason.as_str() {
            "length" => "length",
            "content_filter" => "content_filter",
            _ => "stop",
        },
        Some(other) => {
            return Err(violation(format!(
                "`finish_reason` must be a string, not {}",
                describe(other)
            )));
        }
    };
    let mut normalized = Map::new();
    normalized.insert("content".into(), json!(content));
    if calls.is_empty() {
        normalized.insert("finish_reason".into(), json!(finish_reason));
    } else {
        normalized.insert("tool_calls".into(), Value::Array(calls));
        normalized.insert("finish_reason".into(), json!("tool_calls"));
    }
    Ok(Value::Object(normalized))
}

/// `tool_choice` and `parallel_tool_calls`, honoured.
fn check_choice(request: &ChatRequest, calls: &[Value]) -> Result<(), OutputViolation> {
    let name_of = |call: &Value| {
        call["function"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    match request.effective_tool_choice() {
        ToolChoice::Mode(ToolChoiceMode::None) if !calls.is_empty() => {
            return Err(violation(
                "tool_choice is `none`: answer with text only, no tool calls",
            ));
        }
        ToolChoice::Mode(ToolChoiceMode::Required) if calls.is_empty() => {
            return Err(violation(
                "tool_choice is `required`: call at least one of the tools",
            ));
        }
        ToolChoice::Function(named) => {
            let forced = named.function.name.as_str();
            if calls.is_empty() {
                return Err(violation(format!(
                    "tool_choice names `{}`: call it",
                    clip(forced)
                )));
            }
            if let Some(other) = calls.iter().map(name_of).find(|n| n != forced) {
                return Err(violation(format!(
                    "tool_choice names `{}`: call only it, not `{}`",
                    clip(forced),
                    clip(&other)
                )));
            }
        }
        _ => {}
    }
    if request.parallel_tool_calls == Some(false) && calls.len() > 1 {
        return Err(violation(format!(
            "parallel_tool_calls is false: call at most one tool, not {}",
            calls.len()
        )));
    }
    Ok(())
}

/// One call: an id, `type` `function` (or absent), an offered function and its
/// arguments — a string of a JSON object valid against the tool's `parameters`.
fn tool_call(request: &ChatRequest, i: usize, call: &Value) -> Result<Value, OutputViolation> {
    let at = format!("tool_calls[{i}]");
    let Value::Object(map) = call else {
        return Err(violation(format!(
            "{at} must be an object {{\"id\", \"type\", \"function\"}}, not {}",
            describe(call)
        )));
    };
    if let Some(key) = map
        .keys()
        .find(|k| !matches!(k.as_str(), "id" | "type" | "function"))
    {
        return Err(violation(format!(
            "{at} has an unexpected field `{}`",
            clip(key)
        )));
    }
    let id = match map.get("id") {
        Some(Value::String(id)) if !id.is_empty() => id,
        Some(other) => {
            return Err(violation(format!(
                "{at}.id must be a non-empty string, got {}",
                clip(&other.to_string())
            )));
        }
        None => return Err(violation(format!("{at} is missing field `id`"))),
    };
    match map.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(other) => {
            return Err(violation(format!(
                "{at}.type must be \"function\", got {}",
                clip(&other.to_string())
            )));
        }
    }
    let Some(Value::Object(function)) = map.get("function") else {
        return Err(violation(format!(
            "{at}.function must be an object {{\"name\", \"arguments\"}}"
        )));
    };
    let name = match function.get("name") {
        Some(Value::String(name)) => name,
        _ => return Err(violation(format!("{at}.function.name must be a string"))),
    };
    let Some(tool) = request.tool(name) else {
        let offered = request
            .tools
            .iter()
            .flatten()
            .map(|t| t.function.name.as_str());
        return Err(violation(if request.tools.is_none() {
            format!(
                "{at} calls `{}`, but no tools were offered: answer with text",
                clip(name)
            )
        } else {
            format!(
                "{at} calls `{}`, which is not one of the tools: {}",
                clip(name),
                list_quoted(offered.collect::<Vec<_>>().into_iter())
            )
        }));
    };
    let arguments = match function.get("arguments") {
        Some(Value::String(text)) => text,
        Some(other) => {
            return Err(violation(format!(
                "{at}.function.arguments must be a string of JSON, not {}",
                describe(other)
            )));
        }
        None => {
            return Err(violation(format!(
                "{at}.function is missing field `arguments`"
            )));
        }
    };
    let parsed: Value = serde_json::from_str(arguments).map_err(|e| {
        violation(format!(
            "{at}.function.arguments of `{}` are not valid JSON ({e}): {}",
            clip(name),
            clip(arguments)
        ))
    })?;
    if !parsed.is_object() {
        return Err(violation(format!(
            "{at}.function.arguments of `{}` must be a JSON object, not {}",
            clip(name),
            describe(&parsed)
        )));
    }
    let schema = tool.parameters_schema();
    let validator = compile_schema(&schema).map_err(|e| {
        violation(format!(
            "the parameters of `{}` cannot be compiled: {}",
            clip(name),
            clip_long(&e.to_string())
        ))
    })?;
    let errors: Vec<String> = validator
        .iter_errors(&parsed)
        .take(MAX_REPORTED_ARGUMENT_ERRORS + 1)
        .map(|e| {
            format!(
                "{}: {}",
                at_pointer(e.instance_path().as_str()),
                clip_long(&e.to_string())
            )
        })
        .collect();
    if !errors.is_empty() {
        let mut message = format!(
            "{at}.function.arguments do not match the parameters of `{}`: {}",
            clip(name),
            errors[..errors.len().min(MAX_REPORTED_ARGUMENT_ERRORS)].join("; ")
        );
        if errors.len() > MAX_REPORTED_ARGUMENT_ERRORS {
            message.push_str("; and more");
        }
        return Err(violation(message));
    }
    Ok(json!({
        "id": id,
        "type": "function",
        "function": { "name": name, "arguments": arguments }
    }))
}

/// The output schema of one `chat` request: the message, its calls' names among the
/// tools (no `tool_calls` property without tools).
pub(super) fn chat_output_schema(request: &ChatRequest) -> Value {
    let mut properties = Map::new();
    properties.insert("content".into(), json!({ "type": ["string", "null"] }));
    if let Some(tools) = &request.tools {
        let names: Vec<&str> = tools.iter().map(|t| t.function.name.as_str()).collect();
        properties.insert(
            "tool_calls".into(),
            json!({
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "id": { "type": "string", "minLength": 1 },
                        "type": { "const": "function" },
                        "function": {
                            "type": "object",
                            "properties": {
                                "name": { "type": "string", "enum": names },
                                "arguments": { "type": "string" }
                            },
                            "required": ["name", "arguments"],
                            "additionalProperties": false
                        }
                    },
                    "required": ["id", "type", "function"],
                    "additionalProperties": false
                }
            }),
        );
    }
    properties.insert(
        "finish_reason".into(),
        json!({ "type": "string", "enum": FINISH_REASONS }),
    );
    json!({
        "type": "object",
        "properties": properties,
        "required": ["content", "finish_reason"],
        "additionalProperties": false
    })
}

fn violation(message: impl Into<String>) -> OutputViolation {
    OutputViolation(message.into())
}
