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
use serde_json::{Map, Value, json};
use tollgate_core::TaskRequest;
use tollgate_core::kinds::ChatRole;

/// The text a re-ask sends around the previous answer's error (before and after it).
const REASK_BEFORE: &str = "Your previous answer was refused: ";
const REASK_AFTER: &str = "\nAnswer again, following the required format exactly.";

/// One chat message of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptMessage {
    /// Who speaks.
    pub role: ChatRole,
    /// What is said.
    pub content: String,
}

impl PromptMessage {
    fn new(role: ChatRole, content: impl Into<String>) -> PromptMessage {
        PromptMessage {
            role,
            content: content.into(),
        }
    }

    /// The role as chat APIs spell it (`system`, `user`, `assistant`).
    pub fn role_name(&self) -> &'static str {
        match self.role {
            ChatRole::System => "system",
            ChatRole::User => "user",
            ChatRole::Assistant => "assistant",
        }
    }
}

/// The structured output a prompt asks for.
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
}

impl OutputFormat {
    /// The format as JSON: `{"type": "json_schema", "json_schema": {"name", "schema",
    /// "strict"}}` or `{"type": "json_object"}` (what OpenAI-compatible servers read as
    /// `response_format`). The token bound counts its bytes.
    pub fn to_json(&self) -> Value {
        match self {
            OutputFormat::JsonSchema {
                name,
                schema,
                strict,
            } => json!({
                "type": "json_schema",
                "json_schema": { "name": name, "schema": schema, "strict": strict }
            }),
            OutputFormat::JsonObject => json!({"type": "json_object"}),
        }
    }
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
    /// - A re-ask adds one user message with the previous answer's error.
    pub fn render(call: &ProviderCall<'_>) -> Prompt {
        let mut messages: Vec<PromptMessage> = Vec::new();
        let mut format = None;
        let shape = match call.request {
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
        }
    }
}

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
        TaskRequest::GenerateText(_) => String::new(),
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
mod tests {
    use super::*;
    use tollgate_core::{ModelRef, TaskKind};

    fn call_for(kind: TaskKind, raw: Value) -> (TaskRequest, Value) {
        let request = TaskRequest::parse(kind, &raw).unwrap();
        let schema = request.output_schema();
        (request, schema)
    }

    #[test]
    fn root_references_follow_the_wrapped_schema() {
        let wrapped = wrap_schema(&json!({"anyOf": [{"type": "null"}, {"$ref": "#"}]}));
        assert_eq!(
            wrapped["properties"]["value"]["anyOf"][1]["$ref"],
            "#/properties/value"
        );
    }

    #[test]
    fn strictness_follows_the_schema() {
        assert!(is_strict_compatible(&json!({
            "type": "object", "properties": {"a": {"type": "string"}},
            "required": ["a"], "additionalProperties": false
        })));
        assert!(!is_strict_compatible(&json!({
            "type": "object", "properties": {"a": {"type": "string"}}
        })));
    }

    #[test]
    fn a_reask_adds_one_user_message_with_the_error_framed() {
        let (request, schema) = call_for(
            TaskKind::Classify,
            json!({"input": "Win a cruise", "labels": ["spam", "ham"]}),
        );
        let model = ModelRef::new("openai", "gpt-x");
        let mut call = ProviderCall {
            model: &model,
            request: &request,
            output_schema: &schema,
            previous_error: None,
            max_output_bytes: tollgate_core::DEFAULT_MAX_OUTPUT_BYTES,
        };
        let first = Prompt::render(&call);
        call.previous_error = Some("no");
        let again = Prompt::render(&call);
        assert_eq!(again.messages.len(), first.messages.len() + 1);
        let last = again.messages.last().unwrap();
        assert_eq!(last.role_name(), "user");
        assert_eq!(last.content.len(), REASK_FRAME_BYTES + "no".len());
        assert_eq!(again.format, first.format);
    }
}
