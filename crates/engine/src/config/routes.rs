//! `[[models.<id>.deployments]]`: the deployments of a route (docs/routes.md).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::time::Duration;
use tollgate_core::{Deployment, ModelRef};

use super::*;

/// One `[[models.<id>.deployments]]` entry: who is called, with what, at what price.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentConfig {
    /// A provider name from `[providers]` (or the built-in `dev`).
    pub provider: String,
    /// The provider's own model name.
    pub model: String,
    /// Provider parameters, as a model's `params` (part of the route's config hash).
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub params: Map<String, Value>,
    /// What calls on this deployment cost, USD per million tokens. A route's
    /// deployments are all priced or none is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<ModelPrices>,
    /// The output-token bound of a request that sets none, sent as `max_tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// docs/conformance.md#provider-pace: calls per `pace_window` of its provider to this
    /// deployment, from all replicas together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<Limit>,
    /// docs/conformance.md#provider-pace: model tokens per `pace_window` to this deployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<Limit>,
    /// Its share of a `weighted` route's calls (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// The longest one call on this deployment may take (default: the route's).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "optional_duration_text"
    )]
    pub attempt_timeout: Option<Duration>,
}

impl DeploymentConfig {
    /// docs/conformance.md#provider-pace: this deployment's own pace limits.
    pub fn pace(&self) -> PaceLimits {
        PaceLimits {
            requests_per_minute: self.requests_per_minute,
            tokens_per_minute: self.tokens_per_minute,
        }
    }

    /// What a call on it sends, on a provider of `kind`: a configured
    /// `max_output_tokens` is sent as `max_tokens` unless `params` already says; on
    /// `anthropic`, whose Messages API needs a `max_tokens`, a deployment that names none
    /// gets [`ANTHROPIC_DEFAULT_MAX_TOKENS`] (sent, so part of the config hash, and the
    /// output bound its reservations count).
    pub fn model_ref(&self, kind: Option<ProviderKind>) -> ModelRef {
        let mut params = self.params.clone();
        let default =
            (kind == Some(ProviderKind::Anthropic)).then_some(ANTHROPIC_DEFAULT_MAX_TOKENS);
        if let Some(n) = self.max_output_tokens.or(default)
            && !params.contains_key("max_tokens")
            && !params.contains_key("max_completion_tokens")
        {
            params.insert("max_tokens".into(), Value::from(n));
        }
        ModelRef {
            provider: self.provider.clone(),
            model: self.model.clone(),
            params,
            route: None,
        }
    }

    /// The core deployment (prices that are not valid are left out: validation reports
    /// them).
    pub fn deployment(&self, kind: Option<ProviderKind>) -> Deployment {
        Deployment {
            prices: self.prices.and_then(|p| p.to_core().ok()),
            weight: self.weight.unwrap_or(1),
            attempt_timeout_ms: self.attempt_timeout.map(millis),
            ..Deployment::new(&self.model_ref(kind))
        }
    }
}

/// Whole milliseconds of a duration (saturating).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Optional durations as human-readable strings, for serde (see [`duration_text`]).
pub mod optional_duration_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Writes `"1m 30s"`-style text (or nothing).
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => super::duration_text::serialize(d, s),
            None => s.serialize_none(),
        }
    }

    /// Reads `"200ms"`, `"2s"`, `"1h"`, `"1h 30m"`.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = String::deserialize(d)?;
        super::duration_text::parse(&text)
            .map(Some)
            .map_err(serde::de::Error::custom)
    }
}
