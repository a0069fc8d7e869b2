//! The task kinds (docs/conformance.md#task-kinds): their request types, request parsing and validation,
//! the JSON Schemas of requests and outputs, and validation of model outputs.
//!
//! Requests are parsed field by field so every error names the exact path that is wrong
//! (`request.labels[2].name`, `request.items[0].id`, `request.schema`, …). A caller's JSON
//! Schema (`extract_data`) is checked without ever fetching anything: every `$ref` must be
//! local (start with `#`), every `$schema` must name a bundled draft, and the compiler runs
//! with a retriever that refuses all retrieval.
//!
//! Layout: this module holds [`TaskKind`], [`TaskRequest`] (dispatch to each kind's parser)
//! and the request limits; `generate_text`, `classify`, `classify_many` and `extract_data`
//! hold each kind's request type and parser (`extract_data` also the checks on a caller's
//! schema), `labels` the label type shared by both classifications, `sampling` the
//! sampling fields `generate_text`, `extract_data` and `chat` share ([`Sampling`]: their
//! parsing, ranges and schemas), `parse` and `messages` the
//! field and message helpers, `schemas` the published JSON Schemas,
//! `validate` [`validate_output`], `output_size` the output size rules and `schema_cost`
//! the cost rule for a caller's schema.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::InvalidInput;

mod chat;
mod chat_output;
mod chat_schema;
mod chat_tools;
mod classify;
mod classify_many;
mod embed;
mod extract_data;
mod generate_text;
mod labels;
mod messages;
mod output_size;
mod parse;
mod sampling;
mod schema_cost;
mod schemas;
#[cfg(test)]
mod test_support;
mod validate;

pub use chat::{
    ChatRequest, ChatTool, ChatTurn, FunctionCall, FunctionTool, MAX_CHAT_MESSAGES, MAX_CHAT_TOOLS,
    MAX_TOOL_CALL_ID_BYTES, MAX_TOOL_CALLS, MAX_TOOL_NAME_BYTES, NamedToolChoice, ToolCall,
    ToolChoice, ToolChoiceMode, ToolName, ToolType,
};
pub use chat_output::FINISH_REASONS;
pub use classify::ClassifyRequest;
pub use classify_many::{ClassifyItem, ClassifyManyRequest};
pub use embed::{
    EmbedInput, EmbedItem, EmbedRequest, MAX_EMBED_DIMENSIONS, MAX_EMBED_INPUT_BYTES,
    MAX_EMBED_INPUTS, embed_item_key,
};
pub use extract_data::ExtractDataRequest;
pub use generate_text::{ChatMessage, ChatRole, GenerateTextRequest};
pub use labels::Label;
pub use output_size::{check_output_fits, check_output_size};
pub use sampling::Sampling;
pub use schema_cost::{
    MAX_SCHEMA_DEPTH, MAX_SCHEMA_EXPANSION, MAX_SCHEMA_NODES, check_schema_cost,
};
pub use schemas::{output_schema, request_schema};
pub use validate::validate_output;

/// Most labels a `classify` / `classify_many` request may have.
pub const MAX_LABELS: usize = 1000;
/// Most items a `classify_many` request may have.
pub const MAX_ITEMS: usize = 1000;
/// Longest label name, in UTF-8 bytes.
pub const MAX_LABEL_BYTES: usize = 256;
/// Longest `classify_many` item id, in UTF-8 bytes.
pub const MAX_ITEM_ID_BYTES: usize = 256;
/// Highest accepted `temperature` (the lowest is 0).
pub const MAX_TEMPERATURE: f64 = 2.0;
/// Most `stop` sequences a request may have (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;
/// Largest `seed` magnitude: integers beyond ±2^53 cannot be hashed exactly (canonical JSON).
pub const MAX_SEED: i64 = 1 << 53;

// ---------------------------------------------------------------------------------------
// TaskKind
// ---------------------------------------------------------------------------------------

/// The kind of a task (docs/conformance.md#task-kinds). Its string form (`generate_text`, …) is part of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskKind {
    /// Free text from a prompt or a chat.
    GenerateText,
    /// One label for one input.
    Classify,
    /// One label for each of many inputs.
    ClassifyMany,
    /// A JSON value, valid against the caller's schema, extracted from an input.
    ExtractData,
    /// The assistant's next message in a conversation: text and/or calls of the tools
    /// offered.
    Chat,
    /// One vector per input text (docs/api.md, "Embeddings").
    Embed,
}

impl TaskKind {
    /// Every kind, in documentation order.
    pub const ALL: [TaskKind; 6] = [
        TaskKind::GenerateText,
        TaskKind::Classify,
        TaskKind::ClassifyMany,
        TaskKind::ExtractData,
        TaskKind::Chat,
        TaskKind::Embed,
    ];

    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::GenerateText => "generate_text",
            TaskKind::Classify => "classify",
            TaskKind::ClassifyMany => "classify_many",
            TaskKind::ExtractData => "extract_data",
            TaskKind::Chat => "chat",
            TaskKind::Embed => "embed",
        }
    }

    /// Parses the stable string form.
    pub fn parse(s: &str) -> Option<TaskKind> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for TaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated request of one of the kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum TaskRequest {
    /// A `generate_text` request.
    GenerateText(GenerateTextRequest),
    /// A `classify` request.
    Classify(ClassifyRequest),
    /// A `classify_many` request.
    ClassifyMany(ClassifyManyRequest),
    /// An `extract_data` request.
    ExtractData(ExtractDataRequest),
    /// A `chat` request.
    Chat(ChatRequest),
    /// An `embed` request.
    Embed(EmbedRequest),
}

impl TaskRequest {
    /// Parses and validates the request object of a kind (the JSON under "request"; it does
    /// NOT contain "kind"). Every error names the offending field, starting with `request`.
    /// An explicit `null` for an optional field is treated as absent.
    pub fn parse(kind: TaskKind, value: &Value) -> Result<TaskRequest, InvalidInput> {
        Ok(match kind {
            TaskKind::GenerateText => {
                TaskRequest::GenerateText(generate_text::parse_generate_text(value)?)
            }
            TaskKind::Classify => TaskRequest::Classify(classify::parse_classify(value)?),
            TaskKind::ClassifyMany => {
                TaskRequest::ClassifyMany(classify_many::parse_classify_many(value)?)
            }
            TaskKind::ExtractData => {
                TaskRequest::ExtractData(extract_data::parse_extract_data(value)?)
            }
            TaskKind::Chat => TaskRequest::Chat(chat::parse_chat(value)?),
            TaskKind::Embed => TaskRequest::Embed(embed::parse_embed(value)?),
        })
    }

    /// The request's kind.
    pub fn kind(&self) -> TaskKind {
        match self {
            TaskRequest::GenerateText(_) => TaskKind::GenerateText,
            TaskRequest::Classify(_) => TaskKind::Classify,
            TaskRequest::ClassifyMany(_) => TaskKind::ClassifyMany,
            TaskRequest::ExtractData(_) => TaskKind::ExtractData,
            TaskRequest::Chat(_) => TaskKind::Chat,
            TaskRequest::Embed(_) => TaskKind::Embed,
        }
    }

    /// The request's sampling fields, for the kinds that have them (`generate_text`,
    /// `extract_data`, `chat`).
    pub fn sampling(&self) -> Option<&Sampling> {
        match self {
            TaskRequest::GenerateText(r) => Some(&r.sampling),
            TaskRequest::ExtractData(r) => Some(&r.sampling),
            TaskRequest::Chat(r) => Some(&r.sampling),
            TaskRequest::Classify(_) | TaskRequest::ClassifyMany(_) | TaskRequest::Embed(_) => None,
        }
    }

    /// The normalized request as JSON (what gets canonicalized, hashed and stored), without
    /// "kind". Absent optional fields are omitted; labels keep the form they were given in.
    pub fn to_value(&self) -> Value {
        let result = match self {
            TaskRequest::GenerateText(r) => serde_json::to_value(r),
            TaskRequest::Classify(r) => serde_json::to_value(r),
            TaskRequest::ClassifyMany(r) => serde_json::to_value(r),
            TaskRequest::ExtractData(r) => serde_json::to_value(r),
            TaskRequest::Chat(r) => serde_json::to_value(r),
            TaskRequest::Embed(r) => serde_json::to_value(r),
        };
        // Cannot fail: plain structs with string keys, and a finite temperature.
        result.expect("a task request always serializes to JSON")
    }

    /// Bytes of [`to_value`](Self::to_value) as compact JSON, or `None` as soon as they
    /// pass `limit` (measuring stops there, nothing is built).
    pub fn size_within(&self, limit: usize) -> Option<usize> {
        match self {
            TaskRequest::GenerateText(r) => output_size::json_size(r, limit),
            TaskRequest::Classify(r) => output_size::json_size(r, limit),
            TaskRequest::ClassifyMany(r) => output_size::json_size(r, limit),
            TaskRequest::ExtractData(r) => output_size::json_size(r, limit),
            TaskRequest::Chat(r) => output_size::json_size(r, limit),
            TaskRequest::Embed(r) => output_size::json_size(r, limit),
        }
    }

    /// The JSON Schema the output of THIS request must satisfy: the labels as an enum, the
    /// item ids, or the caller's schema for `extract_data`. The first three are compatible
    /// with OpenAI strict structured outputs (every property required, no additional
    /// properties; `classify`'s `confidence` is therefore `number | null`, `null` meaning
    /// "none"). The `extract_data` schema is the caller's, unchanged: it may be a boolean
    /// or a non-object schema, which a provider needing an object root has to wrap.
    pub fn output_schema(&self) -> Value {
        match self {
            TaskRequest::GenerateText(_) => json!({
                "type": "object",
                "properties": { "text": { "type": "string" } },
                "required": ["text"],
                "additionalProperties": false
            }),
            TaskRequest::Classify(r) => json!({
                "type": "object",
                "properties": {
                    "label": { "type": "string", "enum": label_names(&r.labels) },
                    "confidence": { "type": ["number", "null"], "minimum": 0, "maximum": 1 }
                },
                "required": ["label", "confidence"],
                "additionalProperties": false
            }),
            TaskRequest::ClassifyMany(r) => {
                let ids: Vec<&str> = r.items.iter().map(|i| i.id.as_str()).collect();
                json!({
                    "type": "object",
                    "properties": {
                        "results": {
                            "type": "array",
                            "minItems": r.items.len(),
                            "maxItems": r.items.len(),
                            "items": {
                                "type": "object",
                                "properties": {
                                    "id": { "type": "string", "enum": ids },
                                    "label": { "type": "string", "enum": label_names(&r.labels) }
                                },
                                "required": ["id", "label"],
                                "additionalProperties": false
                            }
                        }
                    },
                    "required": ["results"],
                    "additionalProperties": false
                })
            }
            TaskRequest::ExtractData(r) => r.schema.clone(),
            TaskRequest::Chat(r) => chat_output::chat_output_schema(r),
            TaskRequest::Embed(r) => embed::embed_output_schema(r),
        }
    }
}

pub(super) fn label_names(labels: &[Label]) -> Vec<&str> {
    labels.iter().map(Label::name).collect()
}

#[cfg(test)]
mod tests;
