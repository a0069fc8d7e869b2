//! `extract_data`: its request type and parsing, and the checks on a caller's JSON Schema.
//! A caller's schema is checked without ever fetching anything: every `$ref` must be
//! local (start with `#`), every `$schema` must name a bundled draft, and the compiler runs
//! with a retriever that refuses all retrieval.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::messages::{clip, clip_long, describe};
use super::parse::{ROOT, object, optional, parse_messages, required};
use super::sampling::with_sampling_fields;
use super::{ChatMessage, Sampling};
use crate::error::InvalidInput;

/// The fields of an `extract_data` request besides the sampling fields.
const EXTRACT_DATA_FIELDS: [&str; 4] = ["input", "messages", "schema", "instructions"];

/// An `extract_data` request: a JSON value valid against `schema`, drawn from `input`
/// or answering a chat (`messages`, exactly one of the two).
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
    /// Its validation cost is capped at submit: see
    /// [`check_schema_cost`](super::check_schema_cost).
    pub schema: Value,
    /// Extra instructions for the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
    /// The sampling fields (flattened into the request object).
    #[serde(flatten)]
    pub sampling: Sampling,
}

pub(super) fn parse_extract_data(value: &Value) -> Result<ExtractDataRequest, InvalidInput> {
    let map = object(value, ROOT, &with_sampling_fields(&EXTRACT_DATA_FIELDS))?;
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
        sampling: Sampling::read(map)?,
    };
    request.sampling.check()?;
    Ok(request)
}

/// A retriever that refuses everything: a tenant's schema never makes the server fetch.
pub(super) struct NoRetrieval;

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
pub(super) fn compile_schema(
    schema: &Value,
) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    jsonschema::options()
        .with_retriever(NoRetrieval)
        .should_validate_formats(true)
        .build(schema)
}

/// Checks a caller's schema: shape, references (before anything else looks at it), its
/// meta-schema, and that it compiles.
pub(super) fn check_schema(schema: &Value, path: &str) -> Result<(), InvalidInput> {
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

pub(super) fn escape_pointer(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

pub(super) fn at_pointer(pointer: &str) -> String {
    if pointer.is_empty() {
        "at the root".to_owned()
    } else {
        format!("at {}", clip(pointer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::test_support::*;
    use crate::kinds::{TaskKind, TaskRequest, validate_output};
    use proptest::prelude::*;
    use serde_json::json;

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
    fn no_retrieval_refuses() {
        use jsonschema::Retrieve;
        let uri = jsonschema::uri::from_str("https://example.com/a.json").unwrap();
        assert!(NoRetrieval.retrieve(&uri).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn extract_data_schema_never_panics(schema in arb_json()) {
            let value = json!({ "input": "x", "schema": schema });
            if let Ok(r) = TaskRequest::parse(TaskKind::ExtractData, &value) {
                let _ = validate_output(&r, &json!({ "a": 1 }));
            }
        }
    }
}
