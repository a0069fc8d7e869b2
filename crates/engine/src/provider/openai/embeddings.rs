//! OpenAI-compatible embeddings: `POST {base_url}/embeddings` (Azure:
//! `{base_url}/openai/deployments/{model}/embeddings?api-version=…`), body `{model,
//! input: [texts], encoding_format: "float", dimensions?}`. The request's `dimensions`
//! wins over the model's `dimensions` parameter; no other parameter is sent. The answer's
//! `data[].embedding` are put back in input order by their `index`; `usage.prompt_tokens`
//! is the usage (absent: `estimated`, the worker counts the call at its bound).

use crate::provider::http::excerpt;
use crate::provider::{EmbedAnswer, EmbedCall, ProviderError};
use serde_json::{Map, Value, json};
use tollgate_core::Usage;

/// The body of an embeddings call.
pub fn embeddings_body(call: &EmbedCall<'_>) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(call.model.model));
    body.insert("input".into(), json!(call.texts));
    body.insert("encoding_format".into(), json!("float"));
    let dimensions = call
        .dimensions
        .map(|d| json!(d))
        .or_else(|| call.model.params.get("dimensions").cloned());
    if let Some(d) = dimensions {
        body.insert("dimensions".into(), d);
    }
    Value::Object(body)
}

/// Reads an embeddings answer for `n` texts.
pub fn parse_embeddings(answer: &Value, n: usize) -> Result<EmbedAnswer, ProviderError> {
    let input = answer
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64);
    let usage = Usage {
        input_tokens: input.unwrap_or(0),
        estimated: input.is_none(),
        ..Usage::default()
    };
    let malformed = |what: &str| {
        ProviderError::Failed(format!(
            "the provider's embeddings answer {what}: {}",
            excerpt(&answer.to_string())
        ))
    };
    let Some(data) = answer.get("data").and_then(Value::as_array) else {
        return Err(malformed("has no `data` list"));
    };
    if data.len() != n {
        return Err(ProviderError::InvalidOutput {
            message: format!("the provider answered {} vectors for {n} texts", data.len()),
            usage,
            billed_before: false,
        });
    }
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; n];
    for (i, item) in data.iter().enumerate() {
        let index = item
            .get("index")
            .and_then(Value::as_u64)
            .map_or(i, |x| x as usize);
        let Some(numbers) = item.get("embedding").and_then(Value::as_array) else {
            return Err(malformed(
                "has an item without an `embedding` list of floats",
            ));
        };
        let vector: Option<Vec<f32>> = numbers
            .iter()
            .map(|x| x.as_f64().map(|f| f as f32))
            .collect();
        let Some(vector) = vector else {
            return Err(malformed("has an embedding that is not all numbers"));
        };
        match vectors.get_mut(index) {
            Some(slot @ None) => *slot = Some(vector),
            _ => return Err(malformed("has a missing, repeated or out-of-range `index`")),
        }
    }
    Ok(EmbedAnswer {
        vectors: vectors.into_iter().map(Option::unwrap_or_default).collect(),
        usage,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tollgate_core::ModelRef;

    #[test]
    fn body_carries_texts_and_dimensions() {
        let mut model = ModelRef::new("openai", "text-embedding-3-small");
        let texts = vec!["a".to_string(), "b".to_string()];
        let call = EmbedCall {
            model: &model,
            texts: &texts,
            dimensions: Some(64),
        };
        assert_eq!(
            embeddings_body(&call),
            json!({ "model": "text-embedding-3-small", "input": ["a", "b"], "encoding_format": "float", "dimensions": 64 })
        );
        model.params.insert("dimensions".into(), json!(32));
        model.params.insert("temperature".into(), json!(0));
        let call = EmbedCall {
            model: &model,
            texts: &texts,
            dimensions: None,
        };
        let body = embeddings_body(&call);
        assert_eq!(body["dimensions"], json!(32));
        assert!(body.get("temperature").is_none());
    }

    #[test]
    fn answers_are_read_in_index_order() {
        let answer = json!({
            "object": "list",
            "data": [
                { "object": "embedding", "index": 1, "embedding": [0.5, 0.25] },
                { "object": "embedding", "index": 0, "embedding": [1.0, 0.0] }
            ],
            "usage": { "prompt_tokens": 7, "total_tokens": 7 }
        });
        let a = parse_embeddings(&answer, 2).unwrap();
        assert_eq!(a.vectors, vec![vec![1.0, 0.0], vec![0.5, 0.25]]);
        assert_eq!(a.usage.input_tokens, 7);
        assert!(!a.usage.estimated);
        let no_usage = json!({ "data": [{ "index": 0, "embedding": [1.0] }] });
        assert!(parse_embeddings(&no_usage, 1).unwrap().usage.estimated);
        assert!(matches!(
            parse_embeddings(&answer, 3),
            Err(ProviderError::InvalidOutput { .. })
        ));
        let repeated = json!({ "data": [{ "index": 0, "embedding": [1.0] }, { "index": 0, "embedding": [1.0] }] });
        assert!(matches!(
            parse_embeddings(&repeated, 2),
            Err(ProviderError::Failed(_))
        ));
        assert!(matches!(
            parse_embeddings(&json!({ "error": "x" }), 1),
            Err(ProviderError::Failed(_))
        ));
    }
}
