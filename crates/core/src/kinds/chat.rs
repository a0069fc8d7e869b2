//! `chat`: a conversation whose answer is the assistant's next message — text and/or
//! calls of the function tools offered (docs/kinds.md#chat). Messages, tools, tool calls
//! and `tool_choice` take OpenAI's chat completions shapes, so the OpenAI-compatible door
//! maps onto this kind field for field.
//!
//! Parsing is by hand, field by field, so every error names its path
//! (`request.messages[3].tool_call_id`, `request.tools[1].function.parameters`, …).
//! A tool's `parameters` is a caller's JSON Schema, checked exactly as `extract_data`'s
//! schema is (local `$ref`s only, a bundled draft, compiles; nothing is ever fetched).

use std::collections::HashSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::Sampling;
use super::chat_tools::{parse_tool_choice, parse_tools};
use super::messages::{clip, describe};
use super::parse::{ROOT, de, object, optional};
use super::sampling::with_sampling_fields;
use crate::error::InvalidInput;

/// Most messages a `chat` request may have.
pub const MAX_CHAT_MESSAGES: usize = 1000;
/// Most tools a `chat` request may offer (OpenAI's limit).
pub const MAX_CHAT_TOOLS: usize = 128;
/// Most tool calls one assistant message may hold.
pub const MAX_TOOL_CALLS: usize = 128;
/// Longest tool name, in bytes (letters, digits, `_` and `-` only: OpenAI's and
/// Anthropic's common rule).
pub const MAX_TOOL_NAME_BYTES: usize = 64;
/// Longest tool call id, in bytes.
pub const MAX_TOOL_CALL_ID_BYTES: usize = 256;

/// The fields of a `chat` request besides the sampling fields.
const CHAT_FIELDS: [&str; 4] = ["messages", "tools", "tool_choice", "parallel_tool_calls"];

/// A `chat` request: the conversation so far and the tools the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// The conversation, in order (1 to [`MAX_CHAT_MESSAGES`] messages).
    pub messages: Vec<ChatTurn>,
    /// The function tools the model may call (1 to [`MAX_CHAT_TOOLS`], names unique).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<ChatTool>>,
    /// Whether and which tool must be called; absent means `auto` (or `none` without tools).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Whether the answer may call several tools at once (absent: yes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// The sampling fields (flattened into the request object).
    #[serde(flatten)]
    pub sampling: Sampling,
}

impl ChatRequest {
    /// The offered tool of a name.
    pub fn tool(&self, name: &str) -> Option<&FunctionTool> {
        self.tools
            .iter()
            .flatten()
            .map(|t| &t.function)
            .find(|f| f.name == name)
    }

    /// The tool choice in force: as given, else `auto` with tools and `none` without.
    pub fn effective_tool_choice(&self) -> ToolChoice {
        match (&self.tool_choice, &self.tools) {
            (Some(choice), _) => choice.clone(),
            (None, Some(_)) => ToolChoice::Mode(ToolChoiceMode::Auto),
            (None, None) => ToolChoice::Mode(ToolChoiceMode::None),
        }
    }
}

/// One message of a chat conversation, by its `role`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum ChatTurn {
    /// Instructions to the model.
    System {
        /// The text.
        content: String,
    },
    /// The human side.
    User {
        /// The text.
        content: String,
    },
    /// An earlier answer of the model: text, tool calls, or both.
    Assistant {
        /// The text (`null` when the message only calls tools).
        #[serde(default)]
        content: Option<String>,
        /// The tools it called (absent when none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        tool_calls: Option<Vec<ToolCall>>,
    },
    /// The result of one tool call.
    Tool {
        /// The id of the call (of an earlier assistant message) this answers.
        tool_call_id: String,
        /// The result, as text.
        content: String,
    },
}

/// The type of every tool and tool call: only function tools exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolType {
    /// A function tool.
    Function,
}

/// A tool offered to the model: `{"type": "function", "function": {…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatTool {
    /// Always `function`.
    #[serde(rename = "type")]
    pub tool_type: ToolType,
    /// The function.
    pub function: FunctionTool,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionTool {
    /// Its name: 1 to [`MAX_TOOL_NAME_BYTES`] letters, digits, `_` or `-`; unique.
    pub name: String,
    /// What it does (the model reads this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object schema; absent: no arguments, `{}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
    /// OpenAI's strict mode for the arguments (passed on to OpenAI-compatible providers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
}

impl FunctionTool {
    /// The arguments' schema as sent to providers: `parameters`, or an object with no
    /// properties.
    pub fn parameters_schema(&self) -> Value {
        self.parameters
            .clone()
            .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}}))
    }
}

/// One call of a tool: `{"id", "type": "function", "function": {"name", "arguments"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The call's id, which the tool's result names.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub call_type: ToolType,
    /// The function called and its arguments.
    pub function: FunctionCall,
}

/// The function a tool call calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FunctionCall {
    /// The tool's name.
    pub name: String,
    /// The arguments: a JSON object, as a string of JSON.
    pub arguments: String,
}

/// `tool_choice`: a mode, or one function that must be called.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `auto`, `none` or `required`.
    Mode(ToolChoiceMode),
    /// `{"type": "function", "function": {"name"}}`: call this one.
    Function(NamedToolChoice),
}

impl ToolChoice {
    /// The function a named choice forces.
    pub fn forced_name(&self) -> Option<&str> {
        match self {
            ToolChoice::Function(n) => Some(&n.function.name),
            ToolChoice::Mode(_) => None,
        }
    }
}

/// The modes of `tool_choice`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoiceMode {
    /// The model decides: text, calls, or both.
    Auto,
    /// No tool calls: text only.
    None,
    /// At least one tool call.
    Required,
}

/// `{"type": "function", "function": {"name"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedToolChoice {
    /// Always `function`.
    #[serde(rename = "type")]
    pub choice_type: ToolType,
    /// The function that must be called.
    pub function: ToolName,
}

/// A function's name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolName {
    /// The name.
    pub name: String,
}

pub(super) fn parse_chat(value: &Value) -> Result<ChatRequest, InvalidInput> {
    let map = object(value, ROOT, &with_sampling_fields(&CHAT_FIELDS))?;
    let messages = match map.get("messages") {
        None | Some(Value::Null) => {
            return Err(InvalidInput::field(ROOT, "missing field `messages`"));
        }
        Some(v) => parse_turns(v)?,
    };
    let tools = match map.get("tools") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_tools(v)?),
    };
    let tool_choice = match map.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_tool_choice(v, tools.as_deref())?),
    };
    let request = ChatRequest {
        messages,
        tools,
        tool_choice,
        parallel_tool_calls: optional(map, "parallel_tool_calls", ROOT)?,
        sampling: Sampling::read(map)?,
    };
    request.sampling.check()?;
    Ok(request)
}

/// The messages: 1 to [`MAX_CHAT_MESSAGES`]; every tool result answers a call of an
/// earlier assistant message; call ids are unique in the conversation.
fn parse_turns(value: &Value) -> Result<Vec<ChatTurn>, InvalidInput> {
    let path = "request.messages";
    let elements = array(value, path)?;
    if elements.is_empty() {
        return Err(InvalidInput::field(
            path,
            "must contain at least one message",
        ));
    }
    if elements.len() > MAX_CHAT_MESSAGES {
        return Err(InvalidInput::field(
            path,
            format!(
                "has {} messages, over the limit of {MAX_CHAT_MESSAGES}",
                elements.len()
            ),
        ));
    }
    let mut call_ids: HashSet<String> = HashSet::new();
    let mut turns = Vec::with_capacity(elements.len());
    for (i, element) in elements.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let Value::Object(map) = element else {
            return Err(InvalidInput::field(
                &at,
                format!("must be a JSON object, not {}", describe(element)),
            ));
        };
        let role = match map.get("role") {
            Some(Value::String(role)) => role.as_str(),
            Some(other) => {
                return Err(InvalidInput::field(
                    format!("{at}.role"),
                    format!("must be a string, not {}", describe(other)),
                ));
            }
            None => return Err(InvalidInput::field(&at, "missing field `role`")),
        };
        let turn = match role {
            "system" | "user" => {
                let map = object(element, &at, &["role", "content"])?;
                let content = text(map, "content", &at)?;
                if role == "system" {
                    ChatTurn::System { content }
                } else {
                    ChatTurn::User { content }
                }
            }
            "assistant" => {
                let map = object(element, &at, &["role", "content", "tool_calls"])?;
                let content: Option<String> = optional(map, "content", &at)?;
                let tool_calls = match map.get("tool_calls") {
                    None | Some(Value::Null) => None,
                    Some(v) => {
                        let calls = parse_history_calls(v, &format!("{at}.tool_calls"))?;
                        for (j, call) in calls.iter().enumerate() {
                            if !call_ids.insert(call.id.clone()) {
                                return Err(InvalidInput::field(
                                    format!("{at}.tool_calls[{j}].id"),
                                    format!(
                                        "`{}` is the id of another tool call in this chat: \
                                         ids must be unique",
                                        clip(&call.id)
                                    ),
                                ));
                            }
                        }
                        (!calls.is_empty()).then_some(calls)
                    }
                };
                if content.is_none() && tool_calls.is_none() {
                    return Err(InvalidInput::field(
                        &at,
                        "an assistant message needs `content` or `tool_calls`",
                    ));
                }
                ChatTurn::Assistant {
                    content,
                    tool_calls,
                }
            }
            "tool" => {
                let map = object(element, &at, &["role", "tool_call_id", "content"])?;
                let tool_call_id = match map.get("tool_call_id") {
                    None | Some(Value::Null) => {
                        return Err(InvalidInput::field(
                            &at,
                            "missing field `tool_call_id`: a tool message answers one tool call",
                        ));
                    }
                    Some(v) => de::<String>(v, &format!("{at}.tool_call_id"))?,
                };
                if !call_ids.contains(&tool_call_id) {
                    return Err(InvalidInput::field(
                        format!("{at}.tool_call_id"),
                        format!(
                            "`{}` is not the id of a tool call of an earlier assistant message",
                            clip(&tool_call_id)
                        ),
                    ));
                }
                ChatTurn::Tool {
                    tool_call_id,
                    content: text(map, "content", &at)?,
                }
            }
            other => {
                return Err(InvalidInput::field(
                    format!("{at}.role"),
                    format!(
                        "unknown role `{}`: use system, user, assistant or tool",
                        clip(other)
                    ),
                ));
            }
        };
        turns.push(turn);
    }
    Ok(turns)
}

/// The tool calls of an earlier assistant message: well formed, arguments JSON text.
fn parse_history_calls(value: &Value, path: &str) -> Result<Vec<ToolCall>, InvalidInput> {
    let elements = array(value, path)?;
    if elements.len() > MAX_TOOL_CALLS {
        return Err(InvalidInput::field(
            path,
            format!(
                "has {} tool calls, over the limit of {MAX_TOOL_CALLS}",
                elements.len()
            ),
        ));
    }
    let mut calls = Vec::with_capacity(elements.len());
    for (j, element) in elements.iter().enumerate() {
        let at = format!("{path}[{j}]");
        let call: ToolCall = de(element, &at)?;
        check_call_id(&call.id, &format!("{at}.id"))?;
        if serde_json::from_str::<Value>(&call.function.arguments).is_err() {
            return Err(InvalidInput::field(
                format!("{at}.function.arguments"),
                "must be a string of JSON",
            ));
        }
        calls.push(call);
    }
    Ok(calls)
}

fn check_call_id(id: &str, path: &str) -> Result<(), InvalidInput> {
    if id.is_empty() || id.len() > MAX_TOOL_CALL_ID_BYTES {
        return Err(InvalidInput::field(
            path,
            format!("must be 1 to {MAX_TOOL_CALL_ID_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// The array at `path`, or serde's type error.
pub(super) fn array<'a>(value: &'a Value, path: &str) -> Result<&'a Vec<Value>, InvalidInput> {
    match value {
        Value::Array(elements) => Ok(elements),
        other => Err(InvalidInput::field(
            path,
            format!("invalid type: {}, expected an array", describe(other)),
        )),
    }
}

/// A required string field.
fn text(map: &Map<String, Value>, key: &str, path: &str) -> Result<String, InvalidInput> {
    match map.get(key) {
        None | Some(Value::Null) => {
            Err(InvalidInput::field(path, format!("missing field `{key}`")))
        }
        Some(v) => de(v, &format!("{path}.{key}")),
    }
}

#[cfg(test)]
#[path = "chat_tests.rs"]
mod tests;
