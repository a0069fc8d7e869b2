//! `classify_many`: its request types and parsing.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::labels::{Label, parse_labels};
use super::messages::clip;
use super::parse::{ROOT, list, object, optional, required};
use super::{MAX_ITEM_ID_BYTES, MAX_ITEMS};
use crate::error::InvalidInput;

const CLASSIFY_MANY_FIELDS: [&str; 3] = ["items", "labels", "instructions"];

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

pub(super) fn parse_classify_many(value: &Value) -> Result<ClassifyManyRequest, InvalidInput> {
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

#[cfg(test)]
mod tests {
    use crate::kinds::test_support::*;
    use crate::kinds::{MAX_ITEM_ID_BYTES, MAX_ITEMS, TaskKind, TaskRequest, validate_output};
    use proptest::prelude::*;
    use serde_json::{Value, json};

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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

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
    }
}
