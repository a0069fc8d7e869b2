//! Validation of model outputs against a request's contract (docs/conformance.md#task-kinds).

use std::collections::HashMap;

use serde_json::{Map, Value, json};

use super::TaskRequest;
use super::classify_many::ClassifyManyRequest;
use super::extract_data::{at_pointer, compile_schema};
use super::labels::Label;
use super::messages::{clip, clip_long, describe, excerpt, list_quoted};
use crate::error::OutputViolation;

/// How many schema errors `validate_output` reports for `extract_data`.
const MAX_REPORTED_SCHEMA_ERRORS: usize = 3;

/// Validates a model output against the request's contract (docs/conformance.md#task-kinds) and returns the
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
        TaskRequest::Embed(r) => super::embed::validate_embed(r, output),
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
        TaskRequest::Chat(r) => super::chat_output::validate_chat(r, output),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::TaskKind;
    use crate::kinds::messages::clip_to;
    use crate::kinds::output_schema;
    use crate::kinds::test_support::*;
    use proptest::prelude::*;

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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

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
