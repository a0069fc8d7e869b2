//! `[budgets]`, `[apps]` and `[admission]`: budget policies and who may use them (docs/conformance.md#budget-policies).

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use std::fmt;
use std::num::NonZeroU32;

/// A budget number as written in configuration. [`EngineConfig::validate`] requires a
/// positive integer below 2^32; anything else is reported with its key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    /// An integer (valid when positive and below 2^32).
    Integer(i64),
    /// A number written with a fraction or exponent (valid only when it is a whole
    /// positive number).
    Float(f64),
}

impl Limit {
    /// The positive 32-bit value, or why it is not one.
    pub fn positive(self) -> Result<NonZeroU32, String> {
        let whole = match self {
            Limit::Integer(n) => n,
            Limit::Float(f) if f.is_finite() && f.fract() == 0.0 && f.abs() < 1e15 => f as i64,
            Limit::Float(f) => return Err(format!("must be a positive integer, got {f}")),
        };
        u32::try_from(whole)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| format!("must be a positive integer below 2^32, got {whole}"))
    }
}

impl From<u32> for Limit {
    fn from(n: u32) -> Limit {
        Limit::Integer(i64::from(n))
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Limit::Integer(n) => s.serialize_i64(*n),
            Limit::Float(f) => s.serialize_f64(*f),
        }
    }
}

impl<'de> Deserialize<'de> for Limit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Limit, D::Error> {
        struct LimitVisitor;
        impl Visitor<'_> for LimitVisitor {
            type Value = Limit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a positive integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Limit, E> {
                Ok(Limit::Integer(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Limit, E> {
                Ok(i64::try_from(v).map_or(Limit::Float(v as f64), Limit::Integer))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Limit, E> {
                Ok(Limit::Float(v))
            }
        }
        d.deserialize_any(LimitVisitor)
    }
}

/// `[budgets.<name>]`: the five per-scope admission limits of docs/conformance.md#admission (the sixth,
/// `global_concurrent`, is the server-wide `[admission]` setting).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetPolicy {
    /// Distinct logical steps admitted for one source in 24 h.
    pub max_steps_per_source: Limit,
    /// Distinct sources admitted in the scope in 24 h.
    pub sources_per_24_hours: Limit,
    /// Scoped tasks of the scope that are queued or running.
    pub scope_concurrent: Limit,
    /// Token-bucket capacity per (app, scope).
    pub burst: Limit,
    /// Token-bucket refill in tasks per minute.
    pub tasks_per_minute: Limit,
    /// docs/conformance.md#cost-usage: the scope's spend in 24 h (settled plus reserved), USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_24_hours: Option<f64>,
    /// docs/conformance.md#cost-limits: the scope's model-token bucket refill, tokens per minute (with
    /// `token_burst`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<Limit>,
    /// docs/conformance.md#cost-limits: the scope's model-token bucket capacity (with `tokens_per_minute`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_burst: Option<Limit>,
    /// docs/conformance.md#fair-share: the scope's share of claims against other scopes (1 to 1000; default 1).
    /// Applies to every task of a scope that uses the policy, scoped or not.
    #[serde(default = "default_weight")]
    pub weight: Limit,
}

fn default_weight() -> Limit {
    Limit::Integer(1)
}

impl Default for BudgetPolicy {
    fn default() -> Self {
        BudgetPolicy {
            max_steps_per_source: Limit::Integer(50),
            sources_per_24_hours: Limit::Integer(10_000),
            scope_concurrent: Limit::Integer(50),
            burst: Limit::Integer(60),
            tasks_per_minute: Limit::Integer(600),
            usd_per_24_hours: None,
            tokens_per_minute: None,
            token_burst: None,
            weight: default_weight(),
        }
    }
}

impl BudgetPolicy {
    /// docs/conformance.md#cost-limits: the policy's cost limits (the app's limit is added per app), or the
    /// first invalid field and why.
    pub fn cost_limits(&self) -> Result<tollgate_core::CostLimits, (&'static str, String)> {
        let scope_nano_per_24_hours = self
            .usd_per_24_hours
            .map(|usd| {
                tollgate_core::cost::usd_limit_from_f64("usd_per_24_hours", usd)
                    .map_err(|e| ("usd_per_24_hours", e.to_string()))
            })
            .transpose()?;
        let token_rate = match (self.tokens_per_minute, self.token_burst) {
            (None, None) => None,
            (Some(rate), Some(burst)) => Some(tollgate_core::TokenRate {
                tokens_per_minute: rate.positive().map_err(|m| ("tokens_per_minute", m))?,
                token_burst: burst.positive().map_err(|m| ("token_burst", m))?,
            }),
            (Some(_), None) => {
                return Err(("token_burst", "is required with tokens_per_minute".into()));
            }
            (None, Some(_)) => {
                return Err(("tokens_per_minute", "is required with token_burst".into()));
            }
        };
        Ok(tollgate_core::CostLimits {
            scope_nano_per_24_hours,
            token_rate,
            app_nano_per_24_hours: None,
        })
    }

    pub(super) fn fields(&self) -> [(&'static str, Limit); 5] {
        [
            ("max_steps_per_source", self.max_steps_per_source),
            ("sources_per_24_hours", self.sources_per_24_hours),
            ("scope_concurrent", self.scope_concurrent),
            ("burst", self.burst),
            ("tasks_per_minute", self.tasks_per_minute),
        ]
    }
}

/// `[apps.<app>]`: which budget policies an app uses.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// The policy of the app's scoped tasks that name none (default: the top-level
    /// `default_budget`).
    #[serde(default)]
    pub default_budget: Option<String>,
    /// The policies a request of the app may name (default: only its default).
    #[serde(default)]
    pub allowed_budgets: Option<Vec<String>>,
    /// The app's API keys. They belong to the HTTP server's configuration; the engine
    /// accepts and ignores them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<Value>,
    /// docs/conformance.md#money-and-tokens: the whole app's spend in 24 h, all scopes, USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usd_per_24_hours: Option<f64>,
    /// The global slots (`[admission] global_concurrent`) only this app may use
    /// (docs/budgets.md, "Each app's share of the global capacity"); default: an even
    /// split of half of `global_concurrent` when two or more apps are configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_concurrent_share: Option<u32>,
    /// Whether the app's prompts and outputs may be written into its tasks' trace spans
    /// (docs/telemetry.md); off by default: spans carry sizes, tokens and costs only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trace_content: bool,
    /// docs/routes.md, "Attempts": how many attempts the app's tasks may make (1 to 20;
    /// the smaller of this and the model's `max_attempts`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<tollgate_core::MaxAttempts>,
}

/// docs/budgets.md, "Each app's share of the global capacity": each configured app's
/// share of `global` slots, `None` when shares are off (fewer than two apps and no
/// `global_concurrent_share` set). An app without the setting gets
/// `⌊global / (2 × apps)⌋`. Fails naming `apps` when the shares add up to more than
/// `global`.
pub fn app_shares<'a>(
    apps: impl IntoIterator<Item = (&'a String, &'a AppConfig)>,
    global: u32,
) -> Result<Option<std::collections::BTreeMap<String, u32>>, String> {
    let apps: Vec<(&String, &AppConfig)> = apps.into_iter().collect();
    let explicit = apps
        .iter()
        .any(|(_, c)| c.global_concurrent_share.is_some());
    if apps.len() < 2 && !explicit {
        return Ok(None);
    }
    let even = global / (2 * apps.len().max(1) as u32).max(1);
    let shares: std::collections::BTreeMap<String, u32> = apps
        .iter()
        .map(|(name, c)| ((*name).clone(), c.global_concurrent_share.unwrap_or(even)))
        .collect();
    let reserved: u64 = shares.values().map(|s| u64::from(*s)).sum();
    if reserved > u64::from(global) {
        return Err(format!(
            "the apps' global_concurrent_share add up to {reserved}, more than \
             [admission] global_concurrent = {global}"
        ));
    }
    Ok(Some(shares))
}

/// `[admission]`: server-wide admission settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Scoped tasks of all apps and scopes that may be queued or running at once.
    pub global_concurrent: Limit,
}

impl Default for AdmissionConfig {
    fn default() -> Self {
        AdmissionConfig {
            global_concurrent: Limit::Integer(1000),
        }
    }
}
