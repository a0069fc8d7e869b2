//! `[dispatch]` and the provider pace keys (docs/conformance.md#provider-pace).

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::*;

/// `[dispatch]`: the order workers start queued tasks in (docs/conformance.md#fair-share).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchConfig {
    /// Fair share across (app, scope) pairs, weighted by the policies' `weight` (the
    /// default). `false` restores oldest-first across everything, priority ignored.
    pub fairness: bool,
    /// What one priority level is worth in waiting time (ageing): a task of priority
    /// `p` starts as if it had been submitted `(p − 5) × ageing_step` earlier.
    #[serde(with = "duration_text")]
    pub ageing_step: Duration,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            fairness: true,
            ageing_step: tollgate_core::DEFAULT_AGEING_STEP,
        }
    }
}

impl DispatchConfig {
    /// The store's claim order for this configuration.
    pub fn claim_order(&self) -> tollgate_store::ClaimOrder {
        if self.fairness {
            tollgate_store::ClaimOrder::Fair
        } else {
            tollgate_store::ClaimOrder::Oldest
        }
    }
}

/// docs/conformance.md#provider-pace provider pace, on a `[providers.<name>]` or a `[models.<id>]` entry: what all
/// replicas together may send per `pace_window` (one minute unless shortened).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaceLimits {
    /// Calls per window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<Limit>,
    /// Model tokens (input bound + output bound, settled with the reported usage) per
    /// window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<Limit>,
}

impl PaceLimits {
    /// Whether any limit is set.
    pub fn is_set(&self) -> bool {
        self.requests_per_minute.is_some() || self.tokens_per_minute.is_some()
    }

    pub(super) fn fields(&self) -> [(&'static str, Option<Limit>); 2] {
        [
            ("requests_per_minute", self.requests_per_minute),
            ("tokens_per_minute", self.tokens_per_minute),
        ]
    }
}

/// The window the per-minute pace limits are measured over (one minute; tests shorten
/// it to run a minute's pace in seconds).
pub fn default_pace_window() -> Duration {
    Duration::from_secs(60)
}
