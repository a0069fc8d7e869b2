//! The published JSON Schemas (draft 2020-12) of `chat`'s request and output.

use serde_json::{Value, json};

use super::chat::{
    MAX_CHAT_MESSAGES, MAX_CHAT_TOOLS, MAX_TOOL_CALL_ID_BYTES, MAX_TOOL_CALLS, MAX_TOOL_NAME_BYTES,
};
use super::chat_output::FINISH_REASONS;
use super::sampling::with_sampling_schemas;

fn tool_name_schema() -> Value {
    json!({
        "type": "string",
        "pattern": format!("^[A-Za-z0-9_-]{{1,{MAX_TOOL_NAME_BYTES}}}$")
    })
}

fn tool_call_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "id": { "type": "string", "minLength": 1, "maxLength": MAX_TOOL_CALL_ID_BYTES },
            "type": { "const": "function" },
            "function": {
                "type": "object",
                "properties": {
                    "name": { "type": "string" },
                    "arguments": {
                        "type": "string",
                        "description": "The arguments: a JSON object, as a string of JSON."
                    }
                },
                "required": ["name", "arguments"],
                "additionalProperties": false
            }
        },
        "required": ["id", "type", "function"],
        "additionalProperties": false
    })
}

fn text_message(role: &str) -> Value {
    json!({
        "type": "object",
        "properties": { "role": { "const": role }, "content": { "type": "string" } },
        "required": ["role", "content"],
        "additionalProperties": false
    })
}

/// The published schema of a `chat` request.
pub(super) fn chat_request_schema(dialect: &str) -> Value {
    with_sampling_schemas(json!({
        "$schema": dialect,
        "title": "chat request",
        "type": "object",
        "properties": {
            "messages": {
                "type": "array",
                "minItems": 1,
                "maxItems": MAX_CHAT_MESSAGES,
                "items": { "$ref": "#/$defs/chat_turn" },
                "description": "The conversation so far. A `tool` message answers a call of an \
                                earlier assistant message (its `tool_call_id`); call ids are \
                                unique in the conversation."
            },
            "tools": {
                "type": ["array", "null"],
                "minItems": 1,
                "maxItems": MAX_CHAT_TOOLS,
                "items": { "$ref": "#/$defs/tool" },
                "description": "The function tools the model may call; names are unique."
            },
            "tool_choice": {
                "description": "`auto` (the default with tools), `none` (the default without), \
                                `required` (at least one call), or one named function to call.",
                "oneOf": [
                    { "enum": ["auto", "none", "required"] },
                    {
                        "type": "object",
                        "properties": {
                            "type": { "const": "function" },
                            "function": {
                                "type": "object",
                                "properties": { "name": tool_name_schema() },
                                "required": ["name"],
                                "additionalProperties": false
                            }
                        },
                        "required": ["type", "function"],
                        "additionalProperties": false
                    },
                    { "type": "null" }
                ]
            },
            "parallel_tool_calls": {
                "type": ["boolean", "null"],
                "description": "Whether the answer may call several tools (default true)."
            }
        },
        "required": ["messages"],
        "additionalProperties": false,
        "$defs": {
            "tool_call": tool_call_schema(),
            "tool": {
                "type": "object",
                "properties": {
                    "type": { "const": "function" },
                    "function": {
                        "type": "object",
                        "properties": {
                            "name": tool_name_schema(),
                            "description": { "type": ["string", "null"] },
                            "parameters": {
                                "type": ["object", "null"],
                                "description": "A JSON Schema of the arguments object (`type` \
                                                `object` if given; only local `$ref`s). Absent: \
                                                no arguments."
                            },
                            "strict": { "type": ["boolean", "null"] }
                        },
                        "required": ["name"],
                        "additionalProperties": false
                    }
                },
                "required": ["type", "function"],
                "additionalProperties": false
            },
            "chat_turn": {
                "oneOf": [
                    text_message("system"),
                    text_message("user"),
                    {
                        "type": "object",
                        "properties": {
                            "role": { "const": "assistant" },
                            "content": { "type": ["string", "null"] },
                            "tool_calls": {
                                "type": ["array", "null"],
                                "maxItems": MAX_TOOL_CALLS,
                                "items": { "$ref": "#/$defs/tool_call" }
                            }
                        },
                        "required": ["role"],
                        "additionalProperties": false,
                        "description": "Needs `content` or `tool_calls`."
                    },
                    {
                        "type": "object",
                        "properties": {
                            "role": { "const": "tool" },
                            "tool_call_id": { "type": "string" },
                            "content": { "type": "string" }
                        },
                        "required": ["role", "tool_call_id", "content"],
                        "additionalProperties": false
                    }
                ]
            }
        }
    }))
}

/// The published schema of a `chat` output.
pub(super) fn chat_output_schema_published(dialect: &str) -> Value {
    json!({
        "$schema": dialect,
        "title": "chat output",
        "type": "object",
        "properties": {
            "content": {
                "type": ["string", "null"],
                "description": "The assistant's text (null when it only calls tools)."
            },
            "tool_calls": {
                "type": "array",
                "minItems": 1,
                "items": tool_call_schema(),
                "description": "The tools called, names among the offered tools, arguments valid \
                                against each tool's parameters. Absent when none."
            },
            "finish_reason": { "type": "string", "enum": FINISH_REASONS }
        },
        "required": ["content", "finish_reason"],
        "additionalProperties": false
    })
}
