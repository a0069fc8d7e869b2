//! Helpers shared by the kinds' unit tests.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{TaskKind, TaskRequest, validate_output};
use crate::error::InvalidInput;

pub(super) fn field_of(err: &InvalidInput) -> &str {
    match err {
        InvalidInput::Field { field, .. } => field,
        other => panic!("expected a field error, got {other:?}"),
    }
}

pub(super) fn reason_of(err: &InvalidInput) -> &str {
    match err {
        InvalidInput::Field { reason, .. } => reason,
        other => panic!("expected a field error, got {other:?}"),
    }
}

#[track_caller]
pub(super) fn rejects(kind: TaskKind, value: Value, field: &str, reason_contains: &str) {
    let err = TaskRequest::parse(kind, &value).expect_err(&format!("{kind} should reject {value}"));
    assert_eq!(field_of(&err), field, "{err}");
    assert!(
        reason_of(&err).contains(reason_contains),
        "reason {:?} should contain {reason_contains:?}",
        reason_of(&err)
    );
    assert_eq!(err.code(), crate::error::ErrorCode::InvalidRequest);
}

#[track_caller]
pub(super) fn accepts(kind: TaskKind, value: Value) -> TaskRequest {
    match TaskRequest::parse(kind, &value) {
        Ok(r) => r,
        Err(e) => panic!("{kind} should accept {value}: {e}"),
    }
}

pub(super) fn classify(labels: Value) -> Value {
    json!({ "input": "hello", "labels": labels })
}

pub(super) fn classify_many(items: Value) -> Value {
    json!({ "items": items, "labels": ["a", "b"] })
}

pub(super) fn extract(schema: Value) -> Value {
    json!({ "input": "Ada, 36", "schema": schema })
}

pub(super) fn items(ids: &[&str]) -> Value {
    Value::Array(
        ids.iter()
            .map(|id| json!({ "id": id, "input": "x" }))
            .collect(),
    )
}

pub(super) fn many_request(ids: &[&str], labels: &[&str]) -> TaskRequest {
    accepts(
        TaskKind::ClassifyMany,
        json!({ "items": items(ids), "labels": labels }),
    )
}

pub(super) fn schema_valid(schema: &Value, instance: &Value) -> bool {
    jsonschema::validator_for(schema)
        .expect("published schema compiles")
        .is_valid(instance)
}

pub(super) fn person_schema() -> Value {
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

#[track_caller]
pub(super) fn violates(request: &TaskRequest, output: Value, contains: &str) {
    let err = validate_output(request, &output).expect_err(&format!("should refuse {output}"));
    assert!(
        err.0.contains(contains),
        "{:?} should contain {contains:?}",
        err.0
    );
}

pub(super) fn arb_json() -> impl Strategy<Value = Value> {
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

pub(super) fn arb_label() -> impl Strategy<Value = Value> {
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
