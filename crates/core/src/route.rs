//! Routes (docs/routes.md): a model id names an ordered list of deployments (provider +
//! provider model + parameters + prices) and a strategy that picks the deployment of each
//! call — `fallback` (in order) or `weighted` (by weights) — skipping deployments that are
//! cooling down after a failure. Everything here is pure: which deployment comes next
//! ([`choose`]), how long a failed deployment cools down ([`Route::cooldown_after`]), and
//! the route's config hash (the cache key: an answer from any deployment of the route is
//! a valid cache entry for it).

use crate::canonical::hash_value;
use crate::cost::Prices;
use crate::error::InvalidInput;
use crate::model::{ConfigHash, ModelRef};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use std::time::Duration;

/// How long a deployment that failed (429, 5xx, timeout, connection error) is skipped by
/// every replica when the route names no `cooldown`.
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(30);

/// The longest cooldown, whatever the route or a provider's `Retry-After` asks for: a
/// deployment is tried again after at most five minutes.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(300);

/// How a route picks the deployment of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// The first deployment, in the route's order, that is not cooling down; after a
    /// failure, the next one.
    #[default]
    Fallback,
    /// A deployment drawn at random in proportion to its weight among those not cooling
    /// down (load balancing); after a failure, another one drawn the same way.
    Weighted,
}

impl Strategy {
    /// `"fallback"` or `"weighted"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Fallback => "fallback",
            Strategy::Weighted => "weighted",
        }
    }
}

/// One deployment of a route: who is called, with what, at what price.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deployment {
    /// Provider name from configuration.
    pub provider: String,
    /// The provider's own model name.
    pub model: String,
    /// Provider parameters (part of the config hash).
    #[serde(default)]
    pub params: Map<String, Value>,
    /// What the deployment costs (`None`: unpriced). Not part of the config hash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<Prices>,
    /// Its share of the calls of a `weighted` route (at least 1).
    #[serde(default = "one")]
    pub weight: u32,
    /// The longest one call on this deployment may take, re-asks excluded (`None`: the
    /// route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
}

fn one() -> u32 {
    1
}

impl Deployment {
    /// A deployment of `model` with no prices, weight 1 and no timeout of its own.
    pub fn new(model: &ModelRef) -> Deployment {
        Deployment {
            provider: model.provider.clone(),
            model: model.model.clone(),
            params: model.params.clone(),
            prices: None,
            weight: 1,
            attempt_timeout_ms: None,
        }
    }

    /// Its name, `provider/model`: the key of its cooldown, its pace and its metrics.
    pub fn name(&self) -> String {
        format!("{}/{}", self.provider, self.model)
    }

    /// What a call on it sends: provider, model and parameters.
    pub fn model_ref(&self) -> ModelRef {
        ModelRef {
            provider: self.provider.clone(),
            model: self.model.clone(),
            params: self.params.clone(),
            route: None,
        }
    }
}

/// A model id's route: its deployments, the strategy that picks among them, how long a
/// failed one cools down and how long one call may take.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Route {
    /// How a call's deployment is picked.
    #[serde(default)]
    pub strategy: Strategy,
    /// At least one, in the configured order.
    pub deployments: Vec<Deployment>,
    /// How long a failed deployment is skipped, in milliseconds (cut to
    /// [`MAX_COOLDOWN`]).
    pub cooldown_ms: u64,
    /// The longest one call may take on a deployment without a timeout of its own
    /// (`None`: only the provider's own timeouts and retries bound it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempt_timeout_ms: Option<u64>,
}

impl Route {
    /// The route of a single deployment with the default cooldown.
    pub fn single(deployment: Deployment) -> Route {
        Route {
            strategy: Strategy::Fallback,
            deployments: vec![deployment],
            cooldown_ms: DEFAULT_COOLDOWN.as_millis() as u64,
            attempt_timeout_ms: None,
        }
    }

    /// How long a failed deployment is skipped: the route's cooldown, or
    /// the provider's `Retry-After` when longer, never more than [`MAX_COOLDOWN`].
    pub fn cooldown_after(&self, retry_after: Option<Duration>) -> Duration {
        Duration::from_millis(self.cooldown_ms)
            .max(retry_after.unwrap_or_default())
            .min(MAX_COOLDOWN)
    }

    /// The longest one call on deployment `index` may take (`None`: unbounded here).
    pub fn attempt_timeout(&self, index: usize) -> Option<Duration> {
        self.deployments
            .get(index)
            .and_then(|d| d.attempt_timeout_ms)
            .or(self.attempt_timeout_ms)
            .map(Duration::from_millis)
    }

    /// The route's config hash: the cache key of its answers. A route of one
    /// `fallback` deployment hashes as that deployment's model reference (so turning a
    /// single-deployment model into a route of one keeps its cache); otherwise the
    /// strategy and every deployment's provider, model and parameters (and weight, for
    /// `weighted`) in order. Prices, cooldowns and timeouts change no output and are
    /// left out.
    pub fn config_hash(&self) -> Result<ConfigHash, InvalidInput> {
        if let [only] = self.deployments.as_slice()
            && self.strategy == Strategy::Fallback
        {
            return only.model_ref().config_hash();
        }
        let deployments: Vec<Value> = self
            .deployments
            .iter()
            .map(|d| {
                let mut v = json!({"provider": d.provider, "model": d.model, "params": d.params});
                if self.strategy == Strategy::Weighted {
                    v["weight"] = json!(d.weight);
                }
                v
            })
            .collect();
        let value = json!({"strategy": self.strategy.as_str(), "deployments": deployments});
        hash_value(&value)
            .map(ConfigHash)
            .map_err(|e| e.within("model.deployments"))
    }
}

/// The deployment of a route's next call (an index into `route.deployments`), or `None`
/// when every deployment has been tried. `tried[i]`: deployment `i` already had its call
/// in this execution; `cooling[i]`: it is cooling down. Deployments not cooling down
/// come first; when every untried one is cooling down, they are used all the same
/// (trying beats failing without a call). `fallback` takes the first candidate in order;
/// `weighted` draws one in proportion to the weights, with `draw` a uniformly random
/// number. Slices shorter than the route count as `false`.
pub fn choose(route: &Route, cooling: &[bool], tried: &[bool], draw: u64) -> Option<usize> {
    let flag = |s: &[bool], i: usize| s.get(i).copied().unwrap_or(false);
    let untried: Vec<usize> = (0..route.deployments.len())
        .filter(|&i| !flag(tried, i))
        .collect();
    let warm: Vec<usize> = untried
        .iter()
        .copied()
        .filter(|&i| !flag(cooling, i))
        .collect();
    let candidates = if warm.is_empty() { untried } else { warm };
    match route.strategy {
        Strategy::Fallback => candidates.first().copied(),
        Strategy::Weighted => {
            let weight = |i: usize| u64::from(route.deployments[i].weight.max(1));
            let total: u64 = candidates.iter().map(|&i| weight(i)).sum();
            if total == 0 {
                return None;
            }
            let mut point = draw % total;
            for &i in &candidates {
                if point < weight(i) {
                    return Some(i);
                }
                point -= weight(i);
            }
            candidates.last().copied()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(model: &str, weight: u32) -> Deployment {
        Deployment {
            weight,
            ..Deployment::new(&ModelRef::new("p", model))
        }
    }

    fn route(strategy: Strategy, weights: &[u32]) -> Route {
        Route {
            strategy,
            deployments: weights
                .iter()
                .enumerate()
                .map(|(i, w)| deployment(&format!("m{i}"), *w))
                .collect(),
            cooldown_ms: 30_000,
            attempt_timeout_ms: None,
        }
    }

    #[test]
    fn fallback_goes_in_order_skipping_cooling_and_tried() {
        let r = route(Strategy::Fallback, &[1, 1, 1]);
        assert_eq!(choose(&r, &[], &[], 7), Some(0));
        assert_eq!(choose(&r, &[true], &[], 7), Some(1));
        assert_eq!(choose(&r, &[false, false], &[true, true], 7), Some(2));
        assert_eq!(choose(&r, &[true, false, true], &[false, true], 7), Some(0));
        assert_eq!(choose(&r, &[], &[true, true, true], 7), None);
        // Everything cooling: the first untried all the same.
        assert_eq!(choose(&r, &[true, true, true], &[true], 7), Some(1));
    }

    #[test]
    fn weighted_draws_by_weight_among_warm_deployments() {
        let r = route(Strategy::Weighted, &[1, 3]);
        let mut counts = [0u32; 2];
        for draw in 0..400u64 {
            counts[choose(&r, &[], &[], draw).unwrap()] += 1;
        }
        assert_eq!(counts, [100, 300]);
        for draw in 0..50 {
            assert_eq!(choose(&r, &[false, true], &[], draw), Some(0));
            assert_eq!(choose(&r, &[], &[false, true], draw), Some(0));
            assert_eq!(choose(&r, &[true, true], &[true], draw), Some(1));
        }
        assert_eq!(choose(&r, &[], &[true, true], 3), None);
    }

    #[test]
    fn cooldowns_follow_retry_after_up_to_the_cap() {
        let r = route(Strategy::Fallback, &[1]);
        assert_eq!(r.cooldown_after(None), Duration::from_secs(30));
        assert_eq!(
            r.cooldown_after(Some(Duration::from_secs(90))),
            Duration::from_secs(90)
        );
        assert_eq!(
            r.cooldown_after(Some(Duration::from_secs(9000))),
            MAX_COOLDOWN
        );
        let long = Route {
            cooldown_ms: 3_600_000,
            ..r
        };
        assert_eq!(long.cooldown_after(None), MAX_COOLDOWN);
    }

    #[test]
    fn the_config_hash_follows_what_changes_outputs() {
        let one = route(Strategy::Fallback, &[1]);
        let m = one.deployments[0].model_ref();
        assert_eq!(one.config_hash().unwrap(), m.config_hash().unwrap());
        let two = route(Strategy::Fallback, &[1, 1]);
        let h2 = two.config_hash().unwrap();
        assert_ne!(h2, one.config_hash().unwrap());
        let mut reordered = two.clone();
        reordered.deployments.reverse();
        assert_ne!(reordered.config_hash().unwrap(), h2);
        let mut priced = two.clone();
        priced.deployments[0].prices = Some(Prices {
            input: 1,
            output: 2,
            cached_input: 1,
            cache_write_input: 1,
        });
        priced.cooldown_ms = 1;
        priced.attempt_timeout_ms = Some(5);
        assert_eq!(priced.config_hash().unwrap(), h2);
        let weighted = route(Strategy::Weighted, &[1, 1]);
        assert_ne!(weighted.config_hash().unwrap(), h2);
        let reweighted = route(Strategy::Weighted, &[1, 2]);
        assert_ne!(
            reweighted.config_hash().unwrap(),
            weighted.config_hash().unwrap()
        );
        // A route's hash is its model reference's.
        let mut with_route = m.clone();
        with_route.route = Some(two.clone());
        assert_eq!(with_route.config_hash().unwrap(), h2);
    }
}
