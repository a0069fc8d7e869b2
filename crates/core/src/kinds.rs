//! The four task kinds (SPEC §2): their request types, request parsing and validation,
//! the JSON Schemas of requests and outputs, and validation of model outputs.
//!
//! Requests are parsed field by field so every error names the exact path that is wrong
//! (`request.labels[2].name`, `request.items[0].id`, `request.schema`, …). A caller's JSON
//! Schema (`extract_data`) is checked without ever fetching anything: every `$ref` must be
//! local (start with `#`), every `$schema` must name a bundled draft, and the compiler runs
//! with a retriever that refuses all retrieval.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value, json};

use crate::error::{InvalidInput, OutputViolation};

mod output_size;
pub use output_size::{check_output_fits, check_output_size};

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

/// The dialect of every JSON Schema this module publishes.
const SCHEMA_DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";
/// Root path of every request field error.
const ROOT: &str = "request";
/// How many schema errors `validate_output` reports for `extract_data`.
const MAX_REPORTED_SCHEMA_ERRORS: usize = 3;
/// How many labels / ids an output violation message lists.
const MAX_LISTED: usize = 10;
/// Longest excerpt of a caller- or model-supplied string quoted in a message, in chars.
const MAX_QUOTE_CHARS: usize = 80;

const GENERATE_TEXT_FIELDS: [&str; 8] = [
    "messages",
    "prompt",
    "system",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
];
const CLASSIFY_FIELDS: [&str; 3] = ["input", "labels", "instructions"];
const CLASSIFY_MANY_FIELDS: [&str; 3] = ["items", "labels", "instructions"];
const EXTRACT_DATA_FIELDS: [&str; 9] = [
    "input",
    "messages",
    "schema",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
];
/// Most `stop` sequences a request may have (OpenAI's limit).
pub const MAX_STOP_SEQUENCES: usize = 4;
/// Largest `seed` magnitude: integers beyond ±2^53 cannot be hashed exactly (canonical JSON).
pub const MAX_SEED: i64 = 1 << 53;

// ---------------------------------------------------------------------------------------
// TaskKind
// ---------------------------------------------------------------------------------------

/// The kind of a task (SPEC §2). Its string form (`generate_text`, …) is part of the API.
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
}

impl TaskKind {
    /// Every kind, in documentation order.
    pub const ALL: [TaskKind; 4] = [
        TaskKind::GenerateText,
        TaskKind::Classify,
        TaskKind::ClassifyMany,
        TaskKind::ExtractData,
    ];

    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            TaskKind::GenerateText => "generate_text",
            TaskKind::Classify => "classify",
            TaskKind::ClassifyMany => "classify_many",
            TaskKind::ExtractData => "extract_data",
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

// ---------------------------------------------------------------------------------------
// Request types
// ---------------------------------------------------------------------------------------

/// A `generate_text` request: exactly one of `messages` or `prompt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateTextRequest {
    /// The chat so far (non-empty); exclusive with `prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// A single user prompt (non-empty); exclusive with `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// A system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Cap on generated tokens (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature, finite, in `[0, 2]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling: the probability mass considered, in `(0, 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Up to [`MAX_STOP_SEQUENCES`] non-empty sequences where generation stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// A seed for providers that sample deterministically with one (within ±2^53).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: ChatRole,
    /// What is said.
    pub content: String,
}

/// The author of a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    /// Instructions to the model.
    System,
    /// The human side.
    User,
    /// The model side.
    Assistant,
}

/// A `classify` request: one input, one label out of `labels`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifyRequest {
    /// The text to classify.
    pub input: String,
    /// The labels to choose from (1..=`MAX_LABELS`, unique names).
    pub labels: Vec<Label>,
    /// Extra instructions for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

/// A `classify_many` request: one label out of `labels` for each item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifyManyRequest {
    /// The inputs (1..=`MAX_ITEMS`, unique ids).
    pub items: Vec<ClassifyItem>,
    /// The labels to choose from (1..=`MAX_LABELS`, unique names).
    pub labels: Vec<Label>,
    /// Extra instructions for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

/// One input of a `classify_many` request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassifyItem {
    /// The caller's id of the item (non-empty, at most `MAX_ITEM_ID_BYTES`, unique).
    pub id: String,
    /// The text to classify.
    pub input: String,
}

/// An `extract_data` request: a JSON value valid against `schema`, drawn from `input`
/// or answering a chat (`messages`, exactly one of the two). The sampling fields are
/// those of [`GenerateTextRequest`]; each is absent from the stored request (and so from
/// its hash) unless set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExtractDataRequest {
    /// The text to extract from; exclusive with `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// A chat whose answer is the JSON value (non-empty); exclusive with `input`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// The JSON Schema (object or boolean) the output must satisfy; only local `$ref`s.
    pub schema: Value,
    /// Extra instructions for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// Cap on generated tokens (at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// Sampling temperature, finite, in `[0, 2]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Nucleus sampling, in `(0, 1]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Up to [`MAX_STOP_SEQUENCES`] non-empty stop sequences.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    /// A sampling seed (within ±2^53).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
}

/// A classification label: a plain name (`"spam"`) or `{"name": "spam", "description": "…"}`.
/// It serializes back in the form it was given.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Label {
    /// The plain string form.
    Name(String),
    /// The object form.
    Described {
        /// The label's name (what the model answers).
        name: String,
        /// What the label means, for the model.
        description: Option<String>,
    },
}

impl Label {
    /// The label's name.
    pub fn name(&self) -> &str {
        match self {
            Label::Name(name) | Label::Described { name, .. } => name,
        }
    }

    /// The label's description, if any.
    pub fn description(&self) -> Option<&str> {
        match self {
            Label::Name(_) => None,
            Label::Described { description, .. } => description.as_deref(),
        }
    }
}

#[derive(Serialize)]
struct LabelObjectRef<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a str>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LabelObject {
    name: String,
    #[serde(default)]
    description: Option<String>,
}

impl Serialize for Label {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Label::Name(name) => serializer.serialize_str(name),
            Label::Described { name, description } => LabelObjectRef {
                name,
                description: description.as_deref(),
            }
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Label {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct LabelVisitor;

        impl<'de> Visitor<'de> for LabelVisitor {
            type Value = Label;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"a label: a name string or an object {"name", "description"}"#)
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Label, E> {
                Ok(Label::Name(v.to_owned()))
            }

            fn visit_string<E: de::Error>(self, v: String) -> Result<Label, E> {
                Ok(Label::Name(v))
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Label, A::Error> {
                let object = LabelObject::deserialize(de::value::MapAccessDeserializer::new(map))?;
                Ok(Label::Described {
                    name: object.name,
                    description: object.description,
                })
            }
        }

        deserializer.deserialize_any(LabelVisitor)
    }
}

/// A validated request of one of the four kinds.
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
}

impl TaskRequest {
    /// Parses and validates the request object of a kind (the JSON under "request"; it does
    /// NOT contain "kind"). Every error names the offending field, starting with `request`.
    /// An explicit `null` for an optional field is treated as absent.
    pub fn parse(kind: TaskKind, value: &Value) -> Result<TaskRequest, InvalidInput> {
        Ok(match kind {
            TaskKind::GenerateText => TaskRequest::GenerateText(parse_generate_text(value)?),
            TaskKind::Classify => TaskRequest::Classify(parse_classify(value)?),
            TaskKind::ClassifyMany => TaskRequest::ClassifyMany(parse_classify_many(value)?),
            TaskKind::ExtractData => TaskRequest::ExtractData(parse_extract_data(value)?),
        })
    }

    /// The request's kind.
    pub fn kind(&self) -> TaskKind {
        match self {
            TaskRequest::GenerateText(_) => TaskKind::GenerateText,
            TaskRequest::Classify(_) => TaskKind::Classify,
            TaskRequest::ClassifyMany(_) => TaskKind::ClassifyMany,
            TaskRequest::ExtractData(_) => TaskKind::ExtractData,
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
        };
        // Cannot fail: plain structs with string keys, and a finite temperature.
        result.expect("a task request always serializes to JSON")
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
        }
    }
}

fn label_names(labels: &[Label]) -> Vec<&str> {
    labels.iter().map(Label::name).collect()
}

// ---------------------------------------------------------------------------------------
// Parsing helpers
// ---------------------------------------------------------------------------------------

/// Deserializes `value` with serde, reporting serde's message at `path`.
fn de<T: DeserializeOwned>(value: &Value, path: &str) -> Result<T, InvalidInput> {
    T::deserialize(value).map_err(|e| InvalidInput::field(path, e.to_string()))
}

/// The JSON object at `path`, refusing keys outside `allowed`.
fn object<'a>(
    value: &'a Value,
    path: &str,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, InvalidInput> {
    let Value::Object(map) = value else {
        return Err(InvalidInput::field(
            path,
            format!("must be a JSON object, not {}", describe(value)),
        ));
    };
    if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        let expected: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
        return Err(InvalidInput::field(
            path,
            format!(
                "unknown field `{}`, expected one of {}",
                clip(key),
                expected.join(", ")
            ),
        ));
    }
    Ok(map)
}

/// A required field; a missing one is reported like serde does.
fn required<'a>(
    map: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<(&'a Value, String), InvalidInput> {
    match map.get(key) {
        Some(value) => Ok((value, format!("{path}.{key}"))),
        None => Err(InvalidInput::field(path, format!("missing field `{key}`"))),
    }
}

/// An optional field; absent and `null` are both `None`.
fn optional<T: DeserializeOwned>(
    map: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<T>, InvalidInput> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => de(value, &format!("{path}.{key}")).map(Some),
    }
}

/// An array of at most `max` elements, each deserialized at `path[i]`.
fn list<T: DeserializeOwned>(
    value: &Value,
    path: &str,
    max: usize,
    what: &str,
) -> Result<Vec<T>, InvalidInput> {
    let Value::Array(elements) = value else {
        // Let serde word the type error ("invalid type: …, expected a sequence").
        return Err(de::<Vec<IgnoredAny>>(value, path)
            .err()
            .unwrap_or_else(|| InvalidInput::field(path, "must be an array")));
    };
    if elements.len() > max {
        return Err(InvalidInput::field(
            path,
            format!("has {} {what}, over the limit of {max}", elements.len()),
        ));
    }
    elements
        .iter()
        .enumerate()
        .map(|(i, e)| de(e, &format!("{path}[{i}]")))
        .collect()
}

fn parse_generate_text(value: &Value) -> Result<GenerateTextRequest, InvalidInput> {
    let map = object(value, ROOT, &GENERATE_TEXT_FIELDS)?;
    let messages: Option<Vec<ChatMessage>> = match map.get("messages") {
        None | Some(Value::Null) => None,
        Some(v) => Some(list(v, "request.messages", usize::MAX, "messages")?),
    };
    let request = GenerateTextRequest {
        messages,
        prompt: optional(map, "prompt", ROOT)?,
        system: optional(map, "system", ROOT)?,
        max_output_tokens: optional(map, "max_output_tokens", ROOT)?,
        temperature: optional(map, "temperature", ROOT)?,
        top_p: optional(map, "top_p", ROOT)?,
        stop: optional(map, "stop", ROOT)?,
        seed: optional(map, "seed", ROOT)?,
    };
    match (&request.messages, &request.prompt) {
        (Some(_), Some(_)) => {
            return Err(InvalidInput::field(
                ROOT,
                "give exactly one of `messages` or `prompt`, not both",
            ));
        }
        (None, None) => {
            return Err(InvalidInput::field(
                ROOT,
                "one of `messages` or `prompt` is required",
            ));
        }
        _ => {}
    }
    if request.messages.as_ref().is_some_and(Vec::is_empty) {
        return Err(InvalidInput::field(
            "request.messages",
            "must contain at least one message",
        ));
    }
    if request.prompt.as_ref().is_some_and(String::is_empty) {
        return Err(InvalidInput::field("request.prompt", "must not be empty"));
    }
    check_sampling(Sampling {
        max_output_tokens: request.max_output_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        stop: request.stop.as_deref(),
        seed: request.seed,
    })?;
    Ok(request)
}

/// The sampling fields `generate_text` and `extract_data` share, borrowed for checking.
struct Sampling<'a> {
    max_output_tokens: Option<u32>,
    temperature: Option<f64>,
    top_p: Option<f64>,
    stop: Option<&'a [String]>,
    seed: Option<i64>,
}

/// The ranges of the shared sampling fields (one statement of them for both kinds).
fn check_sampling(s: Sampling<'_>) -> Result<(), InvalidInput> {
    if s.max_output_tokens == Some(0) {
        return Err(InvalidInput::field(
            "request.max_output_tokens",
            "must be at least 1",
        ));
    }
    if let Some(t) = s.temperature
        && !(t.is_finite() && (0.0..=MAX_TEMPERATURE).contains(&t))
    {
        return Err(InvalidInput::field(
            "request.temperature",
            format!("must be a number from 0 to {MAX_TEMPERATURE}, got {t}"),
        ));
    }
    if let Some(p) = s.top_p
        && !(p.is_finite() && p > 0.0 && p <= 1.0)
    {
        return Err(InvalidInput::field(
            "request.top_p",
            format!("must be a number above 0 and at most 1, got {p}"),
        ));
    }
    if let Some(stop) = s.stop {
        if stop.is_empty() || stop.len() > MAX_STOP_SEQUENCES {
            return Err(InvalidInput::field(
                "request.stop",
                format!(
                    "must hold 1 to {MAX_STOP_SEQUENCES} sequences, got {}",
                    stop.len()
                ),
            ));
        }
        if let Some(i) = stop.iter().position(String::is_empty) {
            return Err(InvalidInput::field(
                format!("request.stop[{i}]"),
                "must not be empty",
            ));
        }
    }
    if let Some(seed) = s.seed
        && !(-MAX_SEED..=MAX_SEED).contains(&seed)
    {
        return Err(InvalidInput::field(
            "request.seed",
            format!("must be within ±2^53, got {seed}"),
        ));
    }
    Ok(())
}

/// A chat list at `path`: present, non-empty.
fn parse_messages(value: &Value, path: &str) -> Result<Vec<ChatMessage>, InvalidInput> {
    let messages: Vec<ChatMessage> = list(value, path, usize::MAX, "messages")?;
    if messages.is_empty() {
        return Err(InvalidInput::field(
            path,
            "must contain at least one message",
        ));
    }
    Ok(messages)
}

fn parse_labels(map: &Map<String, Value>) -> Result<Vec<Label>, InvalidInput> {
    let (value, path) = required(map, "labels", ROOT)?;
    let labels: Vec<Label> = list(value, &path, MAX_LABELS, "labels")?;
    if labels.is_empty() {
        return Err(InvalidInput::field(path, "must contain at least one label"));
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(labels.len());
    for (i, label) in labels.iter().enumerate() {
        let name = label.name();
        let at = match label {
            Label::Name(_) => format!("{path}[{i}]"),
            Label::Described { .. } => format!("{path}[{i}].name"),
        };
        if name.trim().is_empty() {
            return Err(InvalidInput::field(
                at,
                "a label name must not be empty or only whitespace",
            ));
        }
        if name.len() > MAX_LABEL_BYTES {
            return Err(InvalidInput::field(
                at,
                format!(
                    "a label name is at most {MAX_LABEL_BYTES} bytes, this one is {}",
                    name.len()
                ),
            ));
        }
        if let Some(first) = seen.get(name) {
            return Err(InvalidInput::field(
                at,
                format!(
                    "duplicate label name `{}` (already at {path}[{first}])",
                    clip(name)
                ),
            ));
        }
        seen.insert(name, i);
    }
    Ok(labels)
}

fn parse_classify(value: &Value) -> Result<ClassifyRequest, InvalidInput> {
    let map = object(value, ROOT, &CLASSIFY_FIELDS)?;
    let (input, input_path) = required(map, "input", ROOT)?;
    let input = de(input, &input_path)?;
    let labels = parse_labels(map)?;
    Ok(ClassifyRequest {
        input,
        labels,
        instructions: optional(map, "instructions", ROOT)?,
    })
}

fn parse_classify_many(value: &Value) -> Result<ClassifyManyRequest, InvalidInput> {
    let map = object(value, ROOT, &CLASSIFY_MANY_FIELDS)?;
    let (items, path) = required(map, "items", ROOT)?;
    let items: Vec<ClassifyItem> = list(items, &path, MAX_ITEMS, "items")?;
    if items.is_empty() {
        return Err(InvalidInput::field(path, "must contain at least one item"));
    }
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let at = format!("{path}[{i}].id");
        if item.id.is_empty() {
            return Err(InvalidInput::field(at, "an item id must not be empty"));
        }
        if item.id.len() > MAX_ITEM_ID_BYTES {
            return Err(InvalidInput::field(
                at,
                format!(
                    "an item id is at most {MAX_ITEM_ID_BYTES} bytes, this one is {}",
                    item.id.len()
                ),
            ));
        }
        if let Some(first) = seen.get(item.id.as_str()) {
            return Err(InvalidInput::field(
                at,
                format!(
                    "duplicate item id `{}` (already at {path}[{first}].id)",
                    clip(&item.id)
                ),
            ));
        }
        seen.insert(&item.id, i);
    }
    let labels = parse_labels(map)?;
    Ok(ClassifyManyRequest {
        items,
        labels,
        instructions: optional(map, "instructions", ROOT)?,
    })
}

fn parse_extract_data(value: &Value) -> Result<ExtractDataRequest, InvalidInput> {
    let map = object(value, ROOT, &EXTRACT_DATA_FIELDS)?;
    let input: Option<String> = optional(map, "input", ROOT)?;
    let messages = match map.get("messages") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_messages(v, "request.messages")?),
    };
    match (&input, &messages) {
        (Some(_), Some(_)) => {
            return Err(InvalidInput::field(
                ROOT,
                "give exactly one of `input` or `messages`, not both",
            ));
        }
        (None, None) => return Err(InvalidInput::field(ROOT, "missing field `input`")),
        _ => {}
    }
    let (schema, schema_path) = required(map, "schema", ROOT)?;
    check_schema(schema, &schema_path)?;
    let request = ExtractDataRequest {
        input,
        messages,
        schema: schema.clone(),
        instructions: optional(map, "instructions", ROOT)?,
        max_output_tokens: optional(map, "max_output_tokens", ROOT)?,
        temperature: optional(map, "temperature", ROOT)?,
        top_p: optional(map, "top_p", ROOT)?,
        stop: optional(map, "stop", ROOT)?,
        seed: optional(map, "seed", ROOT)?,
    };
    check_sampling(Sampling {
        max_output_tokens: request.max_output_tokens,
        temperature: request.temperature,
        top_p: request.top_p,
        stop: request.stop.as_deref(),
        seed: request.seed,
    })?;
    Ok(request)
}

// ---------------------------------------------------------------------------------------
// Caller schemas (extract_data)
// ---------------------------------------------------------------------------------------

/// A retriever that refuses everything: a tenant's schema never makes the server fetch.
struct NoRetrieval;

impl jsonschema::Retrieve for NoRetrieval {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!(
            "refusing to retrieve `{}`: schemas may only reference themselves",
            clip(uri.as_str())
        )
        .into())
    }
}

/// Compiles a caller's schema: formats are asserted, nothing is ever retrieved.
fn compile_schema(
    schema: &Value,
) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    jsonschema::options()
        .with_retriever(NoRetrieval)
        .should_validate_formats(true)
        .build(schema)
}

/// Checks a caller's schema: shape, references (before anything else looks at it), its
/// meta-schema, and that it compiles.
fn check_schema(schema: &Value, path: &str) -> Result<(), InvalidInput> {
    if !(schema.is_object() || schema.is_boolean()) {
        return Err(InvalidInput::field(
            path,
            format!(
                "must be a JSON Schema (an object or a boolean), not {}",
                describe(schema)
            ),
        ));
    }
    refuse_external_references(schema, path)?;
    jsonschema::meta::validate(schema).map_err(|e| {
        InvalidInput::field(
            path,
            format!(
                "is not a valid JSON Schema: {} ({})",
                clip_long(&e.to_string()),
                at_pointer(e.instance_path().as_str())
            ),
        )
    })?;
    compile_schema(schema).map_err(|e| {
        InvalidInput::field(
            path,
            format!(
                "is not a usable JSON Schema: {} ({})",
                clip_long(&e.to_string()),
                at_pointer(e.instance_path().as_str())
            ),
        )
    })?;
    Ok(())
}

/// Walks the whole schema (iteratively) and refuses every `$ref` / `$dynamicRef` /
/// `$recursiveRef` that is not a local fragment, and every `$schema` that is not a bundled
/// draft (an unknown meta-schema would have to be fetched). Conservative: such keys are
/// refused even inside `const` / `enum` / `default` / `examples` data.
fn refuse_external_references(schema: &Value, path: &str) -> Result<(), InvalidInput> {
    let mut stack: Vec<(&Value, String)> = vec![(schema, String::new())];
    while let Some((value, pointer)) = stack.pop() {
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    if let Value::String(target) = child {
                        let here = format!("{pointer}/{}", escape_pointer(key));
                        match key.as_str() {
                            "$ref" | "$dynamicRef" | "$recursiveRef"
                                if !target.starts_with('#') =>
                            {
                                return Err(InvalidInput::field(
                                    path,
                                    format!(
                                        "`{key}` \"{}\" ({}) is not a local reference: only \
                                         references within the schema (starting with \"#\") \
                                         are allowed, remote schemas are never fetched",
                                        clip(target),
                                        at_pointer(&here)
                                    ),
                                ));
                            }
                            "$schema"
                                if jsonschema::Draft::from_schema_uri(target)
                                    == jsonschema::Draft::Unknown =>
                            {
                                return Err(InvalidInput::field(
                                    path,
                                    format!(
                                        "`$schema` \"{}\" ({}) is not a supported dialect: use \
                                         draft 4, 6, 7, 2019-09 or 2020-12 (or omit it for 2020-12)",
                                        clip(target),
                                        at_pointer(&here)
                                    ),
                                ));
                            }
                            _ => {}
                        }
                    } else if child.is_object() || child.is_array() {
                        stack.push((child, format!("{pointer}/{}", escape_pointer(key))));
                    }
                }
            }
            Value::Array(elements) => {
                for (i, child) in elements.iter().enumerate() {
                    if child.is_object() || child.is_array() {
                        stack.push((child, format!("{pointer}/{i}")));
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn escape_pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

fn at_pointer(pointer: &str) -> String {
    if pointer.is_empty() {
        "at the root".to_owned()
    } else {
        format!("at {}", clip(pointer))
    }
}

// ---------------------------------------------------------------------------------------
// Output validation
// ---------------------------------------------------------------------------------------

/// Validates a model output against the request's contract (SPEC §2) and returns the
/// normalized output:
/// - `generate_text`: `{"text": string}`, nothing else;
/// - `classify`: `{"label": one of the labels, "confidence"?: number in [0, 1]}` (a `null`
///   confidence is dropped), nothing else;
/// - `classify_many`: `{"results": [{"id", "label"}]}` with exactly one result per item id,
///   no unknown or duplicate ids, every label one of the labels; normalized to the items'
///   order;
/// - `extract_data`: any JSON value valid against the caller's schema (the first few
///   errors are reported).
///
/// Messages are short and quote model text only in excerpts, so they can be shown to the
/// model when asking again.
pub fn validate_output(request: &TaskRequest, output: &Value) -> Result<Value, OutputViolation> {
    match request {
        TaskRequest::GenerateText(_) => {
            let map = output_object(output, &["text"])?;
            match map.get("text") {
                Some(Value::String(text)) => Ok(json!({ "text": text })),
                Some(other) => Err(violation(format!(
                    "`text` must be a string, not {}",
                    describe(other)
                ))),
                None => Err(violation("missing field `text`")),
            }
        }
        TaskRequest::Classify(r) => {
            let map = output_object(output, &["label", "confidence"])?;
            let label = output_label(map.get("label"), &r.labels, "")?;
            let mut normalized = Map::new();
            normalized.insert("label".to_owned(), Value::String(label.to_owned()));
            match map.get("confidence") {
                None | Some(Value::Null) => {}
                Some(Value::Number(n)) if n.as_f64().is_some_and(|c| (0.0..=1.0).contains(&c)) => {
                    normalized.insert("confidence".to_owned(), Value::Number(n.clone()));
                }
                Some(other) => {
                    return Err(violation(format!(
                        "`confidence` must be a number from 0 to 1, got {}",
                        excerpt(other)
                    )));
                }
            }
            Ok(Value::Object(normalized))
        }
        TaskRequest::ClassifyMany(r) => validate_classify_many(r, output),
        TaskRequest::ExtractData(r) => {
            let validator = compile_schema(&r.schema).map_err(|e| {
                violation(format!(
                    "the request's schema cannot be compiled: {}",
                    clip_long(&e.to_string())
                ))
            })?;
            let errors: Vec<String> = validator
                .iter_errors(output)
                .take(MAX_REPORTED_SCHEMA_ERRORS + 1)
                .map(|e| {
                    format!(
                        "{}: {}",
                        at_pointer(e.instance_path().as_str()),
                        clip_long(&e.to_string())
                    )
                })
                .collect();
            if errors.is_empty() {
                return Ok(output.clone());
            }
            let more = errors.len() > MAX_REPORTED_SCHEMA_ERRORS;
            let mut message = format!(
                "output does not match the schema: {}",
                errors[..errors.len().min(MAX_REPORTED_SCHEMA_ERRORS)].join("; ")
            );
            if more {
                message.push_str("; and more");
            }
            Err(violation(message))
        }
    }
}

fn validate_classify_many(
    request: &ClassifyManyRequest,
    output: &Value,
) -> Result<Value, OutputViolation> {
    let map = output_object(output, &["results"])?;
    let results = match map.get("results") {
        Some(Value::Array(results)) => results,
        Some(other) => {
            return Err(violation(format!(
                "`results` must be an array, not {}",
                describe(other)
            )));
        }
        None => return Err(violation("missing field `results`")),
    };
    let index: HashMap<&str, usize> = request
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| (item.id.as_str(), i))
        .collect();
    let mut labels: Vec<Option<&str>> = vec![None; request.items.len()];
    for (i, result) in results.iter().enumerate() {
        let at = format!("results[{i}]");
        let Value::Object(entry) = result else {
            return Err(violation(format!(
                r#"{at} must be an object {{"id", "label"}}, not {}"#,
                describe(result)
            )));
        };
        if let Some(key) = entry.keys().find(|k| *k != "id" && *k != "label") {
            return Err(violation(format!(
                "{at} has an unexpected field `{}` (only `id` and `label` are allowed)",
                clip(key)
            )));
        }
        let id = match entry.get("id") {
            Some(Value::String(id)) => id.as_str(),
            Some(other) => {
                return Err(violation(format!(
                    "{at}.id must be a string, not {}",
                    describe(other)
                )));
            }
            None => return Err(violation(format!("{at} is missing field `id`"))),
        };
        let Some(&slot) = index.get(id) else {
            return Err(violation(format!(
                "{at}.id `{}` is not one of the item ids",
                clip(id)
            )));
        };
        let label = output_label(entry.get("label"), &request.labels, &format!("{at}."))?;
        if labels[slot].is_some() {
            return Err(violation(format!(
                "{at}.id `{}` appears more than once: give exactly one result per item",
                clip(id)
            )));
        }
        labels[slot] = Some(label);
    }
    let missing: Vec<&str> = request
        .items
        .iter()
        .zip(&labels)
        .filter(|(_, label)| label.is_none())
        .map(|(item, _)| item.id.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(violation(format!(
            "missing results for {} item id(s): {}",
            missing.len(),
            list_quoted(missing.iter().copied())
        )));
    }
    let normalized: Vec<Value> = request
        .items
        .iter()
        .zip(labels)
        .map(|(item, label)| json!({ "id": item.id, "label": label }))
        .collect();
    Ok(json!({ "results": normalized }))
}

/// The output as an object with no keys outside `allowed`.
fn output_object<'a>(
    output: &'a Value,
    allowed: &[&str],
) -> Result<&'a Map<String, Value>, OutputViolation> {
    let Value::Object(map) = output else {
        return Err(violation(format!(
            "output must be a JSON object, not {}",
            describe(output)
        )));
    };
    if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
        let expected: Vec<String> = allowed.iter().map(|a| format!("`{a}`")).collect();
        return Err(violation(format!(
            "unexpected field `{}` (allowed: {})",
            clip(key),
            expected.join(", ")
        )));
    }
    Ok(map)
}

/// The `label` of an output, which must be one of the request's label names.
fn output_label<'a>(
    value: Option<&Value>,
    labels: &'a [Label],
    at: &str,
) -> Result<&'a str, OutputViolation> {
    match value {
        Some(Value::String(label)) => labels
            .iter()
            .map(Label::name)
            .find(|name| name == label)
            .ok_or_else(|| {
                violation(format!(
                    "{at}label `{}` is not one of the labels: {}",
                    clip(label),
                    list_quoted(labels.iter().map(Label::name))
                ))
            }),
        Some(other) => Err(violation(format!(
            "{at}label must be a string, not {}",
            describe(other)
        ))),
        None => Err(violation(format!("{at}label is missing"))),
    }
}

fn violation(message: impl Into<String>) -> OutputViolation {
    OutputViolation(message.into())
}

// ---------------------------------------------------------------------------------------
// Message helpers
// ---------------------------------------------------------------------------------------

/// "a string", "an object", … for type errors.
fn describe(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// At most `MAX_QUOTE_CHARS` chars of `s`.
fn clip(s: &str) -> String {
    clip_to(s, MAX_QUOTE_CHARS)
}

/// At most a few hundred chars of a (library) message that may quote a whole instance.
fn clip_long(s: &str) -> String {
    clip_to(s, 4 * MAX_QUOTE_CHARS)
}

fn clip_to(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

/// A short JSON rendering of a value.
fn excerpt(value: &Value) -> String {
    clip(&value.to_string())
}

/// "`a`, `b`, … (and N more)".
fn list_quoted<'a>(names: impl ExactSizeIterator<Item = &'a str>) -> String {
    let total = names.len();
    let shown: Vec<String> = names
        .take(MAX_LISTED)
        .map(|n| format!("`{}`", clip(n)))
        .collect();
    let mut out = shown.join(", ");
    if total > MAX_LISTED {
        out.push_str(&format!(" (and {} more)", total - MAX_LISTED));
    }
    out
}

// ---------------------------------------------------------------------------------------
// Published schemas
// ---------------------------------------------------------------------------------------

fn label_schema() -> Value {
    let name = json!({
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_LABEL_BYTES,
        "description": format!(
            "Not only whitespace, at most {MAX_LABEL_BYTES} UTF-8 bytes, unique within the request."
        )
    });
    json!({
        "description": "A label: its name, or an object with its name and a description.",
        "oneOf": [
            name,
            {
                "type": "object",
                "properties": {
                    "name": name,
                    "description": { "type": ["string", "null"] }
                },
                "required": ["name"],
                "additionalProperties": false
            }
        ]
    })
}

fn labels_schema() -> Value {
    json!({
        "type": "array",
        "minItems": 1,
        "maxItems": MAX_LABELS,
        "items": { "$ref": "#/$defs/label" },
        "description": "The labels to choose from; names are unique."
    })
}

fn chat_message_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "role": { "enum": ["system", "user", "assistant"] },
            "content": { "type": "string" }
        },
        "required": ["role", "content"],
        "additionalProperties": false
    })
}

fn temperature_schema() -> Value {
    json!({ "type": ["number", "null"], "minimum": 0, "maximum": MAX_TEMPERATURE })
}

fn top_p_schema() -> Value {
    json!({ "type": ["number", "null"], "exclusiveMinimum": 0, "maximum": 1 })
}

fn stop_schema() -> Value {
    json!({
        "type": ["array", "null"],
        "minItems": 1,
        "maxItems": MAX_STOP_SEQUENCES,
        "items": { "type": "string", "minLength": 1 },
        "description": "Sequences where generation stops."
    })
}

fn seed_schema() -> Value {
    json!({ "type": ["integer", "null"], "minimum": -MAX_SEED, "maximum": MAX_SEED })
}

fn instructions_schema() -> Value {
    json!({ "type": ["string", "null"], "description": "Extra instructions for the model." })
}

/// The generic published JSON Schema (draft 2020-12) of a kind's request object (the value
/// under "request", without "kind"). Rules JSON Schema cannot express (unique label names
/// and item ids, sizes in bytes) are stated in descriptions and enforced by
/// [`TaskRequest::parse`].
pub fn request_schema(kind: TaskKind) -> Value {
    match kind {
        TaskKind::GenerateText => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "generate_text request",
            "type": "object",
            "properties": {
                "messages": {
                    "type": ["array", "null"],
                    "minItems": 1,
                    "items": { "$ref": "#/$defs/chat_message" },
                    "description": "The chat so far; exclusive with `prompt`."
                },
                "prompt": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "description": "A single user prompt; exclusive with `messages`."
                },
                "system": { "type": ["string", "null"], "description": "A system prompt." },
                "max_output_tokens": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": u32::MAX
                },
                "temperature": temperature_schema(),
                "top_p": top_p_schema(),
                "stop": stop_schema(),
                "seed": seed_schema()
            },
            "additionalProperties": false,
            "oneOf": [
                { "required": ["messages"], "properties": { "messages": { "type": "array" } } },
                { "required": ["prompt"], "properties": { "prompt": { "type": "string" } } }
            ],
            "$defs": { "chat_message": chat_message_schema() }
        }),
        TaskKind::Classify => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "classify request",
            "type": "object",
            "properties": {
                "input": { "type": "string", "description": "The text to classify." },
                "labels": labels_schema(),
                "instructions": instructions_schema()
            },
            "required": ["input", "labels"],
            "additionalProperties": false,
            "$defs": { "label": label_schema() }
        }),
        TaskKind::ClassifyMany => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "classify_many request",
            "type": "object",
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": MAX_ITEMS,
                    "description": "The inputs; ids are unique.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": {
                                "type": "string",
                                "minLength": 1,
                                "maxLength": MAX_ITEM_ID_BYTES,
                                "description": format!(
                                    "At most {MAX_ITEM_ID_BYTES} UTF-8 bytes, unique within the request."
                                )
                            },
                            "input": { "type": "string" }
                        },
                        "required": ["id", "input"],
                        "additionalProperties": false
                    }
                },
                "labels": labels_schema(),
                "instructions": instructions_schema()
            },
            "required": ["items", "labels"],
            "additionalProperties": false,
            "$defs": { "label": label_schema() }
        }),
        TaskKind::ExtractData => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "extract_data request",
            "type": "object",
            "properties": {
                "input": {
                    "type": ["string", "null"],
                    "description": "The text to extract from; exclusive with `messages`."
                },
                "schema": {
                    "type": ["object", "boolean"],
                    "description": "A JSON Schema (draft 4, 6, 7, 2019-09 or 2020-12, default \
                                    2020-12) the output must satisfy. Only local references \
                                    (`$ref` starting with \"#\"); nothing is ever fetched."
                },
                "instructions": instructions_schema(),
                "messages": {
                    "type": ["array", "null"],
                    "minItems": 1,
                    "items": { "$ref": "#/$defs/chat_message" },
                    "description": "A chat whose answer is the JSON value; exclusive with `input`."
                },
                "max_output_tokens": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": u32::MAX
                },
                "temperature": temperature_schema(),
                "top_p": top_p_schema(),
                "stop": stop_schema(),
                "seed": seed_schema()
            },
            "required": ["schema"],
            "additionalProperties": false,
            "oneOf": [
                { "required": ["input"], "properties": { "input": { "type": "string" } } },
                { "required": ["messages"], "properties": { "messages": { "type": "array" } } }
            ],
            "$defs": { "chat_message": chat_message_schema() }
        }),
    }
}

/// The generic published JSON Schema (draft 2020-12) of a kind's output. The schema of one
/// request's output is narrower: see [`TaskRequest::output_schema`].
pub fn output_schema(kind: TaskKind) -> Value {
    match kind {
        TaskKind::GenerateText => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "generate_text output",
            "type": "object",
            "properties": { "text": { "type": "string" } },
            "required": ["text"],
            "additionalProperties": false
        }),
        TaskKind::Classify => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "classify output",
            "type": "object",
            "properties": {
                "label": { "type": "string", "description": "One of the request's labels." },
                "confidence": { "type": "number", "minimum": 0, "maximum": 1 }
            },
            "required": ["label"],
            "additionalProperties": false
        }),
        TaskKind::ClassifyMany => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "classify_many output",
            "type": "object",
            "properties": {
                "results": {
                    "type": "array",
                    "description": "One result per item, in the items' order.",
                    "items": {
                        "type": "object",
                        "properties": {
                            "id": { "type": "string", "description": "An item's id." },
                            "label": { "type": "string", "description": "One of the request's labels." }
                        },
                        "required": ["id", "label"],
                        "additionalProperties": false
                    }
                }
            },
            "required": ["results"],
            "additionalProperties": false
        }),
        TaskKind::ExtractData => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "extract_data output",
            "description": "Any JSON value valid against the request's `schema`."
        }),
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn field_of(err: &InvalidInput) -> &str {
        match err {
            InvalidInput::Field { field, .. } => field,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    fn reason_of(err: &InvalidInput) -> &str {
        match err {
            InvalidInput::Field { reason, .. } => reason,
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[track_caller]
    fn rejects(kind: TaskKind, value: Value, field: &str, reason_contains: &str) {
        let err =
            TaskRequest::parse(kind, &value).expect_err(&format!("{kind} should reject {value}"));
        assert_eq!(field_of(&err), field, "{err}");
        assert!(
            reason_of(&err).contains(reason_contains),
            "reason {:?} should contain {reason_contains:?}",
            reason_of(&err)
        );
        assert_eq!(err.code(), crate::error::ErrorCode::InvalidRequest);
    }

    #[track_caller]
    fn accepts(kind: TaskKind, value: Value) -> TaskRequest {
        match TaskRequest::parse(kind, &value) {
            Ok(r) => r,
            Err(e) => panic!("{kind} should accept {value}: {e}"),
        }
    }

    fn classify(labels: Value) -> Value {
        json!({ "input": "hello", "labels": labels })
    }

    fn classify_many(items: Value) -> Value {
        json!({ "items": items, "labels": ["a", "b"] })
    }

    fn extract(schema: Value) -> Value {
        json!({ "input": "Ada, 36", "schema": schema })
    }

    fn items(ids: &[&str]) -> Value {
        Value::Array(
            ids.iter()
                .map(|id| json!({ "id": id, "input": "x" }))
                .collect(),
        )
    }

    fn many_request(ids: &[&str], labels: &[&str]) -> TaskRequest {
        accepts(
            TaskKind::ClassifyMany,
            json!({ "items": items(ids), "labels": labels }),
        )
    }

    fn schema_valid(schema: &Value, instance: &Value) -> bool {
        jsonschema::validator_for(schema)
            .expect("published schema compiles")
            .is_valid(instance)
    }

    // ---- TaskKind --------------------------------------------------------------------

    #[test]
    fn kinds_round_trip() {
        for kind in TaskKind::ALL {
            assert_eq!(TaskKind::parse(kind.as_str()), Some(kind));
            assert_eq!(kind.to_string(), kind.as_str());
            assert_eq!(serde_json::to_value(kind).unwrap(), json!(kind.as_str()));
            assert_eq!(
                serde_json::from_value::<TaskKind>(json!(kind.as_str())).unwrap(),
                kind
            );
        }
        assert_eq!(TaskKind::parse("Classify"), None);
        assert_eq!(TaskKind::parse(""), None);
    }

    #[test]
    fn request_kind_matches() {
        let r = accepts(TaskKind::Classify, classify(json!(["a"])));
        assert_eq!(r.kind(), TaskKind::Classify);
        let r = accepts(TaskKind::GenerateText, json!({ "prompt": "hi" }));
        assert_eq!(r.kind(), TaskKind::GenerateText);
        let r = many_request(&["1"], &["a"]);
        assert_eq!(r.kind(), TaskKind::ClassifyMany);
        let r = accepts(TaskKind::ExtractData, extract(json!({})));
        assert_eq!(r.kind(), TaskKind::ExtractData);
    }

    // ---- common ----------------------------------------------------------------------

    #[test]
    fn request_must_be_an_object() {
        for kind in TaskKind::ALL {
            for value in [json!(null), json!([]), json!("x"), json!(1), json!(true)] {
                rejects(kind, value, "request", "must be a JSON object");
            }
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "hi", "kind": "generate_text" }),
            "request",
            "unknown field `kind`",
        );
        rejects(
            TaskKind::Classify,
            json!({ "input": "x", "labels": ["a"], "extra": 1 }),
            "request",
            "unknown field `extra`",
        );
        rejects(
            TaskKind::ClassifyMany,
            json!({ "items": items(&["1"]), "labels": ["a"], "input": "x" }),
            "request",
            "unknown field `input`",
        );
        rejects(
            TaskKind::ExtractData,
            json!({ "input": "x", "schema": {}, "labels": [] }),
            "request",
            "unknown field `labels`",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "messages": [{ "role": "user", "content": "x", "name": "bob" }] }),
            "request.messages[0]",
            "unknown field `name`",
        );
        rejects(
            TaskKind::ClassifyMany,
            classify_many(json!([{ "id": "1", "input": "x", "weight": 2 }])),
            "request.items[0]",
            "unknown field `weight`",
        );
        rejects(
            TaskKind::Classify,
            classify(json!([{ "name": "a", "color": "red" }])),
            "request.labels[0]",
            "unknown field `color`",
        );
    }

    #[test]
    fn missing_fields_are_rejected() {
        rejects(
            TaskKind::Classify,
            json!({ "labels": ["a"] }),
            "request",
            "missing field `input`",
        );
        rejects(
            TaskKind::Classify,
            json!({ "input": "x" }),
            "request",
            "missing field `labels`",
        );
        rejects(
            TaskKind::ClassifyMany,
            json!({ "labels": ["a"] }),
            "request",
            "missing field `items`",
        );
        rejects(
            TaskKind::ClassifyMany,
            json!({ "items": items(&["1"]) }),
            "request",
            "missing field `labels`",
        );
        rejects(
            TaskKind::ClassifyMany,
            classify_many(json!([{ "id": "1" }])),
            "request.items[0]",
            "missing field `input`",
        );
        rejects(
            TaskKind::ExtractData,
            json!({ "input": "x" }),
            "request",
            "missing field `schema`",
        );
        rejects(
            TaskKind::ExtractData,
            json!({ "schema": {} }),
            "request",
            "missing field `input`",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "messages": [{ "role": "user" }] }),
            "request.messages[0]",
            "missing field `content`",
        );
        rejects(
            TaskKind::Classify,
            classify(json!([{ "description": "d" }])),
            "request.labels[0]",
            "missing field `name`",
        );
    }

    #[test]
    fn wrong_types_carry_serde_messages() {
        rejects(
            TaskKind::Classify,
            classify(json!("a")),
            "request.labels",
            "invalid type: string",
        );
        rejects(
            TaskKind::Classify,
            json!({ "input": 5, "labels": ["a"] }),
            "request.input",
            "invalid type: integer `5`, expected a string",
        );
        rejects(
            TaskKind::Classify,
            classify(json!(["a", 7])),
            "request.labels[1]",
            "expected a label",
        );
        rejects(
            TaskKind::Classify,
            classify(json!([{ "name": 7 }])),
            "request.labels[0]",
            "invalid type: integer `7`",
        );
        rejects(
            TaskKind::Classify,
            json!({ "input": "x", "labels": ["a"], "instructions": 1 }),
            "request.instructions",
            "invalid type",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": ["hi"] }),
            "request.prompt",
            "invalid type: sequence",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "messages": "hi" }),
            "request.messages",
            "invalid type: string",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "messages": [{ "role": "bot", "content": "x" }] }),
            "request.messages[0]",
            "unknown variant `bot`",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "hi", "max_output_tokens": -1 }),
            "request.max_output_tokens",
            "invalid value",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "hi", "max_output_tokens": 1.5 }),
            "request.max_output_tokens",
            "invalid type",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "hi", "max_output_tokens": 5_000_000_000u64 }),
            "request.max_output_tokens",
            "invalid value",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "hi", "temperature": "hot" }),
            "request.temperature",
            "invalid type",
        );
        rejects(
            TaskKind::ClassifyMany,
            classify_many(json!({ "id": "1" })),
            "request.items",
            "invalid type: map",
        );
        rejects(
            TaskKind::ClassifyMany,
            classify_many(json!([{ "id": 1, "input": "x" }])),
            "request.items[0]",
            "invalid type: integer `1`",
        );
        rejects(
            TaskKind::ExtractData,
            json!({ "input": 7, "schema": {} }),
            "request.input",
            "invalid type: integer `7`",
        );
        // `input` is optional now (a chat may stand in for it): null is absent.
        rejects(
            TaskKind::ExtractData,
            json!({ "input": null, "schema": {} }),
            "request",
            "missing field `input`",
        );
    }

    #[test]
    fn sampling_fields_are_checked_for_both_kinds() {
        for (kind, base) in [
            (TaskKind::GenerateText, json!({ "prompt": "p" })),
            (TaskKind::ExtractData, json!({ "input": "x", "schema": {} })),
        ] {
            let with = |key: &str, value: Value| {
                let mut v = base.clone();
                v[key] = value;
                v
            };
            accepts(kind, with("top_p", json!(1)));
            accepts(kind, with("stop", json!(["\n\n", "END"])));
            accepts(kind, with("seed", json!(-42)));
            rejects(kind, with("top_p", json!(0)), "request.top_p", "above 0");
            rejects(
                kind,
                with("top_p", json!(1.5)),
                "request.top_p",
                "at most 1",
            );
            rejects(kind, with("stop", json!([])), "request.stop", "1 to 4");
            rejects(
                kind,
                with("stop", json!(["a", "b", "c", "d", "e"])),
                "request.stop",
                "1 to 4",
            );
            rejects(
                kind,
                with("stop", json!(["a", ""])),
                "request.stop[1]",
                "empty",
            );
            rejects(
                kind,
                with("seed", json!(1_i64 << 54)),
                "request.seed",
                "2^53",
            );
            rejects(
                kind,
                with("temperature", json!(3)),
                "request.temperature",
                "from 0 to 2",
            );
        }
        // Unset, they are absent from the stored request, so older hashes hold.
        let r = accepts(TaskKind::ExtractData, json!({ "input": "x", "schema": {} }));
        assert_eq!(r.to_value(), json!({ "input": "x", "schema": {} }));
    }

    #[test]
    fn extract_data_takes_input_or_messages() {
        let chat = json!([{ "role": "user", "content": "Ada, 36" }]);
        let r = accepts(
            TaskKind::ExtractData,
            json!({ "messages": chat, "schema": { "type": "object" } }),
        );
        let TaskRequest::ExtractData(e) = &r else {
            panic!("{r:?}")
        };
        assert_eq!(e.messages.as_ref().map(Vec::len), Some(1));
        assert_eq!(e.input, None);
        rejects(
            TaskKind::ExtractData,
            json!({ "messages": chat, "input": "x", "schema": {} }),
            "request",
            "not both",
        );
        rejects(
            TaskKind::ExtractData,
            json!({ "messages": [], "schema": {} }),
            "request.messages",
            "at least one message",
        );
    }

    #[test]
    fn null_optional_fields_are_absent() {
        let r = accepts(
            TaskKind::GenerateText,
            json!({ "prompt": "hi", "messages": null, "system": null, "temperature": null, "max_output_tokens": null }),
        );
        assert_eq!(r.to_value(), json!({ "prompt": "hi" }));
        let r = accepts(
            TaskKind::Classify,
            json!({ "input": "x", "labels": ["a"], "instructions": null }),
        );
        assert_eq!(r.to_value(), json!({ "input": "x", "labels": ["a"] }));
    }

    // ---- generate_text -----------------------------------------------------------------

    #[test]
    fn generate_text_accepts_prompt_or_messages() {
        let r = accepts(
            TaskKind::GenerateText,
            json!({ "prompt": "Write a haiku", "system": "be brief", "max_output_tokens": 1, "temperature": 0 }),
        );
        let TaskRequest::GenerateText(g) = &r else {
            panic!()
        };
        assert_eq!(g.prompt.as_deref(), Some("Write a haiku"));
        assert_eq!(g.max_output_tokens, Some(1));
        assert_eq!(g.temperature, Some(0.0));
        let r = accepts(
            TaskKind::GenerateText,
            json!({ "messages": [
                { "role": "system", "content": "s" },
                { "role": "user", "content": "u" },
                { "role": "assistant", "content": "a" }
            ], "temperature": 2, "max_output_tokens": u32::MAX }),
        );
        let TaskRequest::GenerateText(g) = &r else {
            panic!()
        };
        let roles: Vec<ChatRole> = g
            .messages
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.role)
            .collect();
        assert_eq!(
            roles,
            [ChatRole::System, ChatRole::User, ChatRole::Assistant]
        );
        assert_eq!(
            r.to_value(),
            json!({ "messages": [
                { "role": "system", "content": "s" },
                { "role": "user", "content": "u" },
                { "role": "assistant", "content": "a" }
            ], "temperature": 2.0, "max_output_tokens": u32::MAX })
        );
    }

    #[test]
    fn generate_text_needs_exactly_one_of_messages_or_prompt() {
        rejects(
            TaskKind::GenerateText,
            json!({}),
            "request",
            "one of `messages` or `prompt` is required",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "system": "s" }),
            "request",
            "is required",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "messages": [{ "role": "user", "content": "u" }] }),
            "request",
            "not both",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "messages": [] }),
            "request.messages",
            "at least one message",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "" }),
            "request.prompt",
            "must not be empty",
        );
    }

    #[test]
    fn generate_text_ranges() {
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "max_output_tokens": 0 }),
            "request.max_output_tokens",
            "at least 1",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": -0.01 }),
            "request.temperature",
            "from 0 to 2",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 2.0001 }),
            "request.temperature",
            "from 0 to 2",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 1e308 }),
            "request.temperature",
            "from 0 to 2",
        );
        accepts(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 0.7 }),
        );
        accepts(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 2 }),
        );
    }

    // ---- labels ------------------------------------------------------------------------

    #[test]
    fn labels_round_trip_in_their_form() {
        let labels = json!([
            "spam",
            { "name": "ham" },
            { "name": "eggs", "description": "breakfast" }
        ]);
        let r = accepts(TaskKind::Classify, classify(labels.clone()));
        let TaskRequest::Classify(c) = &r else {
            panic!()
        };
        assert_eq!(c.labels[0], Label::Name("spam".into()));
        assert_eq!(
            c.labels[1],
            Label::Described {
                name: "ham".into(),
                description: None
            }
        );
        assert_eq!(c.labels[2].name(), "eggs");
        assert_eq!(c.labels[2].description(), Some("breakfast"));
        assert_eq!(c.labels[0].description(), None);
        assert_eq!(r.to_value(), classify(labels.clone()));
        // Serde round trip of the type itself.
        let parsed: Vec<Label> = serde_json::from_value(labels.clone()).unwrap();
        assert_eq!(serde_json::to_value(&parsed).unwrap(), labels);
        // A null description is dropped.
        let r = accepts(
            TaskKind::Classify,
            classify(json!([{ "name": "a", "description": null }])),
        );
        assert_eq!(r.to_value(), classify(json!([{ "name": "a" }])));
    }

    #[test]
    fn label_rules() {
        rejects(
            TaskKind::Classify,
            classify(json!([])),
            "request.labels",
            "at least one label",
        );
        rejects(
            TaskKind::Classify,
            classify(json!(["a", ""])),
            "request.labels[1]",
            "must not be empty",
        );
        rejects(
            TaskKind::Classify,
            classify(json!(["a", "  "])),
            "request.labels[1]",
            "must not be empty",
        );
        rejects(
            TaskKind::Classify,
            classify(json!(["a", { "name": "" }])),
            "request.labels[1].name",
            "must not be empty",
        );
        rejects(
            TaskKind::Classify,
            classify(json!(["a", "b", { "name": "a" }])),
            "request.labels[2].name",
            "duplicate label name `a` (already at request.labels[0])",
        );
        rejects(
            TaskKind::Classify,
            classify(json!(["a", "a"])),
            "request.labels[1]",
            "duplicate",
        );
        let long = "x".repeat(MAX_LABEL_BYTES + 1);
        rejects(
            TaskKind::Classify,
            classify(json!([long])),
            "request.labels[0]",
            "at most 256 bytes",
        );
        // Bytes, not chars: 129 two-byte chars are 258 bytes.
        let wide = "é".repeat(129);
        rejects(
            TaskKind::Classify,
            classify(json!([{ "name": wide }])),
            "request.labels[0].name",
            "at most 256 bytes",
        );
        accepts(
            TaskKind::Classify,
            classify(json!(["x".repeat(MAX_LABEL_BYTES)])),
        );
        let many: Vec<String> = (0..=MAX_LABELS).map(|i| format!("l{i}")).collect();
        rejects(
            TaskKind::Classify,
            classify(json!(many)),
            "request.labels",
            "over the limit of 1000",
        );
        let enough: Vec<String> = (0..MAX_LABELS).map(|i| format!("l{i}")).collect();
        accepts(TaskKind::Classify, classify(json!(enough)));
        // classify_many shares the label rules.
        rejects(
            TaskKind::ClassifyMany,
            json!({ "items": items(&["1"]), "labels": ["a", "a"] }),
            "request.labels[1]",
            "duplicate",
        );
        rejects(
            TaskKind::ClassifyMany,
            json!({ "items": items(&["1"]), "labels": [] }),
            "request.labels",
            "at least one label",
        );
    }

    // ---- classify_many -----------------------------------------------------------------

    #[test]
    fn item_rules() {
        rejects(
            TaskKind::ClassifyMany,
            classify_many(json!([])),
            "request.items",
            "at least one item",
        );
        rejects(
            TaskKind::ClassifyMany,
            classify_many(items(&["1", ""])),
            "request.items[1].id",
            "must not be empty",
        );
        rejects(
            TaskKind::ClassifyMany,
            classify_many(items(&["1", "2", "1"])),
            "request.items[2].id",
            "duplicate item id `1` (already at request.items[0].id)",
        );
        let long = "i".repeat(MAX_ITEM_ID_BYTES + 1);
        rejects(
            TaskKind::ClassifyMany,
            classify_many(items(&[&long])),
            "request.items[0].id",
            "at most 256 bytes",
        );
        let many: Vec<String> = (0..=MAX_ITEMS).map(|i| i.to_string()).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        rejects(
            TaskKind::ClassifyMany,
            classify_many(items(&refs)),
            "request.items",
            "over the limit of 1000",
        );
        accepts(
            TaskKind::ClassifyMany,
            classify_many(items(&refs[..MAX_ITEMS])),
        );
        // A space is a legitimate (if odd) id.
        accepts(TaskKind::ClassifyMany, classify_many(items(&[" "])));
    }

    // ---- extract_data ------------------------------------------------------------------

    fn person_schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "name": { "type": "string" },
                "age": { "type": "integer", "minimum": 0 },
                "address": { "$ref": "#/$defs/address" }
            },
            "required": ["name", "age"],
            "additionalProperties": false,
            "$defs": { "address": { "type": "object", "properties": { "city": { "type": "string" } } } }
        })
    }

    #[test]
    fn extract_data_accepts_valid_schemas() {
        let r = accepts(TaskKind::ExtractData, extract(person_schema()));
        assert_eq!(r.to_value(), extract(person_schema()));
        assert_eq!(r.output_schema(), person_schema());
        accepts(TaskKind::ExtractData, extract(json!(true)));
        accepts(TaskKind::ExtractData, extract(json!(false)));
        accepts(
            TaskKind::ExtractData,
            extract(json!({ "type": "array", "items": { "type": "number" } })),
        );
        accepts(
            TaskKind::ExtractData,
            extract(
                json!({ "$schema": "http://json-schema.org/draft-07/schema#", "definitions": { "a": { "type": "string" } }, "$ref": "#/definitions/a" }),
            ),
        );
        accepts(
            TaskKind::ExtractData,
            extract(
                json!({ "$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "https://example.com/s", "$ref": "#" , "type": "object" }),
            ),
        );
        accepts(
            TaskKind::ExtractData,
            extract(
                json!({ "$defs": { "n": { "$anchor": "node", "type": "object" } }, "$ref": "#node" }),
            ),
        );
    }

    #[test]
    fn extract_data_schema_must_be_object_or_boolean() {
        for schema in [json!(null), json!("string"), json!(1), json!([{}])] {
            rejects(
                TaskKind::ExtractData,
                extract(schema),
                "request.schema",
                "an object or a boolean",
            );
        }
    }

    #[test]
    fn extract_data_refuses_remote_references() {
        let cases = [
            json!({ "$ref": "https://example.com/schema.json" }),
            json!({ "$ref": "http://169.254.169.254/latest/meta-data" }),
            json!({ "$ref": "file:///etc/passwd" }),
            json!({ "$ref": "other.json#/a" }),
            json!({ "$ref": "" }),
            json!({ "properties": { "a": { "items": [{ "$ref": "https://x.test/a" }] } } }),
            json!({ "$defs": { "d": { "$dynamicRef": "https://x.test/d#meta" } } }),
            json!({ "$recursiveRef": "https://x.test/r" }),
            json!({ "$id": "https://example.com/root", "$ref": "sibling.json" }),
        ];
        for schema in cases {
            let err = TaskRequest::parse(TaskKind::ExtractData, &extract(schema.clone()))
                .expect_err(&format!("should refuse {schema}"));
            assert_eq!(field_of(&err), "request.schema");
            assert!(reason_of(&err).contains("not a local reference"), "{err}");
            assert!(reason_of(&err).contains("never fetched"), "{err}");
        }
        let err = TaskRequest::parse(
            TaskKind::ExtractData,
            &extract(json!({ "properties": { "a/b": { "$ref": "https://x.test/a" } } })),
        )
        .unwrap_err();
        assert!(
            reason_of(&err).contains("at /properties/a~1b/$ref"),
            "{err}"
        );
    }

    #[test]
    fn extract_data_refuses_unknown_meta_schemas() {
        for uri in [
            "https://example.com/my-meta",
            "http://json-schema.org/draft-03/schema#",
            "x",
        ] {
            rejects(
                TaskKind::ExtractData,
                extract(json!({ "$schema": uri })),
                "request.schema",
                "not a supported dialect",
            );
        }
        rejects(
            TaskKind::ExtractData,
            extract(
                json!({ "properties": { "a": { "$id": "https://x.test/a", "$schema": "https://x.test/meta" } } }),
            ),
            "request.schema",
            "not a supported dialect",
        );
    }

    #[test]
    fn extract_data_refuses_invalid_schemas() {
        rejects(
            TaskKind::ExtractData,
            extract(json!({ "type": "thing" })),
            "request.schema",
            "not a valid JSON Schema",
        );
        rejects(
            TaskKind::ExtractData,
            extract(json!({ "minLength": -1 })),
            "request.schema",
            "not a valid JSON Schema",
        );
        rejects(
            TaskKind::ExtractData,
            extract(json!({ "required": "name" })),
            "request.schema",
            "not a valid JSON Schema",
        );
        rejects(
            TaskKind::ExtractData,
            extract(json!({ "properties": { "a": { "type": 5 } } })),
            "request.schema",
            "at /properties/a/type",
        );
        rejects(
            TaskKind::ExtractData,
            extract(json!({ "$ref": 5 })),
            "request.schema",
            "not a valid JSON Schema",
        );
        // Passes the meta-schema but cannot be compiled.
        let err = TaskRequest::parse(
            TaskKind::ExtractData,
            &extract(json!({ "$ref": "#/$defs/missing" })),
        )
        .unwrap_err();
        assert_eq!(field_of(&err), "request.schema");
        let err = TaskRequest::parse(
            TaskKind::ExtractData,
            &extract(json!({ "type": "string", "pattern": "(unclosed" })),
        )
        .unwrap_err();
        assert_eq!(field_of(&err), "request.schema");
    }

    #[test]
    fn no_retrieval_refuses() {
        use jsonschema::Retrieve;
        let uri = jsonschema::uri::from_str("https://example.com/a.json").unwrap();
        assert!(NoRetrieval.retrieve(&uri).is_err());
    }

    // ---- output schemas ----------------------------------------------------------------

    #[test]
    fn published_schemas_are_valid_draft_2020_12() {
        for kind in TaskKind::ALL {
            for schema in [request_schema(kind), output_schema(kind)] {
                assert_eq!(schema["$schema"], SCHEMA_DIALECT);
                jsonschema::meta::validate(&schema).unwrap_or_else(|e| panic!("{kind}: {e}"));
                jsonschema::validator_for(&schema).unwrap_or_else(|e| panic!("{kind}: {e}"));
            }
        }
    }

    #[test]
    fn request_schemas_agree_with_parse() {
        let cases: Vec<(TaskKind, Value)> = vec![
            (TaskKind::GenerateText, json!({ "prompt": "p" })),
            (
                TaskKind::GenerateText,
                json!({ "prompt": "p", "messages": null, "temperature": 1.5, "max_output_tokens": 10, "system": "s" }),
            ),
            (
                TaskKind::GenerateText,
                json!({ "messages": [{ "role": "user", "content": "u" }] }),
            ),
            (TaskKind::GenerateText, json!({})),
            (
                TaskKind::GenerateText,
                json!({ "prompt": null, "messages": null }),
            ),
            (
                TaskKind::GenerateText,
                json!({ "prompt": "p", "messages": [] }),
            ),
            (TaskKind::GenerateText, json!({ "prompt": "" })),
            (TaskKind::GenerateText, json!({ "messages": [] })),
            (
                TaskKind::GenerateText,
                json!({ "prompt": "p", "temperature": 3 }),
            ),
            (
                TaskKind::GenerateText,
                json!({ "prompt": "p", "max_output_tokens": 0 }),
            ),
            (TaskKind::GenerateText, json!({ "prompt": "p", "extra": 0 })),
            (
                TaskKind::GenerateText,
                json!({ "messages": [{ "role": "bot", "content": "u" }] }),
            ),
            (
                TaskKind::Classify,
                classify(json!(["a", { "name": "b", "description": "d" }])),
            ),
            (TaskKind::Classify, classify(json!([]))),
            (TaskKind::Classify, classify(json!([""]))),
            (
                TaskKind::Classify,
                classify(json!([{ "name": "a", "x": 1 }])),
            ),
            (TaskKind::Classify, json!({ "input": "x" })),
            (
                TaskKind::Classify,
                json!({ "input": "x", "labels": ["a"], "instructions": "be nice" }),
            ),
            (TaskKind::ClassifyMany, classify_many(items(&["1", "2"]))),
            (TaskKind::ClassifyMany, classify_many(items(&[""]))),
            (TaskKind::ClassifyMany, classify_many(json!([]))),
            (
                TaskKind::ClassifyMany,
                classify_many(json!([{ "id": "1" }])),
            ),
            (TaskKind::ExtractData, extract(json!({ "type": "object" }))),
            (TaskKind::ExtractData, extract(json!(true))),
            (TaskKind::ExtractData, extract(json!("nope"))),
            (TaskKind::ExtractData, json!({ "input": "x" })),
        ];
        for (kind, value) in cases {
            let parsed = TaskRequest::parse(kind, &value);
            let valid = schema_valid(&request_schema(kind), &value);
            assert_eq!(
                parsed.is_ok(),
                valid,
                "{kind} {value}: parse {parsed:?}, schema {valid}"
            );
            if let Ok(r) = parsed {
                assert!(schema_valid(&request_schema(kind), &r.to_value()));
            }
        }
    }

    #[test]
    fn derived_deserialize_matches_parse() {
        let values = [
            (
                TaskKind::GenerateText,
                json!({ "prompt": "p", "temperature": 0.5, "system": "s" }),
            ),
            (
                TaskKind::Classify,
                classify(json!(["a", { "name": "b", "description": "d" }])),
            ),
            (TaskKind::ClassifyMany, classify_many(items(&["1", "2"]))),
            (TaskKind::ExtractData, extract(person_schema())),
        ];
        for (kind, value) in values {
            let r = accepts(kind, value.clone());
            let back = match kind {
                TaskKind::GenerateText => {
                    TaskRequest::GenerateText(serde_json::from_value(r.to_value()).unwrap())
                }
                TaskKind::Classify => {
                    TaskRequest::Classify(serde_json::from_value(r.to_value()).unwrap())
                }
                TaskKind::ClassifyMany => {
                    TaskRequest::ClassifyMany(serde_json::from_value(r.to_value()).unwrap())
                }
                TaskKind::ExtractData => {
                    TaskRequest::ExtractData(serde_json::from_value(r.to_value()).unwrap())
                }
            };
            assert_eq!(back, r);
            assert_eq!(r.to_value(), value);
        }
        // The derived impls refuse unknown fields too.
        assert!(
            serde_json::from_value::<ClassifyRequest>(
                json!({ "input": "x", "labels": ["a"], "z": 1 })
            )
            .is_err()
        );
        assert!(
            serde_json::from_value::<GenerateTextRequest>(json!({ "prompt": "x", "z": 1 }))
                .is_err()
        );
    }

    #[test]
    fn per_request_output_schemas() {
        let r = accepts(
            TaskKind::Classify,
            classify(json!(["spam", { "name": "ham" }])),
        );
        let s = r.output_schema();
        assert_eq!(s["properties"]["label"]["enum"], json!(["spam", "ham"]));
        assert_eq!(s["additionalProperties"], json!(false));
        assert!(schema_valid(
            &s,
            &json!({ "label": "spam", "confidence": null })
        ));
        assert!(schema_valid(
            &s,
            &json!({ "label": "ham", "confidence": 0.5 })
        ));
        assert!(!schema_valid(
            &s,
            &json!({ "label": "eggs", "confidence": null })
        ));

        let r = many_request(&["a", "b"], &["x", "y"]);
        let s = r.output_schema();
        assert_eq!(
            s["properties"]["results"]["items"]["properties"]["id"]["enum"],
            json!(["a", "b"])
        );
        assert_eq!(s["properties"]["results"]["minItems"], json!(2));
        assert!(schema_valid(
            &s,
            &json!({ "results": [{ "id": "b", "label": "x" }, { "id": "a", "label": "y" }] })
        ));
        assert!(!schema_valid(
            &s,
            &json!({ "results": [{ "id": "c", "label": "x" }, { "id": "a", "label": "y" }] })
        ));

        let r = accepts(TaskKind::GenerateText, json!({ "prompt": "p" }));
        assert!(schema_valid(&r.output_schema(), &json!({ "text": "t" })));
        assert!(!schema_valid(
            &r.output_schema(),
            &json!({ "text": "t", "x": 1 })
        ));

        // Strict-mode shape: every property required, no additional properties.
        for r in [
            accepts(TaskKind::GenerateText, json!({ "prompt": "p" })),
            accepts(TaskKind::Classify, classify(json!(["a"]))),
            many_request(&["1"], &["a"]),
        ] {
            let s = r.output_schema();
            jsonschema::meta::validate(&s).unwrap();
            let props: Vec<&String> = s["properties"].as_object().unwrap().keys().collect();
            let required: Vec<&str> = s["required"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap())
                .collect();
            assert_eq!(props.len(), required.len());
            for p in props {
                assert!(required.contains(&p.as_str()));
            }
        }
    }

    // ---- validate_output ---------------------------------------------------------------

    #[track_caller]
    fn violates(request: &TaskRequest, output: Value, contains: &str) {
        let err = validate_output(request, &output).expect_err(&format!("should refuse {output}"));
        assert!(
            err.0.contains(contains),
            "{:?} should contain {contains:?}",
            err.0
        );
    }

    #[test]
    fn generate_text_output() {
        let r = accepts(TaskKind::GenerateText, json!({ "prompt": "p" }));
        assert_eq!(
            validate_output(&r, &json!({ "text": "hi" })).unwrap(),
            json!({ "text": "hi" })
        );
        assert_eq!(
            validate_output(&r, &json!({ "text": "" })).unwrap(),
            json!({ "text": "" })
        );
        violates(
            &r,
            json!({ "text": "hi", "extra": 1 }),
            "unexpected field `extra`",
        );
        violates(&r, json!({}), "missing field `text`");
        violates(&r, json!({ "text": 1 }), "must be a string");
        violates(&r, json!("hi"), "must be a JSON object");
    }

    #[test]
    fn classify_output() {
        let r = accepts(
            TaskKind::Classify,
            classify(json!(["spam", { "name": "ham", "description": "fine" }])),
        );
        assert_eq!(
            validate_output(&r, &json!({ "label": "ham" })).unwrap(),
            json!({ "label": "ham" })
        );
        assert_eq!(
            validate_output(&r, &json!({ "label": "spam", "confidence": 0.25 })).unwrap(),
            json!({ "label": "spam", "confidence": 0.25 })
        );
        assert_eq!(
            validate_output(&r, &json!({ "label": "spam", "confidence": 1 })).unwrap(),
            json!({ "label": "spam", "confidence": 1 })
        );
        assert_eq!(
            validate_output(&r, &json!({ "label": "spam", "confidence": null })).unwrap(),
            json!({ "label": "spam" })
        );
        violates(
            &r,
            json!({ "label": "eggs" }),
            "label `eggs` is not one of the labels: `spam`, `ham`",
        );
        violates(&r, json!({ "label": "Spam" }), "not one of the labels");
        violates(&r, json!({ "label": 1 }), "label must be a string");
        violates(&r, json!({}), "label is missing");
        violates(
            &r,
            json!({ "label": "spam", "confidence": 1.5 }),
            "from 0 to 1",
        );
        violates(
            &r,
            json!({ "label": "spam", "confidence": -0.1 }),
            "from 0 to 1",
        );
        violates(
            &r,
            json!({ "label": "spam", "confidence": "high" }),
            "from 0 to 1",
        );
        violates(
            &r,
            json!({ "label": "spam", "reason": "x" }),
            "unexpected field `reason`",
        );
        violates(&r, json!(["spam"]), "must be a JSON object");
    }

    #[test]
    fn classify_many_output() {
        let r = many_request(&["a", "b", "c"], &["x", "y"]);
        let out = validate_output(
            &r,
            &json!({ "results": [
                { "id": "c", "label": "y" },
                { "id": "a", "label": "x" },
                { "id": "b", "label": "x" }
            ] }),
        )
        .unwrap();
        assert_eq!(
            out,
            json!({ "results": [
                { "id": "a", "label": "x" },
                { "id": "b", "label": "x" },
                { "id": "c", "label": "y" }
            ] })
        );
        // Missing id.
        violates(
            &r,
            json!({ "results": [{ "id": "a", "label": "x" }, { "id": "c", "label": "x" }] }),
            "missing results for 1 item id(s): `b`",
        );
        // Extra (unknown) id.
        violates(
            &r,
            json!({ "results": [
                { "id": "a", "label": "x" }, { "id": "b", "label": "x" },
                { "id": "c", "label": "x" }, { "id": "d", "label": "x" }
            ] }),
            "results[3].id `d` is not one of the item ids",
        );
        // Duplicate id.
        violates(
            &r,
            json!({ "results": [
                { "id": "a", "label": "x" }, { "id": "b", "label": "x" },
                { "id": "a", "label": "y" }, { "id": "c", "label": "x" }
            ] }),
            "results[2].id `a` appears more than once",
        );
        violates(
            &r,
            json!({ "results": [{ "id": "a", "label": "z" }] }),
            "results[0].label `z` is not one of the labels",
        );
        violates(
            &r,
            json!({ "results": [{ "id": "a" }] }),
            "results[0].label is missing",
        );
        violates(
            &r,
            json!({ "results": [{ "label": "x" }] }),
            "results[0] is missing field `id`",
        );
        violates(
            &r,
            json!({ "results": [{ "id": 1, "label": "x" }] }),
            "results[0].id must be a string",
        );
        violates(
            &r,
            json!({ "results": [{ "id": "a", "label": "x", "why": "" }] }),
            "unexpected field `why`",
        );
        violates(
            &r,
            json!({ "results": ["a"] }),
            "results[0] must be an object",
        );
        violates(&r, json!({ "results": {} }), "`results` must be an array");
        violates(
            &r,
            json!({ "results": [] }),
            "missing results for 3 item id(s): `a`, `b`, `c`",
        );
        violates(&r, json!({}), "missing field `results`");
        violates(
            &r,
            json!({ "results": [], "extra": [] }),
            "unexpected field `extra`",
        );
    }

    #[test]
    fn classify_many_lists_only_some_missing_ids() {
        let ids: Vec<String> = (0..25).map(|i| format!("id{i}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let r = many_request(&refs, &["x"]);
        violates(&r, json!({ "results": [] }), "(and 15 more)");
    }

    #[test]
    fn extract_data_output() {
        let r = accepts(TaskKind::ExtractData, extract(person_schema()));
        let good = json!({ "name": "Ada", "age": 36, "address": { "city": "London" } });
        assert_eq!(validate_output(&r, &good).unwrap(), good);
        violates(
            &r,
            json!({ "name": "Ada" }),
            "output does not match the schema",
        );
        violates(&r, json!({ "name": "Ada", "age": "old" }), "at /age");
        violates(
            &r,
            json!({ "name": "Ada", "age": 1, "address": { "city": 5 } }),
            "at /address/city",
        );
        let err = validate_output(&r, &json!({ "name": 1, "age": -1, "x": 1, "address": 3 }))
            .unwrap_err();
        assert!(err.0.ends_with("; and more"), "{}", err.0);
        assert_eq!(err.0.matches("; ").count(), MAX_REPORTED_SCHEMA_ERRORS);

        let any = accepts(TaskKind::ExtractData, extract(json!(true)));
        assert_eq!(
            validate_output(&any, &json!([1, "x"])).unwrap(),
            json!([1, "x"])
        );
        let none = accepts(TaskKind::ExtractData, extract(json!(false)));
        violates(&none, json!(null), "does not match");

        let dated = accepts(
            TaskKind::ExtractData,
            extract(json!({ "type": "string", "format": "date" })),
        );
        assert!(validate_output(&dated, &json!("2024-02-29")).is_ok());
        violates(&dated, json!("yesterday"), "does not match");
    }

    #[test]
    fn normalized_outputs_satisfy_published_schemas() {
        let cases = [
            (
                accepts(TaskKind::GenerateText, json!({ "prompt": "p" })),
                json!({ "text": "t" }),
            ),
            (
                accepts(TaskKind::Classify, classify(json!(["a"]))),
                json!({ "label": "a", "confidence": null }),
            ),
            (
                accepts(TaskKind::Classify, classify(json!(["a"]))),
                json!({ "label": "a", "confidence": 0.5 }),
            ),
            (
                many_request(&["1", "2"], &["a"]),
                json!({ "results": [{ "id": "2", "label": "a" }, { "id": "1", "label": "a" }] }),
            ),
            (
                accepts(TaskKind::ExtractData, extract(person_schema())),
                json!({ "name": "n", "age": 1 }),
            ),
        ];
        for (r, output) in cases {
            // Anything the per-request schema allows, validate_output accepts…
            assert!(schema_valid(&r.output_schema(), &output), "{output}");
            let normalized = validate_output(&r, &output).unwrap();
            // …and the normalized result satisfies both schemas.
            assert!(
                schema_valid(&output_schema(r.kind()), &normalized),
                "{normalized}"
            );
            assert!(
                schema_valid(&r.output_schema(), &normalized) || r.kind() == TaskKind::Classify
            );
        }
    }

    #[test]
    fn messages_clip_long_model_text() {
        let r = accepts(TaskKind::Classify, classify(json!(["a"])));
        let err = validate_output(&r, &json!({ "label": "z".repeat(10_000) })).unwrap_err();
        assert!(err.0.len() < 400, "{}", err.0);
        assert_eq!(clip_to("héllo", 2), "hé…");
        assert_eq!(clip_to("hé", 2), "hé");
    }

    // ---- properties --------------------------------------------------------------------

    fn arb_json() -> impl Strategy<Value = Value> {
        let key = prop_oneof![
            Just("messages".to_owned()),
            Just("prompt".to_owned()),
            Just("system".to_owned()),
            Just("temperature".to_owned()),
            Just("max_output_tokens".to_owned()),
            Just("role".to_owned()),
            Just("content".to_owned()),
            Just("input".to_owned()),
            Just("labels".to_owned()),
            Just("name".to_owned()),
            Just("description".to_owned()),
            Just("items".to_owned()),
            Just("id".to_owned()),
            Just("instructions".to_owned()),
            Just("schema".to_owned()),
            Just("type".to_owned()),
            Just("$ref".to_owned()),
            Just("$schema".to_owned()),
            Just("properties".to_owned()),
            Just("pattern".to_owned()),
            "[a-z$]{0,6}",
        ];
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            prop_oneof![
                Just("user".to_owned()),
                Just("assistant".to_owned()),
                Just("string".to_owned()),
                Just("object".to_owned()),
                Just("#".to_owned()),
                Just("#/$defs/a".to_owned()),
                Just("https://x.test/s".to_owned()),
                Just("https://json-schema.org/draft/2020-12/schema".to_owned()),
                Just("(".to_owned()),
                ".{0,8}",
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((key.clone(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn arb_label() -> impl Strategy<Value = Value> {
        prop_oneof![
            "[ab ]{0,2}".prop_map(Value::String),
            ("[ab ]{0,2}", proptest::option::of("[a-z]{0,4}")).prop_map(|(name, description)| {
                match description {
                    Some(d) => json!({ "name": name, "description": d }),
                    None => json!({ "name": name }),
                }
            }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn parse_never_panics_and_normalizes_idempotently(value in arb_json()) {
            for kind in TaskKind::ALL {
                if let Ok(r) = TaskRequest::parse(kind, &value) {
                    let again = TaskRequest::parse(kind, &r.to_value()).expect("normalized request parses");
                    prop_assert_eq!(&again, &r);
                    prop_assert_eq!(again.to_value(), r.to_value());
                    let _ = r.output_schema();
                }
            }
        }

        #[test]
        fn classify_many_rules_hold(
            ids in prop::collection::vec("[ab]{0,2}", 0..5),
            labels in prop::collection::vec(arb_label(), 0..4),
            picks in prop::collection::vec(any::<prop::sample::Index>(), 5),
        ) {
            let value = json!({ "items": items(&ids.iter().map(String::as_str).collect::<Vec<_>>()), "labels": labels });
            match TaskRequest::parse(TaskKind::ClassifyMany, &value) {
                Ok(r) => {
                    let TaskRequest::ClassifyMany(m) = &r else { panic!() };
                    let mut seen_ids = std::collections::HashSet::new();
                    prop_assert!(!m.items.is_empty());
                    prop_assert!(m.items.iter().all(|i| !i.id.is_empty() && seen_ids.insert(i.id.clone())));
                    let mut seen_labels = std::collections::HashSet::new();
                    prop_assert!(!m.labels.is_empty());
                    prop_assert!(m.labels.iter().all(|l| !l.name().trim().is_empty() && seen_labels.insert(l.name().to_owned())));
                    prop_assert_eq!(r.to_value(), value);
                    // A complete answer, in reverse order, is accepted and put in item order.
                    let answer: Vec<Value> = m.items.iter().rev().zip(&picks).map(|(item, pick)| {
                        json!({ "id": item.id, "label": pick.get(&m.labels).name() })
                    }).collect();
                    let normalized = validate_output(&r, &json!({ "results": answer })).unwrap();
                    let ids_out: Vec<&str> = normalized["results"].as_array().unwrap().iter().map(|v| v["id"].as_str().unwrap()).collect();
                    let ids_in: Vec<&str> = m.items.iter().map(|i| i.id.as_str()).collect();
                    prop_assert_eq!(ids_out, ids_in);
                    // Dropping one result is refused.
                    let partial = json!({ "results": answer[1..] });
                    prop_assert!(validate_output(&r, &partial).is_err());
                }
                Err(e) => prop_assert!(field_of(&e).starts_with("request")),
            }
        }

        #[test]
        fn extract_data_schema_never_panics(schema in arb_json()) {
            let value = json!({ "input": "x", "schema": schema });
            if let Ok(r) = TaskRequest::parse(TaskKind::ExtractData, &value) {
                let _ = validate_output(&r, &json!({ "a": 1 }));
            }
        }

        #[test]
        fn validate_output_never_panics(output in arb_json()) {
            let requests = [
                accepts(TaskKind::GenerateText, json!({ "prompt": "p" })),
                accepts(TaskKind::Classify, classify(json!(["user", "assistant"]))),
                many_request(&["id", "name"], &["user", "string"]),
                accepts(TaskKind::ExtractData, extract(person_schema())),
            ];
            for r in &requests {
                if let Ok(normalized) = validate_output(r, &output) {
                    prop_assert_eq!(validate_output(r, &normalized), Ok(normalized.clone()));
                }
            }
        }
    }
}
