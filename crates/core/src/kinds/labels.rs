//! Classification labels (`classify`, `classify_many`): the type, its two JSON forms, and
//! the rules every label list follows.

use std::collections::HashMap;
use std::fmt;

use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

use super::messages::clip;
use super::parse::{ROOT, list, required};
use super::{MAX_LABEL_BYTES, MAX_LABELS};
use crate::error::InvalidInput;

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

pub(super) fn parse_labels(map: &Map<String, Value>) -> Result<Vec<Label>, InvalidInput> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::test_support::*;
    use crate::kinds::{TaskKind, TaskRequest};
    use serde_json::json;

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
}
