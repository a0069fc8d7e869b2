//! The prompt of a call, rendered once for every dialect: the chat messages a model is
//! sent (system prompt, the kind's instructions and labels, the schema, the user's
//! input or chat, a re-ask's correction) and the structured output it is asked for.
//!
//! A dialect's provider turns a [`Prompt`] into its wire format (the OpenAI-compatible
//! one: [`super::openai::request_body`]); the docs/conformance.md#cost-reservation token bound
//! ([`crate::cost::prompt_input_tokens`]) and the docs/conformance.md#provider-pace provider pace count the same
//! [`Prompt`], so the reservation never depends on one dialect's request body. A dialect
//! whose wire format adds input beyond the prompt states its own bound on top of it.

use super::ProviderCall;
use crate::config::StructuredOutput;
use serde_json::{Map, Value, json};
use tollgate_core::TaskRequest;
use tollgate_core::kinds::{ChatRole, ChatTool, ToolCall, ToolChoice};

mod chat;

/// The text a re-ask sends around the previous answer's error (before and after it).
const REASK_BEFORE: &str = "Your previous answer was refused: ";
const REASK_AFTER: &str = "\nAnswer again, following the required format exactly.";

/// Who speaks in a prompt message: a chat's roles, and a tool's result (`chat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PromptRole {
    /// Instructions to the model.
    System,
    /// The human side.
    User,
    /// The model side.
    Assistant,
    /// A tool's result.
    Tool,
}

impl From<ChatRole> for PromptRole {
    fn from(role: ChatRole) -> PromptRole {
        match role {
            ChatRole::System => PromptRole::System,
            ChatRole::User => PromptRole::User,
            ChatRole::Assistant => PromptRole::Assistant,
        }
    }
}

/// One chat message of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptMessage {
    /// Who speaks.
    pub role: PromptRole,
    /// What is said (empty for an assistant message that only calls tools).
    pub content: String,
    /// An assistant message's tool calls (`chat`).
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers (`chat`).
    pub tool_call_id: Option<String>,
}

impl PromptMessage {
    pub(crate) fn new(role: impl Into<PromptRole>, content: impl Into<String>) -> PromptMessage {
        PromptMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }

    /// The role as chat APIs spell it (`system`, `user`, `assistant`, `tool`).
    pub fn role_name(&self) -> &'static str {
        match self.role {
            PromptRole::System => "system",
            PromptRole::User => "user",
            PromptRole::Assistant => "assistant",
            PromptRole::Tool => "tool",
        }
    }
}

/// The tools a `chat` prompt offers, and how they may be called.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOffer {
    /// The function tools (at least one).
    pub tools: Vec<ChatTool>,
    /// `tool_choice` as the request gave it (absent: the provider's default, `auto`).
    pub tool_choice: Option<ToolChoice>,
    /// `parallel_tool_calls` as the request gave it.
    pub parallel_tool_calls: Option<bool>,
}

/// The structured output a prompt asks for (each dialect sends it in its own words).
#[derive(Debug, Clone, PartialEq)]
pub enum OutputFormat {
    /// JSON valid against `schema` (an object schema), strictly when `strict`.
    JsonSchema {
        /// The format's name (the kind's).
        name: &'static str,
        /// The schema, its root an object.
        schema: Value,
        /// Whether the schema satisfies strict structured outputs' rules.
        strict: bool,
    },
    /// Any JSON object.
    JsonObject,
    /// A forced call of a tool whose parameters are `schema`: the call's arguments are
    /// the answer.
    Tool {
        /// The tool's name (the kind's).
        name: &'static str,
        /// The parameters' schema, its root an object.
        schema: Value,
        /// Whether the schema satisfies strict mode's rules.
        strict: bool,
    },
}

/// How the answer's content becomes the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerShape {
    /// `{"text": content}`.
    Text,
    /// The content is the output's JSON.
    Json,
    /// The content is `{"value": output}`.
    WrappedJson,
    /// An assistant message: `{"content", "tool_calls"?, "finish_reason"}` (`chat`).
    Message,
}

/// What a call sends a model, whatever the dialect.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    /// The chat, in order (a re-ask's correction last).
    pub messages: Vec<PromptMessage>,
    /// The structured output asked for (`None`: free text).
    pub format: Option<OutputFormat>,
    /// How the answer's content becomes the output.
    pub shape: AnswerShape,
    /// Whether the messages already state the answer's JSON Schema.
    pub schema_in_instructions: bool,
    /// The tools offered (`chat` with tools).
    pub tools: Option<ToolOffer>,
}

impl Prompt {
    /// The prompt of `call`:
    /// - `generate_text`: the system prompt, the chat, the prompt, as given.
    /// - `classify`, `classify_many`: the kind's instructions and labels as the system
    ///   message, the input (or the items as a JSON list) as the user's, the kind's
    ///   schema as a strict JSON schema format.
    /// - `extract_data`: the instructions with the schema as the system message and the
    ///   input as the user's; or a chat (what the OpenAI-compatible door sends) as given,
    ///   after the instructions, the schema only in the format. A schema whose root is not
    ///   an object is wrapped as `{"value": <schema>}` (structured outputs need an object
    ///   root) and unwrapped from the answer; `{"type": "object"}` asks for any object.
    /// - `chat`: the conversation as given (tool calls and results included), its tools
    ///   offered as they are; no structured-output format (the answer is a message).
    /// - A re-ask adds one user message with the previous answer's error.
    pub fn render(call: &ProviderCall<'_>) -> Prompt {
        let mut messages: Vec<PromptMessage> = Vec::new();
        let mut format = None;
        let mut schema_in_instructions = false;
        let mut tools = None;
        let shape = match call.request {
            TaskRequest::Chat(r) => {
                messages = chat::messages(r);
                tools = chat::offer(r);
                AnswerShape::Message
            }
            TaskRequest::GenerateText(r) => {
                if let Some(system) = &r.system {
                    messages.push(PromptMessage::new(ChatRole::System, system.as_str()));
                }
                if let Some(chat) = &r.messages {
                    messages.extend(
                        chat.iter()
                            .map(|m| PromptMessage::new(m.role, m.content.as_str())),
                    );
                }
                if let Some(prompt) = &r.prompt {
                    messages.push(PromptMessage::new(ChatRole::User, prompt.as_str()));
                }
                AnswerShape::Text
            }
            // Never sent as a chat (providers post the texts to their embeddings API):
            // one user message per text, which is what pacing and bounds count.
            TaskRequest::Embed(r) => {
                messages.extend(
                    r.texts()
                        .into_iter()
                        .map(|t| PromptMessage::new(ChatRole::User, t)),
                );
                AnswerShape::Text
            }
            TaskRequest::Classify(r) => {
                messages.push(PromptMessage::new(
                    ChatRole::System,
                    task_instructions(call.request),
                ));
                messages.push(PromptMessage::new(ChatRole::User, r.input.as_str()));
                format = Some(OutputFormat::JsonSchema {
                    name: "classify",
                    schema: call.output_schema.clone(),
                    strict: true,
                });
                AnswerShape::Json
            }
            TaskRequest::ClassifyMany(r) => {
                let items: Vec<Value> = r
                    .items
                    .iter()
                    .map(|i| json!({"id": i.id, "input": i.input}))
                    .collect();
                messages.push(PromptMessage::new(
                    ChatRole::System,
                    task_instructions(call.request),
                ));
                messages.push(PromptMessage::new(
                    ChatRole::User,
                    Value::Array(items).to_string(),
                ));
                format = Some(OutputFormat::JsonSchema {
                    name: "classify_many",
                    schema: call.output_schema.clone(),
                    strict: true,
                });
                AnswerShape::Json
            }
            TaskRequest::ExtractData(r) => {
                let (schema, shape) = if is_object_schema(call.output_schema) {
                    (call.output_schema.clone(), AnswerShape::Json)
                } else {
                    (wrap_schema(call.output_schema), AnswerShape::WrappedJson)
                };
                match (&r.messages, &r.input) {
                    // A chat (the OpenAI-compatible door's `json_schema`): sent as given,
                    // the schema travels in the format only.
                    (Some(chat), _) => {
                        if let Some(extra) = &r.instructions {
                            messages.push(PromptMessage::new(ChatRole::System, extra.as_str()));
                        }
                        messages.extend(
                            chat.iter()
                                .map(|m| PromptMessage::new(m.role, m.content.as_str())),
                        );
                    }
                    (None, input) => {
                        let system = format!(
                            "{}\nJSON Schema of the answer:\n{}",
                            task_instructions(call.request),
                            schema
                        );
                        messages.push(PromptMessage::new(ChatRole::System, system));
                        schema_in_instructions = true;
                        messages.push(PromptMessage::new(
                            ChatRole::User,
                            input.as_deref().unwrap_or(""),
                        ));
                    }
                }
                format = Some(if schema == json!({"type": "object"}) {
                    // Any object: JSON mode says exactly that, and more servers know it.
                    OutputFormat::JsonObject
                } else {
                    let strict = is_strict_compatible(&schema);
                    OutputFormat::JsonSchema {
                        name: "extract_data",
                        schema,
                        strict,
                    }
                });
                shape
            }
        };
        if let Some(error) = call.previous_error {
            messages.push(PromptMessage::new(
                ChatRole::User,
                format!("{REASK_BEFORE}{error}{REASK_AFTER}"),
            ));
        }
        Prompt {
            messages,
            format,
            shape,
            schema_in_instructions,
            tools,
        }
    }

    /// The prompt of `call` asking for structured output the way `mode` says
    /// (docs/providers.md, "Structured output"):
    /// - `json_schema`: as [`render`](Self::render) does.
    /// - `json_object`: JSON mode, the schema stated in the instructions.
    /// - `tool`: a forced tool call whose parameters are the schema (any object for
    ///   JSON mode's `{"type": "object"}`).
    /// - `prompt`: no format at all, the schema stated in the instructions.
    ///
    /// A free-text prompt (`generate_text`) is the same in every mode.
    pub fn render_as(call: &ProviderCall<'_>, mode: StructuredOutput) -> Prompt {
        let mut prompt = Prompt::render(call);
        let Some(format) = prompt.format.take() else {
            return prompt;
        };
        let (name, schema, strict) = match &format {
            OutputFormat::JsonSchema {
                name,
                schema,
                strict,
            }
            | OutputFormat::Tool {
                name,
                schema,
                strict,
            } => (*name, schema.clone(), *strict),
            OutputFormat::JsonObject => (
                call.request.kind().as_str(),
                json!({"type": "object"}),
                false,
            ),
        };
        prompt.format = match mode {
            StructuredOutput::JsonSchema => Some(format),
            StructuredOutput::JsonObject => {
                prompt.state_schema(&schema);
                Some(OutputFormat::JsonObject)
            }
            StructuredOutput::Tool => Some(OutputFormat::Tool {
                name,
                schema,
                strict,
            }),
            StructuredOutput::Prompt => {
                prompt.state_schema(&schema);
                None
            }
        };
        prompt
    }

    /// Adds the answer's schema to the instructions (the first system message, or a new
    /// one first) unless they state it already.
    fn state_schema(&mut self, schema: &Value) {
        if self.schema_in_instructions {
            return;
        }
        let text = format!("{SCHEMA_INSTRUCTIONS}{schema}");
        match self.messages.first_mut() {
            Some(first) if first.role == PromptRole::System => {
                first.content.push_str("\n\n");
                first.content.push_str(&text);
            }
            _ => self
                .messages
                .insert(0, PromptMessage::new(ChatRole::System, text)),
        }
        self.schema_in_instructions = true;
    }
}

/// What precedes the schema when the instructions must state it.
const SCHEMA_INSTRUCTIONS: &str =
    "Answer with JSON only, no other text, valid against this JSON Schema:\n";

/// The bytes a re-ask's correction adds around the error text.
pub(crate) const REASK_FRAME_BYTES: usize = REASK_BEFORE.len() + REASK_AFTER.len();

/// Whether a schema's root is an object schema (structured outputs need one).
fn is_object_schema(schema: &Value) -> bool {
    schema.get("type").and_then(Value::as_str) == Some("object")
}

/// `{"type": "object", "properties": {"value": schema}, …}`. Definitions move to the new
/// root so `#/$defs/…` references still resolve; references to the old root are
/// rewritten to `#/properties/value…`.
fn wrap_schema(schema: &Value) -> Value {
    let mut inner = schema.clone();
    let mut wrapper = Map::new();
    if let Value::Object(map) = &mut inner {
        for defs in ["$defs", "definitions"] {
            if let Some(d) = map.remove(defs) {
                wrapper.insert(defs.to_string(), d);
            }
        }
        // `$schema` belongs at the root.
        if let Some(dialect) = map.remove("$schema") {
            wrapper.insert("$schema".into(), dialect);
        }
    }
    rewrite_root_refs(&mut inner);
    wrapper.insert("type".into(), json!("object"));
    wrapper.insert("properties".into(), json!({ "value": inner }));
    wrapper.insert("required".into(), json!(["value"]));
    wrapper.insert("additionalProperties".into(), json!(false));
    Value::Object(wrapper)
}

fn rewrite_root_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                if key == "$ref"
                    && let Value::String(target) = child
                    && target.starts_with('#')
                    && !target.starts_with("#/$defs")
                    && !target.starts_with("#/definitions")
                {
                    *target = format!("#/properties/value{}", &target[1..]);
                } else {
                    rewrite_root_refs(child);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_root_refs),
        _ => {}
    }
}

/// Strict structured outputs need every object to list all its properties as required
/// and to forbid additional ones.
fn is_strict_compatible(schema: &Value) -> bool {
    match schema {
        Value::Object(map) => {
            let is_object = map.get("type").and_then(Value::as_str) == Some("object")
                || map.contains_key("properties");
            if is_object {
                if map.get("additionalProperties") != Some(&Value::Bool(false)) {
                    return false;
                }
                let props: Vec<&String> = map
                    .get("properties")
                    .and_then(Value::as_object)
                    .map(|p| p.keys().collect())
                    .unwrap_or_default();
                let required: Vec<&str> = map
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| r.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                if props.iter().any(|p| !required.contains(&p.as_str())) {
                    return false;
                }
            }
            map.iter().all(|(key, child)| match key.as_str() {
                // Data, not subschemas.
                "enum" | "const" | "default" | "examples" | "required" => true,
                _ => is_strict_compatible(child),
            })
        }
        Value::Array(items) => items.iter().all(is_strict_compatible),
        Value::Bool(_) => true,
        _ => true,
    }
}

/// Instructions shared by providers that prompt a chat model, per kind.
fn task_instructions(request: &TaskRequest) -> String {
    match request {
        TaskRequest::GenerateText(_) | TaskRequest::Embed(_) => String::new(),
        TaskRequest::Classify(r) => {
            let mut text = String::from(
                "Classify the user's input. Answer with a JSON object whose `label` is exactly \
                 one of the labels below, and `confidence` a number from 0 to 1 (or null).\n\
                 Labels:\n",
            );
            push_labels(&mut text, &r.labels);
            push_extra(&mut text, r.instructions.as_deref());
            text
        }
        TaskRequest::ClassifyMany(r) => {
            let mut text = String::from(
                "Classify every item of the user's JSON list. Answer with a JSON object \
                 `{\"results\": [{\"id\", \"label\"}]}` holding exactly one result per item id, \
                 no other ids, each label exactly one of the labels below.\nLabels:\n",
            );
            push_labels(&mut text, &r.labels);
            push_extra(&mut text, r.instructions.as_deref());
            text
        }
        TaskRequest::Chat(_) => String::new(),
        TaskRequest::ExtractData(r) => {
            let mut text = String::from(
                "Extract data from the user's input. Answer with JSON that is valid against \
                 the given JSON Schema, and nothing else.",
            );
            push_extra(&mut text, r.instructions.as_deref());
            text
        }
    }
}

fn push_labels(text: &mut String, labels: &[tollgate_core::kinds::Label]) {
    for label in labels {
        match label.description() {
            Some(d) => text.push_str(&format!("- {}: {d}\n", label.name())),
            None => text.push_str(&format!("- {}\n", label.name())),
        }
    }
}

fn push_extra(text: &mut String, instructions: Option<&str>) {
    if let Some(extra) = instructions {
        text.push_str("\nInstructions: ");
        text.push_str(extra);
    }
}

#[cfg(test)]
mod tests;
