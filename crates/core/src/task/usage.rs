//! The token usage (and cost where known) recorded with every result, summed over a
//! task's calls and clamped to what a provider may report (docs/budgets.md, "Settlement").

use serde::{Deserialize, Serialize};

/// Token usage (and cost where known) recorded with every result.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Cost in US dollars, where the provider or configuration knows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Of `input_tokens`, those the provider served from its prompt cache, where it says
    /// (OpenAI-compatible `usage.prompt_tokens_details.cached_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_tokens: Option<u64>,
    /// Of `input_tokens`, those the provider wrote to its prompt cache, where it says
    /// (Anthropic's `usage.cache_creation_input_tokens`), priced at the cache-write price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write_input_tokens: Option<u64>,
    /// The provider did not report the usage of at least one attempt: that attempt is
    /// counted at its reservation (its bound), never less than could have been billed
    /// (docs/budgets.md, "Settlement").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
    /// The exact cost in nano-dollars when every call was priced at the prices of the
    /// deployment that made it (a route's deployments may differ): settlement charges
    /// this. `None`: the usage is priced at the task's reservation prices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_nano_usd: Option<i64>,
}

/// The most tokens of one kind (input, output, cached input) a usage may carry: a
/// provider reporting more is clamped to it (docs/budgets.md, "Settlement"), so sums of
/// spend never overflow. Far above any model's context window.
pub const MAX_REPORTED_TOKENS: u64 = 100_000_000;

impl Usage {
    /// The usage of two calls together: token counts added (a cache count known on
    /// either side is known on the sum), costs added where either is known, estimated
    /// when either is.
    pub fn plus(&self, other: &Usage) -> Usage {
        fn either<T: std::ops::Add<Output = T>>(a: Option<T>, b: Option<T>) -> Option<T> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            }
        }
        Usage {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cost_usd: either(self.cost_usd, other.cost_usd),
            cost_nano_usd: either(self.cost_nano_usd, other.cost_nano_usd),
            cached_input_tokens: either(self.cached_input_tokens, other.cached_input_tokens),
            cache_write_input_tokens: either(
                self.cache_write_input_tokens,
                other.cache_write_input_tokens,
            ),
            estimated: self.estimated || other.estimated,
        }
    }

    /// What this usage costs at `prices`, in nano-dollars (cached input tokens at the
    /// cached-input price, rounded up).
    pub fn cost_at(&self, prices: &crate::cost::Prices) -> i64 {
        prices.cost_nano(self)
    }

    /// The usage with every token count clamped to [`MAX_REPORTED_TOKENS`], and whether
    /// anything was clamped.
    pub fn clamped(self) -> (Usage, bool) {
        let clamped = self.input_tokens > MAX_REPORTED_TOKENS
            || self.output_tokens > MAX_REPORTED_TOKENS
            || self
                .cached_input_tokens
                .is_some_and(|c| c > MAX_REPORTED_TOKENS)
            || self
                .cache_write_input_tokens
                .is_some_and(|c| c > MAX_REPORTED_TOKENS);
        let usage = Usage {
            input_tokens: self.input_tokens.min(MAX_REPORTED_TOKENS),
            output_tokens: self.output_tokens.min(MAX_REPORTED_TOKENS),
            cached_input_tokens: self.cached_input_tokens.map(|c| c.min(MAX_REPORTED_TOKENS)),
            cache_write_input_tokens: self
                .cache_write_input_tokens
                .map(|c| c.min(MAX_REPORTED_TOKENS)),
            ..self
        };
        (usage, clamped)
    }
}
