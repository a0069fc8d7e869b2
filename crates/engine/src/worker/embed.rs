//! An `embed` task's provider call (docs/engine.md, "Embeddings"): its items looked up in
//! the item cache first, only the others sent to the deployment — grouped with other
//! tasks' texts for the same deployment ([`EmbedBatcher`](crate::provider::embed_batch::EmbedBatcher)),
//! in calls of at most the batch size — and the new vectors stored in the cache, owned by
//! the task. The answer's usage is this task's share of the calls it took part in: a
//! task whose items were all cached uses (and is charged) nothing.

use super::WorkerPool;
use crate::cost::TokenCounter;
use crate::provider::embed_batch::{DEFAULT_EMBED_BATCH_SIZE, EmbedPart};
use crate::provider::{Provider, ProviderAnswer, ProviderError};
use futures::future::join_all;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::Arc;
use tollgate_core::{Deployment, EmbedRequest, Task, Usage, embed_item_key};
use tollgate_store::EmbeddingEntry;

impl WorkerPool {
    /// The vectors of `request`'s items on `deployment`: cached ones from the store (unless
    /// the task is a `recompute`), the rest from the provider.
    pub(super) async fn embed_call(
        &self,
        task: &Task,
        request: &EmbedRequest,
        deployment: &Deployment,
        provider: &Arc<dyn Provider>,
        counter: TokenCounter,
    ) -> Result<ProviderAnswer, ProviderError> {
        let model = deployment.model_ref();
        let config_hash = model
            .config_hash()
            .map(|h| h.0)
            .unwrap_or_else(|_| deployment.name());
        let keys: Vec<String> = request
            .input
            .iter()
            .map(|item| {
                embed_item_key(
                    item,
                    request.dimensions,
                    &config_hash,
                    task.subject.as_ref(),
                )
            })
            .collect();
        let mut known: HashMap<String, Vec<f32>> = if task
            .source
            .as_ref()
            .is_some_and(|s| s.recompute)
        {
            HashMap::new()
        } else {
            match self
                .inner
                .store
                .cached_embeddings(&task.app, &task.scope, &keys)
                .await
            {
                Ok(found) => found,
                Err(e) => {
                    // The cache only saves work: without it every item is embedded.
                    tracing::warn!(task = %task.id, error = %e, "cannot read the embeddings cache");
                    HashMap::new()
                }
            }
        };
        // The items to embed: each missing key once, in input order.
        let mut missing: Vec<usize> = Vec::new();
        let mut seen: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for (i, key) in keys.iter().enumerate() {
            if !known.contains_key(key) && seen.insert(key.as_str()) {
                missing.push(i);
            }
        }
        let texts: Vec<String> = missing
            .iter()
            .map(|&i| request.input[i].text().to_string())
            .collect();
        let weights: Vec<u64> = texts.iter().map(|t| counter.count(t)).collect();
        let batch_size = self.embed_batch_size(deployment);
        let parts = texts
            .chunks(batch_size)
            .zip(weights.chunks(batch_size))
            .map(|(texts, weights)| {
                self.embeds.embed(EmbedPart {
                    provider: provider.clone(),
                    provider_name: deployment.provider.clone(),
                    model: model.clone(),
                    dimensions: request.dimensions,
                    texts: texts.to_vec(),
                    weights: weights.to_vec(),
                    batch_size,
                })
            });
        let mut usage = Usage::default();
        let mut vectors: Vec<Vec<f32>> = Vec::with_capacity(texts.len());
        for answer in join_all(parts).await {
            let answer = answer?;
            usage = usage.plus(&answer.usage);
            vectors.extend(answer.vectors);
        }
        if usage.estimated {
            // Not reported: counted as sent, item by item (never less than was billed
            // where the tokenizer is known; bytes otherwise).
            usage.input_tokens = weights.iter().sum();
        }
        let invalid = |message: String| ProviderError::InvalidOutput {
            message,
            usage,
            billed_before: false,
        };
        let dimension = vectors
            .first()
            .or_else(|| known.values().next())
            .map_or(0, Vec::len);
        if let Some(bad) = vectors
            .iter()
            .chain(known.values())
            .find(|v| v.len() != dimension || v.is_empty())
        {
            return Err(invalid(format!(
                "the vectors have different dimensions ({} and {dimension})",
                bad.len()
            )));
        }
        if let Some(asked) = request.dimensions
            && asked as usize != dimension
        {
            return Err(invalid(format!(
                "the vectors have {dimension} dimensions, {asked} were asked for"
            )));
        }
        let entries: Vec<EmbeddingEntry> = missing
            .iter()
            .zip(vectors)
            .zip(&weights)
            .map(|((&i, vector), &tokens)| EmbeddingEntry {
                key: keys[i].clone(),
                vector,
                tokens,
            })
            .collect();
        if !entries.is_empty()
            && let Err(e) = self.inner.store.put_embeddings(task.id, &entries).await
        {
            tracing::warn!(task = %task.id, error = %e, "cannot store embeddings in the cache");
        }
        for e in entries {
            known.insert(e.key, e.vector);
        }
        let ordered: Vec<Option<&Vec<f32>>> = keys.iter().map(|k| known.get(k)).collect();
        Ok(ProviderAnswer {
            output: json!({ "embeddings": vectors_json(&ordered), "dimensions": dimension }),
            usage,
            billed_before: false,
        })
    }

    /// Most texts in one embeddings call on `deployment`: the model's `embed_batch_size`
    /// parameter, else its provider's, else [`DEFAULT_EMBED_BATCH_SIZE`].
    fn embed_batch_size(&self, deployment: &Deployment) -> usize {
        deployment
            .params
            .get("embed_batch_size")
            .and_then(Value::as_u64)
            .filter(|n| *n > 0)
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
            .or_else(|| {
                self.inner
                    .config
                    .providers
                    .get(&deployment.provider)
                    .and_then(|p| p.embed_batch_size)
                    .map(|n| n.get() as usize)
            })
            .unwrap_or(DEFAULT_EMBED_BATCH_SIZE)
    }
}

/// Vectors as JSON numbers written as their `f32`s' shortest decimals (`0.1`, not the
/// widened `0.10000000149011612`): half the stored bytes, the same `f32`s read back.
pub(crate) fn vectors_json<T: serde::Serialize>(vectors: &T) -> Value {
    serde_json::to_string(vectors)
        .ok()
        .and_then(|text| serde_json::from_str(&text).ok())
        .unwrap_or(Value::Null)
}
