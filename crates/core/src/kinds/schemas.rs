//! The published JSON Schemas (draft 2020-12) of every kind's request and output.

use serde_json::{Value, json};

use super::sampling::with_sampling_schemas;
use super::{
    MAX_EMBED_DIMENSIONS, MAX_EMBED_INPUT_BYTES, MAX_EMBED_INPUTS, MAX_ITEM_ID_BYTES, MAX_ITEMS,
    MAX_LABEL_BYTES, MAX_LABELS, TaskKind,
};

/// The dialect of every JSON Schema this module publishes.
const SCHEMA_DIALECT: &str = "https://json-schema.org/draft/2020-12/schema";

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

fn instructions_schema() -> Value {
    json!({ "type": ["string", "null"], "description": "Extra instructions for the model." })
}

/// The generic published JSON Schema (draft 2020-12) of a kind's request object (the value
/// under "request", without "kind"). Rules JSON Schema cannot express (unique label names
/// and item ids, sizes in bytes) are stated in descriptions and enforced by
/// [`TaskRequest::parse`](super::TaskRequest::parse).
pub fn request_schema(kind: TaskKind) -> Value {
    match kind {
        TaskKind::GenerateText => with_sampling_schemas(json!({
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
                "system": { "type": ["string", "null"], "description": "A system prompt." }
            },
            "additionalProperties": false,
            "oneOf": [
                { "required": ["messages"], "properties": { "messages": { "type": "array" } } },
                { "required": ["prompt"], "properties": { "prompt": { "type": "string" } } }
            ],
            "$defs": { "chat_message": chat_message_schema() }
        })),
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
        TaskKind::ExtractData => with_sampling_schemas(json!({
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
                }
            },
            "required": ["schema"],
            "additionalProperties": false,
            "oneOf": [
                { "required": ["input"], "properties": { "input": { "type": "string" } } },
                { "required": ["messages"], "properties": { "messages": { "type": "array" } } }
            ],
            "$defs": { "chat_message": chat_message_schema() }
        })),
        TaskKind::Chat => super::chat_schema::chat_request_schema(SCHEMA_DIALECT),
        TaskKind::Embed => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "embed request",
            "type": "object",
            "properties": {
                "input": {
                    "description": format!(
                        "One text, or up to {MAX_EMBED_INPUTS} items: each a text or \
                         `{{text, id?, revision?}}` (its source and revision key its cache \
                         entry). Every text is non-blank and at most \
                         {MAX_EMBED_INPUT_BYTES} UTF-8 bytes."
                    ),
                    "oneOf": [
                        { "type": "string", "minLength": 1 },
                        {
                            "type": "array",
                            "minItems": 1,
                            "maxItems": MAX_EMBED_INPUTS,
                            "items": {
                                "oneOf": [
                                    { "type": "string", "minLength": 1 },
                                    { "$ref": "#/$defs/embed_item" }
                                ]
                            }
                        }
                    ]
                },
                "dimensions": {
                    "type": ["integer", "null"],
                    "minimum": 1,
                    "maximum": MAX_EMBED_DIMENSIONS,
                    "description": "The vectors' dimension, for models that can shorten them."
                }
            },
            "required": ["input"],
            "additionalProperties": false,
            "$defs": {
                "embed_item": {
                    "description": "A text with the source it comes from: its cache entry is \
                                    keyed by `id` and `revision` too.",
                    "type": "object",
                    "properties": {
                        "text": { "type": "string", "minLength": 1 },
                        "id": { "type": ["string", "null"], "minLength": 1, "maxLength": 256 },
                        "revision": { "type": ["string", "null"], "minLength": 1, "maxLength": 256 }
                    },
                    "required": ["text"],
                    "additionalProperties": false
                }
            }
        }),
    }
}

/// The generic published JSON Schema (draft 2020-12) of a kind's output. The schema of one
/// request's output is narrower: see [`TaskRequest::output_schema`](super::TaskRequest::output_schema).
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
        TaskKind::Chat => super::chat_schema::chat_output_schema_published(SCHEMA_DIALECT),
        TaskKind::Embed => json!({
            "$schema": SCHEMA_DIALECT,
            "title": "embed output",
            "type": "object",
            "properties": {
                "embeddings": {
                    "type": "array",
                    "description": "One vector per input item, in the items' order.",
                    "items": { "type": "array", "items": { "type": "number" } }
                },
                "dimensions": { "type": "integer", "minimum": 1, "description": "Every vector's length." }
            },
            "required": ["embeddings", "dimensions"],
            "additionalProperties": false
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::TaskRequest;
    use crate::kinds::test_support::*;

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
            (TaskKind::Embed, json!({ "input": "x" })),
            (
                TaskKind::Embed,
                json!({ "input": ["x", { "text": "y", "id": "d", "revision": "v1" }], "dimensions": 8 }),
            ),
            (TaskKind::Embed, json!({ "input": [] })),
            (TaskKind::Embed, json!({ "input": "" })),
            (TaskKind::Embed, json!({ "input": [{ "id": "d" }] })),
            (TaskKind::Embed, json!({ "input": "x", "dimensions": 0 })),
            (TaskKind::Embed, json!({ "input": "x", "extra": 1 })),
            (TaskKind::Embed, json!({ "input": 3 })),
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
}
