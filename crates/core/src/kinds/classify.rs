//! `classify`: its request type and parsing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::labels::{Label, parse_labels};
use super::parse::{ROOT, de, object, optional, required};
use crate::error::InvalidInput;

const CLASSIFY_FIELDS: [&str; 3] = ["input", "labels", "instructions"];

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

pub(super) fn parse_classify(value: &Value) -> Result<ClassifyRequest, InvalidInput> {
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
