//! `embed`: its request type, parsing, output validation and the per-item cache key
//! (docs/conformance.md#task-kinds, docs/api.md "Embeddings").
//!
//! A request is one text or a list of up to [`MAX_EMBED_INPUTS`] items, each a text or
//! `{text, id?, revision?}` (the item's source and revision, which key its cache entry);
//! a string `input` is normalized to a list of one. The output is one vector per item, in
//! input order, all of one dimension: `{"embeddings": [[f32, …], …], "dimensions": n}`.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::messages::describe;
use super::parse::{ROOT, de, object, optional, required};
use crate::canonical::hash_value;
use crate::error::{InvalidInput, OutputViolation};

const EMBED_FIELDS: [&str; 2] = ["input", "dimensions"];
const ITEM_FIELDS: [&str; 3] = ["text", "id", "revision"];

/// Most items an `embed` request may have (OpenAI's limit per call).
pub const MAX_EMBED_INPUTS: usize = 2048;
/// Longest item text, in UTF-8 bytes (about 8,192 tokens of English text; the model's
/// own per-input token limit still applies at the provider).
pub const MAX_EMBED_INPUT_BYTES: usize = 32 * 1024;
/// Largest `dimensions` a request may ask for.
pub const MAX_EMBED_DIMENSIONS: u32 = 16_384;
/// Longest item `id` or `revision`, in UTF-8 bytes.
pub const MAX_EMBED_SOURCE_BYTES: usize = 256;

/// An `embed` request: the texts to embed, and optionally the vectors' dimension.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedRequest {
    /// The items, in order (1..=[`MAX_EMBED_INPUTS`]).
    pub input: Vec<EmbedInput>,
    /// The vectors' dimension, for models that can shorten them (`text-embedding-3-*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dimensions: Option<u32>,
}

/// One item to embed: a text, or a text with its source and revision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EmbedInput {
    /// Just the text.
    Text(String),
    /// The text with the source it comes from.
    Item(EmbedItem),
}

/// An item with its source: its cache entry is keyed by `id` and `revision` too, so a new
/// revision is new work and an unchanged one costs nothing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmbedItem {
    /// The text.
    pub text: String,
    /// The source the text comes from (a document id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The source's revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

impl EmbedInput {
    /// The text to embed.
    pub fn text(&self) -> &str {
        match self {
            EmbedInput::Text(t) => t,
            EmbedInput::Item(i) => &i.text,
        }
    }
}

impl EmbedRequest {
    /// The texts, in order.
    pub fn texts(&self) -> Vec<&str> {
        self.input.iter().map(EmbedInput::text).collect()
    }
}

pub(super) fn parse_embed(value: &Value) -> Result<EmbedRequest, InvalidInput> {
    let map = object(value, ROOT, &EMBED_FIELDS)?;
    let (input, path) = required(map, "input", ROOT)?;
    let input = match input {
        Value::String(_) => vec![parse_item(input, &path)?],
        Value::Array(items) => {
            if items.is_empty() {
                return Err(InvalidInput::field(&path, "must contain at least one item"));
            }
            if items.len() > MAX_EMBED_INPUTS {
                return Err(InvalidInput::field(
                    &path,
                    format!(
                        "has {} items, over the limit of {MAX_EMBED_INPUTS}",
                        items.len()
                    ),
                ));
            }
            items
                .iter()
                .enumerate()
                .map(|(i, v)| parse_item(v, &format!("{path}[{i}]")))
                .collect::<Result<_, _>>()?
        }
        other => {
            return Err(InvalidInput::field(
                &path,
                format!(
                    "must be a string or an array of items, not {}",
                    describe(other)
                ),
            ));
        }
    };
    let dimensions: Option<u32> = optional(map, "dimensions", ROOT)?;
    if let Some(d) = dimensions
        && !(1..=MAX_EMBED_DIMENSIONS).contains(&d)
    {
        return Err(InvalidInput::field(
            "request.dimensions",
            format!("must be from 1 to {MAX_EMBED_DIMENSIONS}"),
        ));
    }
    Ok(EmbedRequest { input, dimensions })
}

fn parse_item(value: &Value, path: &str) -> Result<EmbedInput, InvalidInput> {
    let item = match value {
        Value::String(text) => EmbedInput::Text(text.clone()),
        Value::Object(_) => {
            let map = object(value, path, &ITEM_FIELDS)?;
            let (text, text_path) = required(map, "text", path)?;
            let item = EmbedItem {
                text: de(text, &text_path)?,
                id: optional(map, "id", path)?,
                revision: optional(map, "revision", path)?,
            };
            for (field, v) in [("id", &item.id), ("revision", &item.revision)] {
                if let Some(v) = v
                    && (v.is_empty() || v.len() > MAX_EMBED_SOURCE_BYTES)
                {
                    return Err(InvalidInput::field(
                        format!("{path}.{field}"),
                        format!("must be 1 to {MAX_EMBED_SOURCE_BYTES} UTF-8 bytes"),
                    ));
                }
            }
            EmbedInput::Item(item)
        }
        other => {
            return Err(InvalidInput::field(
                path,
                format!(
                    "must be a text or an object {{text, id?, revision?}}, not {}",
                    describe(other)
                ),
            ));
        }
    };
    let text = item.text();
    if text.trim().is_empty() {
        return Err(InvalidInput::field(path, "the text must not be empty"));
    }
    if text.len() > MAX_EMBED_INPUT_BYTES {
        return Err(InvalidInput::field(
            path,
            format!(
                "the text has {} UTF-8 bytes, over the limit of {MAX_EMBED_INPUT_BYTES}",
                text.len()
            ),
        ));
    }
    Ok(item)
}

/// The output schema of an `embed` request of `n` items.
pub(super) fn embed_output_schema(r: &EmbedRequest) -> Value {
    let mut vector = json!({ "type": "array", "items": { "type": "number" }, "minItems": 1 });
    if let Some(d) = r.dimensions {
        vector["minItems"] = json!(d);
        vector["maxItems"] = json!(d);
    }
    json!({
        "type": "object",
        "properties": {
            "embeddings": {
                "type": "array",
                "minItems": r.input.len(),
                "maxItems": r.input.len(),
                "items": vector
            },
            "dimensions": { "type": "integer", "minimum": 1 }
        },
        "required": ["embeddings", "dimensions"],
        "additionalProperties": false
    })
}

/// Checks an `embed` output: one vector per item, every one of the same dimension (the
/// requested one when given), every number finite. Normalized to `{embeddings,
/// dimensions}`.
pub(super) fn validate_embed(r: &EmbedRequest, output: &Value) -> Result<Value, OutputViolation> {
    let bad = |m: String| OutputViolation(m);
    let Value::Object(map) = output else {
        return Err(bad(format!(
            "the output must be an object, not {}",
            describe(output)
        )));
    };
    if let Some(k) = map
        .keys()
        .find(|k| *k != "embeddings" && *k != "dimensions")
    {
        return Err(bad(format!("unknown field `{k}`")));
    }
    let Some(Value::Array(vectors)) = map.get("embeddings") else {
        return Err(bad("`embeddings` must be an array of vectors".into()));
    };
    if vectors.len() != r.input.len() {
        return Err(bad(format!(
            "{} vectors for {} inputs",
            vectors.len(),
            r.input.len()
        )));
    }
    let mut dimension: Option<usize> = None;
    for (i, v) in vectors.iter().enumerate() {
        let Value::Array(numbers) = v else {
            return Err(bad(format!(
                "`embeddings[{i}]` must be an array of numbers"
            )));
        };
        if numbers.is_empty()
            || !numbers
                .iter()
                .all(|n| n.as_f64().is_some_and(f64::is_finite))
        {
            return Err(bad(format!(
                "`embeddings[{i}]` must be a non-empty array of finite numbers"
            )));
        }
        match dimension {
            None => dimension = Some(numbers.len()),
            Some(d) if d != numbers.len() => {
                return Err(bad(format!(
                    "`embeddings[{i}]` has {} dimensions, the first vector {d}",
                    numbers.len()
                )));
            }
            Some(_) => {}
        }
    }
    let dimension = dimension.unwrap_or(0);
    if let Some(asked) = r.dimensions
        && asked as usize != dimension
    {
        return Err(bad(format!(
            "the vectors have {dimension} dimensions, {asked} were asked for"
        )));
    }
    if let Some(stated) = map.get("dimensions")
        && stated.as_u64() != Some(dimension as u64)
    {
        return Err(bad(format!(
            "`dimensions` says {stated}, the vectors have {dimension}"
        )));
    }
    Ok(json!({ "embeddings": vectors, "dimensions": dimension }))
}

/// docs/api.md "Embeddings": the cache key of one item — a hash of its text, its source
/// and revision when given, the asked `dimensions`, the configuration hash of the
/// deployment that embeds it (another model's vectors are not interchangeable) and the
/// subject. Entries are looked up within one app and scope only.
pub fn embed_item_key(
    item: &EmbedInput,
    dimensions: Option<u32>,
    deployment_config_hash: &str,
    subject: Option<&crate::Subject>,
) -> String {
    let (id, revision) = match item {
        EmbedInput::Text(_) => (None, None),
        EmbedInput::Item(i) => (i.id.as_deref(), i.revision.as_deref()),
    };
    let value = json!({
        "text": item.text(),
        "id": id,
        "revision": revision,
        "dimensions": dimensions,
        "model_config_hash": deployment_config_hash,
        "subject": subject,
    });
    // Plain strings and small integers: hashing cannot fail.
    hash_value(&value).unwrap_or_else(|_| crate::canonical::sha256_hex(item.text().as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::test_support::*;
    use crate::kinds::{TaskKind, TaskRequest};

    fn embed(r: &TaskRequest) -> &EmbedRequest {
        match r {
            TaskRequest::Embed(e) => e,
            other => panic!("not an embed: {other:?}"),
        }
    }

    #[test]
    fn a_string_is_a_list_of_one() {
        let r = accepts(TaskKind::Embed, json!({ "input": "hello" }));
        assert_eq!(r.to_value(), json!({ "input": ["hello"] }));
        assert_eq!(embed(&r).texts(), vec!["hello"]);
    }

    #[test]
    fn items_keep_their_form_and_source() {
        let value = json!({
            "input": ["a", { "text": "b", "id": "doc-1", "revision": "v2" }, { "text": "c" }],
            "dimensions": 64
        });
        let r = accepts(TaskKind::Embed, value.clone());
        assert_eq!(r.to_value(), value);
        assert_eq!(embed(&r).texts(), vec!["a", "b", "c"]);
        assert_eq!(embed(&r).dimensions, Some(64));
    }

    #[test]
    fn bad_input_is_refused_with_its_path() {
        rejects(
            TaskKind::Embed,
            json!({}),
            "request",
            "missing field `input`",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": [] }),
            "request.input",
            "at least one item",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": 7 }),
            "request.input",
            "must be a string or an array",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": ["a", 3] }),
            "request.input[1]",
            "must be a text or an object",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": ["a", " "] }),
            "request.input[1]",
            "must not be empty",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": [{ "text": "a", "page": 1 }] }),
            "request.input[0]",
            "unknown field `page`",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": [{ "id": "x" }] }),
            "request.input[0]",
            "missing field `text`",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": [{ "text": "a", "revision": "" }] }),
            "request.input[0].revision",
            "1 to 256",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": "a", "dimensions": 0 }),
            "request.dimensions",
            "must be from 1",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": "a", "dimensions": "big" }),
            "request.dimensions",
            "invalid type",
        );
        rejects(
            TaskKind::Embed,
            json!({ "input": "a", "model": "m" }),
            "request",
            "unknown field `model`",
        );
        let many: Vec<String> = (0..=MAX_EMBED_INPUTS).map(|i| i.to_string()).collect();
        rejects(
            TaskKind::Embed,
            json!({ "input": many }),
            "request.input",
            "over the limit of 2048",
        );
        let long = "x".repeat(MAX_EMBED_INPUT_BYTES + 1);
        rejects(
            TaskKind::Embed,
            json!({ "input": ["ok", long] }),
            "request.input[1]",
            "over the limit",
        );
    }

    #[test]
    fn outputs_are_checked() {
        let r = accepts(TaskKind::Embed, json!({ "input": ["a", "b"] }));
        let ok = json!({ "embeddings": [[0.5, 1.0], [0.0, -1.0]], "dimensions": 2 });
        assert_eq!(crate::validate_output(&r, &ok).unwrap(), ok);
        // `dimensions` is filled in when missing.
        let bare = json!({ "embeddings": [[0.5, 1.0], [0.0, -1.0]] });
        assert_eq!(crate::validate_output(&r, &bare).unwrap(), ok);
        for (bad, says) in [
            (
                json!({ "embeddings": [[0.5, 1.0]] }),
                "1 vectors for 2 inputs",
            ),
            (
                json!({ "embeddings": [[0.5, 1.0], [1.0]] }),
                "has 1 dimensions",
            ),
            (json!({ "embeddings": [[0.5, 1.0], []] }), "non-empty"),
            (json!({ "embeddings": [[0.5, 1.0], ["x", 1]] }), "finite"),
            (
                json!({ "embeddings": [[0.5, 1.0], [0.0, 1.0]], "dimensions": 3 }),
                "says 3",
            ),
            (json!({ "vectors": [] }), "unknown field"),
            (json!([]), "must be an object"),
        ] {
            let e = crate::validate_output(&r, &bad).unwrap_err();
            assert!(e.0.contains(says), "{bad}: {}", e.0);
        }
        let asked = accepts(TaskKind::Embed, json!({ "input": "a", "dimensions": 3 }));
        let e = crate::validate_output(&asked, &json!({ "embeddings": [[1.0, 2.0]] })).unwrap_err();
        assert!(e.0.contains("3 were asked for"), "{}", e.0);
    }

    #[test]
    fn item_keys_separate_text_source_dimensions_model_and_subject() {
        let text = EmbedInput::Text("a".into());
        let item = |rev: &str| {
            EmbedInput::Item(EmbedItem {
                text: "a".into(),
                id: Some("doc".into()),
                revision: Some(rev.into()),
            })
        };
        let base = embed_item_key(&text, None, "h1", None);
        assert_eq!(base, embed_item_key(&text, None, "h1", None));
        // The same text as a bare item or `{text}` alone is the same work.
        let bare = EmbedInput::Item(EmbedItem {
            text: "a".into(),
            id: None,
            revision: None,
        });
        assert_eq!(base, embed_item_key(&bare, None, "h1", None));
        let subject = crate::Subject::new(crate::SubjectKind::User, "u1").unwrap();
        let others = [
            embed_item_key(&EmbedInput::Text("b".into()), None, "h1", None),
            embed_item_key(&text, Some(8), "h1", None),
            embed_item_key(&text, None, "h2", None),
            embed_item_key(&text, None, "h1", Some(&subject)),
            embed_item_key(&item("v1"), None, "h1", None),
        ];
        for other in &others {
            assert_ne!(&base, other);
        }
        assert_eq!(
            embed_item_key(&item("v1"), None, "h1", None),
            embed_item_key(&item("v1"), None, "h1", None)
        );
        assert_ne!(
            embed_item_key(&item("v1"), None, "h1", None),
            embed_item_key(&item("v2"), None, "h1", None)
        );
    }
}
