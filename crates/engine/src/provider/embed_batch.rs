//! Grouped embeddings calls (docs/engine.md, "Embeddings"): executions of `embed` tasks
//! that reach the same deployment (same model configuration and dimension) within a
//! moment of each other share one provider call of at most the batch size's texts.
//!
//! The first call of a group waits `workers.embed_gather` for the others, then the texts waiting are
//! packed, in arrival order, into calls of at most `batch_size` texts, each made on its
//! own tokio task (so a task canceled meanwhile does not abort its neighbours' call; its
//! answer is dropped). Each caller gets its own vectors and its share of the call's
//! usage: the reported input tokens split in proportion to each caller's texts as counted
//! (the shares add up exactly), so every task is charged its own tokens. A failed call
//! fails every caller in it with the same error; each task's attempts then go on as the
//! attempt rules say (docs/routes.md, "Attempts").

use super::{EmbedAnswer, EmbedCall, Provider, ProviderError};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::oneshot;
use tollgate_core::{ModelRef, Usage};

/// Texts in one provider call unless the provider (`embed_batch_size`) or the model
/// (parameter `embed_batch_size`) says otherwise: OpenAI's limit of inputs per request.
pub const DEFAULT_EMBED_BATCH_SIZE: usize = 2048;

/// What a group is keyed by: calls that may share one provider call.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GroupKey {
    provider: String,
    config_hash: String,
    dimensions: Option<u32>,
}

/// One caller waiting for its vectors.
#[derive(Debug)]
struct Waiter {
    texts: Vec<String>,
    /// Each text's tokens as counted: how a grouped call's usage is split.
    weights: Vec<u64>,
    reply: oneshot::Sender<Result<EmbedAnswer, ProviderError>>,
}

/// The groups forming in this process.
#[derive(Debug, Default)]
pub struct EmbedBatcher {
    /// How long a group's first call waits for others.
    gather: Duration,
    groups: Mutex<HashMap<GroupKey, Vec<Waiter>>>,
}

/// One caller's part of a grouped call.
pub struct EmbedPart {
    /// The provider to call.
    pub provider: Arc<dyn Provider>,
    /// The provider's name (groups never mix providers).
    pub provider_name: String,
    /// The deployment's model.
    pub model: ModelRef,
    /// The asked dimension.
    pub dimensions: Option<u32>,
    /// The texts (at most `batch_size`).
    pub texts: Vec<String>,
    /// Each text's tokens as counted.
    pub weights: Vec<u64>,
    /// Most texts in one provider call.
    pub batch_size: usize,
}

impl EmbedBatcher {
    /// A batcher whose groups gather for `gather`.
    pub fn new(gather: Duration) -> EmbedBatcher {
        EmbedBatcher {
            gather,
            groups: Mutex::default(),
        }
    }

    /// Embeds `part.texts`, grouped with the calls to the same deployment and dimension
    /// waiting now. The answer's usage is this caller's share.
    pub async fn embed(self: &Arc<Self>, part: EmbedPart) -> Result<EmbedAnswer, ProviderError> {
        let key = GroupKey {
            provider: part.provider_name.clone(),
            config_hash: part
                .model
                .config_hash()
                .map(|h| h.0)
                .unwrap_or_else(|_| format!("{}/{}", part.provider_name, part.model.model)),
            dimensions: part.dimensions,
        };
        let (reply, answer) = oneshot::channel();
        let lead = {
            let mut groups = self.groups.lock().unwrap_or_else(PoisonError::into_inner);
            let waiting = groups.entry(key.clone()).or_default();
            waiting.push(Waiter {
                texts: part.texts,
                weights: part.weights,
                reply,
            });
            waiting.len() == 1
        };
        if lead {
            let batcher = self.clone();
            let provider = part.provider;
            let model = part.model;
            let batch_size = part.batch_size.max(1);
            tokio::spawn(async move {
                tokio::time::sleep(batcher.gather).await;
                let waiting = batcher
                    .groups
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&key)
                    .unwrap_or_default();
                for batch in pack(waiting, batch_size) {
                    let provider = provider.clone();
                    let model = model.clone();
                    tokio::spawn(call(provider, model, key.dimensions, batch));
                }
            });
        }
        answer.await.unwrap_or_else(|_| {
            Err(ProviderError::Unavailable {
                message: "the grouped embeddings call ended without an answer".into(),
                retry_after: None,
                refused: false,
            })
        })
    }
}

/// Packs waiters, in order, into batches of at most `batch_size` texts (a waiter is never
/// split; one larger than the batch goes alone).
fn pack(waiting: Vec<Waiter>, batch_size: usize) -> Vec<Vec<Waiter>> {
    let mut batches: Vec<Vec<Waiter>> = Vec::new();
    let mut size = 0;
    for w in waiting {
        let n = w.texts.len();
        match batches.last_mut() {
            Some(batch) if size + n <= batch_size => {
                size += n;
                batch.push(w);
            }
            _ => {
                size = n;
                batches.push(vec![w]);
            }
        }
    }
    batches
}

/// One provider call for a batch, its answer split back to each waiter.
async fn call(
    provider: Arc<dyn Provider>,
    model: ModelRef,
    dimensions: Option<u32>,
    batch: Vec<Waiter>,
) {
    let texts: Vec<String> = batch.iter().flat_map(|w| w.texts.iter().cloned()).collect();
    let weights: Vec<u64> = batch.iter().map(|w| w.weights.iter().sum()).collect();
    let answer = provider
        .embed(EmbedCall {
            model: &model,
            texts: &texts,
            dimensions,
        })
        .await;
    let answer = answer.and_then(|a| {
        if a.vectors.len() == texts.len() {
            Ok(a)
        } else {
            Err(ProviderError::InvalidOutput {
                message: format!(
                    "the provider answered {} vectors for {} texts",
                    a.vectors.len(),
                    texts.len()
                ),
                usage: a.usage,
                // The provider counted a lost try in `usage` already.
                billed_before: false,
            })
        }
    });
    match answer {
        Ok(a) => {
            let shares = split_usage(&a.usage, &weights);
            let mut vectors = a.vectors.into_iter();
            for (w, usage) in batch.into_iter().zip(shares) {
                let own: Vec<Vec<f32>> = vectors.by_ref().take(w.texts.len()).collect();
                // A caller that stopped waiting (its task canceled) drops its part.
                let _ = w.reply.send(Ok(EmbedAnswer {
                    vectors: own,
                    usage,
                }));
            }
        }
        Err(e) => {
            let shares = match &e {
                ProviderError::InvalidOutput { usage, .. } => split_usage(usage, &weights),
                _ => vec![Usage::default(); batch.len()],
            };
            for (w, share) in batch.into_iter().zip(shares) {
                let e = match &e {
                    ProviderError::InvalidOutput { message, .. } => ProviderError::InvalidOutput {
                        message: message.clone(),
                        usage: share,
                        billed_before: false,
                    },
                    other => other.clone(),
                };
                let _ = w.reply.send(Err(e));
            }
        }
    }
}

/// A call's usage split in proportion to `weights` (each caller's counted tokens); the
/// shares add up to the whole exactly (the last takes the rounding). Unreported usage
/// (`estimated`) is left to each caller's bound: every share is marked estimated.
fn split_usage(usage: &Usage, weights: &[u64]) -> Vec<Usage> {
    let total: u128 = weights.iter().map(|w| u128::from(*w)).sum();
    let n = weights.len().max(1) as u128;
    let mut given = 0u64;
    weights
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let input = if i + 1 == weights.len() {
                usage.input_tokens - given
            } else {
                (u128::from(usage.input_tokens) * u128::from(*w))
                    .checked_div(total)
                    .unwrap_or(u128::from(usage.input_tokens) / n) as u64
            };
            given += input;
            Usage {
                input_tokens: input,
                output_tokens: 0,
                estimated: usage.estimated,
                ..Usage::default()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_splits_exactly_by_weight() {
        let usage = Usage {
            input_tokens: 100,
            ..Usage::default()
        };
        let shares = split_usage(&usage, &[1, 1, 1]);
        assert_eq!(
            shares.iter().map(|u| u.input_tokens).collect::<Vec<_>>(),
            vec![33, 33, 34]
        );
        let shares = split_usage(&usage, &[30, 10]);
        assert_eq!(shares[0].input_tokens, 75);
        assert_eq!(shares[1].input_tokens, 25);
        assert_eq!(split_usage(&usage, &[0, 0])[1].input_tokens, 50);
        assert_eq!(split_usage(&usage, &[5])[0].input_tokens, 100);
    }

    #[test]
    fn packing_keeps_order_and_size() {
        let w = |n: usize| {
            let (reply, _) = oneshot::channel();
            Waiter {
                texts: vec![String::new(); n],
                weights: vec![1; n],
                reply,
            }
        };
        let batches = pack(vec![w(2), w(2), w(1), w(4), w(5)], 4);
        let sizes: Vec<Vec<usize>> = batches
            .iter()
            .map(|b| b.iter().map(|w| w.texts.len()).collect())
            .collect();
        assert_eq!(sizes, vec![vec![2, 2], vec![1], vec![4], vec![5]]);
    }
}
