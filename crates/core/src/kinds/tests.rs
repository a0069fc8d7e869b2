use super::*;
use crate::kinds::test_support::*;
use proptest::prelude::*;

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
            TaskKind::Chat => TaskRequest::Chat(serde_json::from_value(r.to_value()).unwrap()),
            TaskKind::Embed => TaskRequest::Embed(serde_json::from_value(r.to_value()).unwrap()),
        };
        assert_eq!(back, r);
        assert_eq!(r.to_value(), value);
    }
    // The derived impls refuse unknown fields too.
    assert!(
        serde_json::from_value::<ClassifyRequest>(json!({ "input": "x", "labels": ["a"], "z": 1 }))
            .is_err()
    );
    assert!(
        serde_json::from_value::<GenerateTextRequest>(json!({ "prompt": "x", "z": 1 })).is_err()
    );
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
}
