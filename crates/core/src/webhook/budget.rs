//! Budget threshold events (docs/webhooks.md, "Budget thresholds"): the share of a USD
//! limit an endpoint wants to hear about, when a window's spend has crossed it, and the
//! stable id and data of the event. Pure rules; the store checks them in the settlement's
//! transaction.

use crate::cost::{SPEND_WINDOW_MS, nano_to_usd};
use crate::error::InvalidInput;
use crate::time::Timestamp;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Basis points in a whole limit (a threshold of 1.0).
pub const BASIS_POINTS: u16 = 10_000;

/// The smallest threshold: one basis point (0.01 %).
pub const MIN_THRESHOLD: f64 = 0.0001;

/// Most thresholds one endpoint may name.
pub const MAX_THRESHOLDS: usize = 10;

/// A share of a limit, kept exactly as basis points (0.8 = 8,000). Written as a number
/// from 0.0001 to 1 in the API and the configuration (`budget_thresholds = [0.8]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "f64", into = "f64")]
pub struct BudgetThreshold(u16);

impl BudgetThreshold {
    /// 80 %: the threshold of an endpoint that names none.
    pub const DEFAULT: BudgetThreshold = BudgetThreshold(8_000);

    /// The threshold of `fraction`: at least one basis point ([`MIN_THRESHOLD`]) and at most
    /// 1, kept to the nearest basis point (0.80004 is 0.8, 0.80006 is 0.8001).
    pub fn from_fraction(fraction: f64) -> Result<BudgetThreshold, InvalidInput> {
        if !fraction.is_finite() || !(MIN_THRESHOLD..=1.0).contains(&fraction) {
            return Err(InvalidInput::field(
                "budget_thresholds",
                format!(
                    "each must be at least {MIN_THRESHOLD} (one basis point) and at most 1 \
                     (0.8 = 80 %), got {fraction}"
                ),
            ));
        }
        let bp = (fraction * f64::from(BASIS_POINTS)).round();
        // In 1..=10,000 by the range check above.
        Ok(BudgetThreshold(bp as u16))
    }

    /// The threshold of a stored number of basis points.
    pub fn from_basis_points(bp: u16) -> Option<BudgetThreshold> {
        (1..=BASIS_POINTS)
            .contains(&bp)
            .then_some(BudgetThreshold(bp))
    }

    /// Basis points (8,000 for 0.8).
    pub fn basis_points(self) -> u16 {
        self.0
    }

    /// The share as a number (0.8).
    pub fn fraction(self) -> f64 {
        f64::from(self.0) / f64::from(BASIS_POINTS)
    }

    /// Whether `spent_nano` has reached this share of `limit_nano`.
    pub fn reached(self, spent_nano: i64, limit_nano: u64) -> bool {
        i128::from(spent_nano) * i128::from(BASIS_POINTS)
            >= i128::from(limit_nano) * i128::from(self.0)
    }
}

impl TryFrom<f64> for BudgetThreshold {
    type Error = InvalidInput;
    fn try_from(f: f64) -> Result<BudgetThreshold, InvalidInput> {
        BudgetThreshold::from_fraction(f)
    }
}

impl From<BudgetThreshold> for f64 {
    fn from(t: BudgetThreshold) -> f64 {
        t.fraction()
    }
}

/// An endpoint's thresholds, checked: 1 to [`MAX_THRESHOLDS`], sorted, without repeats.
pub fn check_thresholds(
    thresholds: &[BudgetThreshold],
) -> Result<Vec<BudgetThreshold>, InvalidInput> {
    if thresholds.is_empty() || thresholds.len() > MAX_THRESHOLDS {
        return Err(InvalidInput::field(
            "budget_thresholds",
            format!("name 1 to {MAX_THRESHOLDS} thresholds"),
        ));
    }
    let mut t = thresholds.to_vec();
    t.sort_unstable();
    t.dedup();
    Ok(t)
}

/// The stored form of thresholds: a JSON array of basis points (`[8000,10000]`).
pub fn thresholds_text(thresholds: &[BudgetThreshold]) -> String {
    let bps: Vec<u16> = thresholds.iter().map(|t| t.0).collect();
    serde_json::to_string(&bps).unwrap_or_else(|_| "[]".to_string())
}

/// The thresholds of their stored form (invalid entries are skipped).
pub fn parse_thresholds(text: &str) -> Vec<BudgetThreshold> {
    let mut t: Vec<BudgetThreshold> = serde_json::from_str::<Vec<u16>>(text)
        .unwrap_or_default()
        .into_iter()
        .filter_map(BudgetThreshold::from_basis_points)
        .collect();
    t.sort_unstable();
    t.dedup();
    t
}

/// Which limit a threshold is a share of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BudgetLimitKind {
    /// A scope's `usd_per_24_hours` (its budget policy's).
    ScopeUsd,
    /// The app's `usd_per_24_hours`, all scopes.
    AppUsd,
}

impl BudgetLimitKind {
    /// The stored and wire name.
    pub const fn as_str(self) -> &'static str {
        match self {
            BudgetLimitKind::ScopeUsd => "scope_usd_per_24_hours",
            BudgetLimitKind::AppUsd => "app_usd_per_24_hours",
        }
    }
}

/// One limit a settlement may have moved spend under: its kind, the app, the scope (for
/// a scope's limit) and its value.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BudgetLimit {
    /// The app.
    pub app: String,
    /// Which limit.
    pub kind: BudgetLimitKind,
    /// The scope, for [`BudgetLimitKind::ScopeUsd`] (empty for the app's).
    pub scope: String,
    /// The limit in nano-dollars.
    pub limit_nano: u64,
}

/// The first instant of the 24 h spend window at `now`, as admission counts it (the
/// hour of `now − 24 h`).
pub fn window_start(now: Timestamp) -> Timestamp {
    Timestamp(crate::cost::window_first_bucket(now) * crate::cost::SPEND_BUCKET_MS)
}

/// Whether a threshold crossed in the window starting at `window` is a new event: its
/// last event (if any) was for a window that ended by then. So a threshold is announced at
/// most once per 24 h per limit, however long spend stays above it.
pub fn due_again(last_window: Option<i64>, window: Timestamp) -> bool {
    last_window.is_none_or(|last| last.saturating_add(SPEND_WINDOW_MS) <= window.0)
}

impl BudgetLimit {
    /// The stable id of the event of this limit's threshold crossed in the window starting
    /// at `window`: `evt_budget_<32 hex digits of SHA-256 of the key>`, so every replica
    /// that sees the crossing names the same event.
    pub fn event_id(&self, threshold: BudgetThreshold, window: Timestamp) -> String {
        let key = format!(
            "{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}\u{1f}{}",
            self.app,
            self.kind.as_str(),
            self.scope,
            self.limit_nano,
            threshold.0,
            window.0
        );
        let digest = Sha256::digest(key.as_bytes());
        format!("evt_budget_{}", hex::encode(&digest[..16]))
    }

    /// The event's `data` beyond its scope: app, limit, window start, threshold, spend and
    /// the limit's value.
    pub fn event_data(
        &self,
        threshold: BudgetThreshold,
        window: Timestamp,
        spent_nano: i64,
    ) -> serde_json::Value {
        serde_json::json!({
            "app": self.app,
            "limit": self.kind.as_str(),
            "window_start": window.to_rfc3339(),
            "threshold": threshold.fraction(),
            "spent_usd": nano_to_usd(spent_nano),
            "limit_usd": nano_to_usd(i64::try_from(self.limit_nano).unwrap_or(i64::MAX)),
        })
    }
}
