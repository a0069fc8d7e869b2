use super::*;
use crate::kinds::TaskKind;
use serde_json::json;

fn extract(schema: Value) -> TaskRequest {
    TaskRequest::parse(
        TaskKind::ExtractData,
        &json!({"input": "x", "schema": schema}),
    )
    .unwrap()
}

fn refused(schema: Value, limit: usize) -> String {
    match check_output_fits(&extract(schema.clone()), limit) {
        Err(InvalidInput::Field { field, reason }) => {
            assert_eq!(field, "request.schema");
            reason
        }
        other => panic!("{schema} was not refused: {other:?}"),
    }
}

fn fits(schema: Value, limit: usize) {
    let request = extract(schema.clone());
    assert!(
        check_output_fits(&request, limit).is_ok(),
        "{schema} was refused: {:?}",
        check_output_fits(&request, limit)
    );
}

#[test]
fn huge_minimums_are_refused_naming_the_keyword() {
    let m = 1 << 20;
    let reason = refused(json!({"type": "string", "minLength": 2_000_000_000u64}), m);
    assert!(reason.contains("`minLength` 2000000000 at /"), "{reason}");
    assert!(reason.contains("max_output_bytes"), "{reason}");
    let reason = refused(json!({"type": "array", "minItems": 100_000_000}), m);
    assert!(reason.contains("`minItems` 100000000"), "{reason}");
    let reason = refused(json!({"type": "object", "minProperties": 1_000_000}), m);
    assert!(reason.contains("`minProperties` 1000000"), "{reason}");
    // Nested, and through a reference.
    let reason = refused(
        json!({"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/$defs/big"}},
                   "$defs": {"big": {"type": "string", "minLength": 5_000_000}}}),
        m,
    );
    assert!(
        reason.contains("`minLength` 5000000 at /$defs/big"),
        "{reason}"
    );
}

#[test]
fn arrays_of_arrays_multiply() {
    // 1,000 × 1,000 empty strings: each alone is small, together 3 MB.
    let schema = json!({"type": "array", "minItems": 1000,
            "items": {"type": "array", "minItems": 1000, "items": {"type": "string"}}});
    let reason = refused(schema.clone(), 1 << 20);
    assert!(
        reason.contains("`minItems` 1000 at / × `minItems` 1000 at /items"),
        "{reason}"
    );
    fits(schema, 4 << 20);
    // Saturates instead of overflowing.
    let deep = json!({"type": "array", "minItems": u32::MAX,
            "items": {"type": "array", "minItems": u32::MAX,
                "items": {"type": "array", "minItems": u32::MAX}}});
    refused(deep, usize::MAX >> 1);
}

#[test]
fn only_what_every_valid_value_needs_counts() {
    let m = 1000;
    // Without a type, minLength does not force a string: `0` is valid.
    fits(json!({"minLength": 2_000_000_000u64}), m);
    // One small option is enough.
    fits(
        json!({"anyOf": [{"type": "string", "minLength": 1_000_000}, {"type": "null"}]}),
        m,
    );
    fits(
        json!({"type": ["string", "null"], "minLength": 1_000_000}),
        m,
    );
    // Optional properties cost nothing.
    fits(
        json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 1_000_000}}}),
        m,
    );
    // Unsatisfiable schemas are not a size question.
    fits(
        json!({"type": "array", "minItems": 1_000_000, "items": false}),
        m,
    );
    // Draft 7 ignores keywords beside `$ref`.
    fits(
        json!({"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/a",
                   "minLength": 1_000_000, "type": "string", "definitions": {"a": {"type": "string"}}}),
        m,
    );
    // Recursion terminates.
    fits(
        json!({"type": "object", "properties": {"next": {"$ref": "#"}}}),
        m,
    );
    // allOf takes the largest part; anyOf every option large is refused.
    refused(
        json!({"allOf": [{"type": "string"}, {"minLength": 5000, "type": "string"}]}),
        m,
    );
    refused(
        json!({"anyOf": [{"type": "string", "minLength": 5000}, {"type": "array", "minItems": 5000}]}),
        m,
    );
    // Exactly at the limit fits: `"xxxxxxxx"` is 10 bytes.
    fits(json!({"type": "string", "minLength": 8}), 10);
    refused(json!({"type": "string", "minLength": 9}), 10);
}

#[test]
fn every_kind_has_a_floor() {
    let text = TaskRequest::parse(TaskKind::GenerateText, &json!({"prompt": "hi"})).unwrap();
    assert!(check_output_fits(&text, 11).is_ok());
    assert!(check_output_fits(&text, 10).is_err());
    let classify = TaskRequest::parse(
        TaskKind::Classify,
        &json!({"input": "x", "labels": ["spam", "ham"]}),
    )
    .unwrap();
    // {"label":"ham"}
    assert!(check_output_fits(&classify, 15).is_ok());
    assert!(check_output_fits(&classify, 14).is_err());
    let items: Vec<Value> = (0..10)
        .map(|i| json!({"id": format!("i{i}"), "input": "x"}))
        .collect();
    let many = TaskRequest::parse(
        TaskKind::ClassifyMany,
        &json!({"items": items, "labels": ["a", "bb"]}),
    )
    .unwrap();
    let smallest = json!({"results": (0..10).map(|i| json!({"id": format!("i{i}"), "label": "a"})).collect::<Vec<_>>()});
    let exact = serde_json::to_string(&smallest).unwrap().len();
    assert!(check_output_fits(&many, exact).is_ok());
    match check_output_fits(&many, exact - 1) {
        Err(InvalidInput::Field { field, .. }) => assert_eq!(field, "request.items"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn output_size_is_the_stored_json_and_stops_at_the_limit() {
    let v = json!({"a": "xyz", "b": [1, 2]});
    let exact = serde_json::to_string(&v).unwrap().len();
    assert_eq!(check_output_size(&v, exact), Ok(exact));
    assert_eq!(
        check_output_size(&v, exact - 1),
        Err(OutputTooLarge { limit: exact - 1 })
    );
}
