//! `embed` on the dev provider: deterministic vectors (docs/providers.md, "dev").
//!
//! Each text's vector is seeded by a hash of the model name, the dimension and the text,
//! drawn uniformly from `[-1, 1)` and scaled to unit length, so equal texts always get
//! equal vectors and different texts (almost surely) different ones. The dimension is the
//! request's `dimensions`, else the model's `dimensions` parameter, else
//! [`DEFAULT_DEV_DIMENSIONS`]. Usage: a quarter token per byte of each text, rounded up.

use super::{seed, tokens};
use crate::provider::{EmbedAnswer, EmbedCall};
use serde_json::{Value, json};
use tollgate_core::{EmbedRequest, ModelRef, Usage};

/// The dev provider's vector dimension unless asked otherwise.
pub const DEFAULT_DEV_DIMENSIONS: u32 = 256;

/// The dimension of a dev model's vectors.
fn dimension(model: &ModelRef, asked: Option<u32>) -> u32 {
    asked
        .or_else(|| {
            model
                .params
                .get("dimensions")
                .and_then(Value::as_u64)
                .and_then(|d| u32::try_from(d).ok())
        })
        .filter(|d| *d > 0)
        .unwrap_or(DEFAULT_DEV_DIMENSIONS)
}

/// The vector of one text: seeded, unit length.
pub fn dev_vector(model: &ModelRef, dimensions: u32, text: &str) -> Vec<f32> {
    let mut rng = fastrand::Rng::with_seed(seed(&json!([model.model, dimensions, text])));
    let raw: Vec<f32> = (0..dimensions).map(|_| rng.f32() * 2.0 - 1.0).collect();
    let norm = raw.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm == 0.0 {
        return raw;
    }
    raw.into_iter().map(|x| x / norm).collect()
}

/// The dev provider's answer to an embeddings call.
pub(super) fn embed_answer(call: &EmbedCall<'_>) -> EmbedAnswer {
    let d = dimension(call.model, call.dimensions);
    let vectors = call
        .texts
        .iter()
        .map(|t| dev_vector(call.model, d, t))
        .collect();
    let input_tokens = call.texts.iter().map(|t| tokens(t.len())).sum();
    EmbedAnswer {
        vectors,
        usage: Usage {
            input_tokens,
            ..Usage::default()
        },
    }
}

/// The `embed` output of a whole request (what `complete` answers for an embed task).
pub(super) fn embed_output(model: &ModelRef, r: &EmbedRequest) -> Value {
    let texts: Vec<String> = r.texts().into_iter().map(str::to_owned).collect();
    let answer = embed_answer(&EmbedCall {
        model,
        texts: &texts,
        dimensions: r.dimensions,
    });
    json!({
        "embeddings": crate::worker::vectors_json(&answer.vectors),
        "dimensions": dimension(model, r.dimensions),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_deterministic_unit_and_sized() {
        let model = ModelRef::new("dev", "dev-embed");
        let texts = vec!["alpha".to_string(), "beta".to_string(), "alpha".to_string()];
        let call = EmbedCall {
            model: &model,
            texts: &texts,
            dimensions: None,
        };
        let a = embed_answer(&call);
        assert_eq!(a, embed_answer(&call));
        assert_eq!(a.vectors.len(), 3);
        assert_eq!(a.vectors[0].len(), DEFAULT_DEV_DIMENSIONS as usize);
        assert_eq!(a.vectors[0], a.vectors[2]);
        assert_ne!(a.vectors[0], a.vectors[1]);
        for v in &a.vectors {
            let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "{norm}");
        }
        assert_eq!(a.usage.input_tokens, 2 + 1 + 2);
        let short = embed_answer(&EmbedCall {
            dimensions: Some(8),
            ..call
        });
        assert_eq!(short.vectors[0].len(), 8);
        let mut configured = model.clone();
        configured.params.insert("dimensions".into(), json!(16));
        let c = embed_answer(&EmbedCall {
            model: &configured,
            ..call
        });
        assert_eq!(c.vectors[0].len(), 16);
    }
}
