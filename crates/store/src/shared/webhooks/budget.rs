//! docs/webhooks.md, "Budget thresholds": the `budget.threshold` events a settlement
//! writes, in its own transaction, when it moves a scope's or an app's settled spend in
//! the 24 h window to a share of a USD limit an endpoint listens for.
//!
//! Exactly one event per crossing, however many replicas settle at once: every settlement
//! of a limit with listeners writes its spend buckets, then locks the limit's
//! `budget_alerts` rows (one per threshold, in key order: after the spend buckets in the
//! lock order, docs/locking.md), and only then reads the window's spend. Whoever locks
//! last reads every earlier settlement (they committed before releasing the row), so a
//! crossing is never missed; the row keeps the window of the threshold's last event, so
//! it is never announced twice within 24 h.

use super::subscribed_pattern;
use crate::shared::cost::{SettleRow, decode_reservation};
use crate::shared::sql::{Exec, Statement};
use crate::{StoreError, StoreResult};
use std::collections::{BTreeMap, BTreeSet};
use tollgate_core::Timestamp;
use tollgate_core::webhook::WebhookEventType;
use tollgate_core::webhook::budget::{
    BudgetLimit, BudgetLimitKind, BudgetThreshold, due_again, parse_thresholds, window_start,
};

/// An enabled endpoint listening for `budget.threshold`.
#[derive(sqlx::FromRow)]
struct Listener {
    id: String,
    budget_thresholds: String,
}

/// The USD limits the settled tasks were admitted under, for the tasks that were charged
/// something (a settlement that charges nothing moves no spend), in key order.
fn limits_moved(
    rows: &[SettleRow],
    charged: &[(String, i64, i64)],
) -> StoreResult<BTreeSet<BudgetLimit>> {
    let charged: BTreeMap<&str, i64> = charged.iter().map(|(id, n, _)| (id.as_str(), *n)).collect();
    let mut limits = BTreeSet::new();
    for row in rows {
        if charged.get(row.id.as_str()).copied().unwrap_or(0) <= 0 {
            continue;
        }
        let Some(l) = decode_reservation(&row.id, &row.reservation)?.limits else {
            continue;
        };
        if let Some(n) = l.scope_nano_per_24_hours {
            limits.insert(BudgetLimit {
                app: row.app.clone(),
                kind: BudgetLimitKind::ScopeUsd,
                scope: row.scope.clone(),
                limit_nano: n.get(),
            });
        }
        if let Some(n) = l.app_nano_per_24_hours {
            limits.insert(BudgetLimit {
                app: row.app.clone(),
                kind: BudgetLimitKind::AppUsd,
                scope: String::new(),
                limit_nano: n.get(),
            });
        }
    }
    Ok(limits)
}

/// The apps a settlement of `rows` charging `charged` may announce a crossing for, in
/// order: where [`record_budget_events`] looks for listeners. A settlement written
/// without it (PostgreSQL's completion in one statement) checks in its statement that
/// none of them has one ([`budget_listened!`]).
pub(crate) fn apps_announcing(
    rows: &[SettleRow],
    charged: &[(String, i64, i64)],
) -> StoreResult<Vec<String>> {
    let apps: BTreeSet<String> = limits_moved(rows, charged)?
        .into_iter()
        .map(|l| l.app)
        .collect();
    Ok(apps.into_iter().collect())
}

/// The `LIKE` pattern of endpoints that listen for `budget.threshold` (bound for
/// [`budget_listened!`]).
pub(crate) fn budget_listener_pattern() -> String {
    subscribed_pattern(WebhookEventType::BudgetThreshold.as_str())
}

/// Whether an enabled endpoint of an app in `$apps` (a `TEXT[]` placeholder) listens
/// for `budget.threshold` (`$pattern`: [`budget_listener_pattern`]), for `concat!`.
macro_rules! budget_listened {
    ($apps:literal, $pattern:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.app = ANY(",
            $apps,
            ") AND e.enabled AND e.events LIKE ",
            $pattern,
            ")"
        )
    };
}
pub(crate) use budget_listened;

/// Writes the `budget.threshold` events of a settlement (`rows` and what each was
/// `charged`), with one delivery per listening endpoint whose thresholds include the one
/// crossed. Runs in the settlement's transaction, after its spend buckets.
pub(crate) async fn record_budget_events<E: Exec + ?Sized>(
    tx: &mut E,
    rows: &[SettleRow],
    charged: &[(String, i64, i64)],
    now: Timestamp,
) -> StoreResult<()> {
    let limits = limits_moved(rows, charged)?;
    if limits.is_empty() {
        return Ok(());
    }
    let kind = WebhookEventType::BudgetThreshold.as_str();
    let mut listeners: BTreeMap<String, Vec<(String, Vec<BudgetThreshold>)>> = BTreeMap::new();
    for app in limits
        .iter()
        .map(|l| l.app.clone())
        .collect::<BTreeSet<_>>()
    {
        let found: Vec<Listener> = tx
            .all(
                Statement::new(
                    "SELECT id, budget_thresholds FROM webhook_endpoints \
                     WHERE app = $1 AND enabled AND events LIKE $2 ORDER BY id",
                )
                .bind(app.as_str())
                .bind(subscribed_pattern(kind)),
            )
            .await?;
        if !found.is_empty() {
            let found = found
                .into_iter()
                .map(|l| (l.id, parse_thresholds(&l.budget_thresholds)))
                .collect();
            listeners.insert(app, found);
        }
    }
    let window = window_start(now);
    for limit in &limits {
        let Some(endpoints) = listeners.get(&limit.app) else {
            continue;
        };
        let thresholds: BTreeSet<BudgetThreshold> = endpoints
            .iter()
            .flat_map(|(_, t)| t.iter().copied())
            .collect();
        let limit_nano = i64::try_from(limit.limit_nano).unwrap_or(i64::MAX);
        // Lock every threshold's row first, then read: see the module docs.
        let mut last = Vec::with_capacity(thresholds.len());
        for t in &thresholds {
            let (w,): (Option<i64>,) = tx
                .one(
                    Statement::new(
                        "INSERT INTO budget_alerts \
                           (app, kind, scope, limit_nano, threshold_bp, window_start) \
                         VALUES ($1, $2, $3, $4, $5, NULL) \
                         ON CONFLICT (app, kind, scope, limit_nano, threshold_bp) \
                         DO UPDATE SET window_start = budget_alerts.window_start \
                         RETURNING window_start",
                    )
                    .bind(limit.app.as_str())
                    .bind(limit.kind.as_str())
                    .bind(limit.scope.as_str())
                    .bind(limit_nano)
                    .bind(i64::from(t.basis_points())),
                )
                .await?;
            last.push((*t, w));
        }
        let spent = window_spend(tx, limit, now).await?;
        for (t, w) in last {
            if !t.reached(spent, limit.limit_nano) || !due_again(w, window) {
                continue;
            }
            announce(tx, limit, t, window, spent, endpoints, now).await?;
        }
    }
    Ok(())
}

/// Settled nano-dollars of the limit's window at `now` (the buckets admission reads).
async fn window_spend<E: Exec + ?Sized>(
    tx: &mut E,
    limit: &BudgetLimit,
    now: Timestamp,
) -> StoreResult<i64> {
    let first = tollgate_core::cost::window_first_bucket(now);
    let s = match limit.kind {
        BudgetLimitKind::ScopeUsd => Statement::new(
            "SELECT CAST(COALESCE(SUM(settled_nano), 0) AS BIGINT) FROM scope_spend \
             WHERE app = $1 AND scope = $2 AND bucket >= $3",
        )
        .bind(limit.app.as_str())
        .bind(limit.scope.as_str())
        .bind(first),
        BudgetLimitKind::AppUsd => Statement::new(
            "SELECT CAST(COALESCE(SUM(settled_nano), 0) AS BIGINT) FROM app_spend \
             WHERE app = $1 AND bucket >= $2",
        )
        .bind(limit.app.as_str())
        .bind(first),
    };
    let (spent,): (i64,) = tx.one(s).await?;
    Ok(spent)
}

/// Marks the threshold announced for `window` and writes its event and deliveries.
async fn announce<E: Exec + ?Sized>(
    tx: &mut E,
    limit: &BudgetLimit,
    t: BudgetThreshold,
    window: Timestamp,
    spent: i64,
    endpoints: &[(String, Vec<BudgetThreshold>)],
    now: Timestamp,
) -> StoreResult<()> {
    tx.run(
        Statement::new(
            "UPDATE budget_alerts SET window_start = $1 WHERE app = $2 AND kind = $3 \
             AND scope = $4 AND limit_nano = $5 AND threshold_bp = $6",
        )
        .bind(window.0)
        .bind(limit.app.as_str())
        .bind(limit.kind.as_str())
        .bind(limit.scope.as_str())
        .bind(i64::try_from(limit.limit_nano).unwrap_or(i64::MAX))
        .bind(i64::from(t.basis_points())),
    )
    .await?;
    let id = limit.event_id(t, window);
    let data = serde_json::to_string(&limit.event_data(t, window, spent))
        .map_err(|e| StoreError::Database(format!("cannot encode event data: {e}")))?;
    let scope = (limit.kind == BudgetLimitKind::ScopeUsd).then_some(limit.scope.as_str());
    let written = tx
        .run(
            Statement::new(
                "INSERT INTO webhook_events \
                   (id, app, type, task_id, run_id, scope, state, error_code, data, created_at) \
                 VALUES ($1, $2, $3, NULL, NULL, $4, NULL, NULL, $5, $6) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(id.as_str())
            .bind(limit.app.as_str())
            .bind(WebhookEventType::BudgetThreshold.as_str())
            .bind(scope)
            .bind(data)
            .bind(now.0),
        )
        .await?;
    if written == 0 {
        return Ok(());
    }
    for (endpoint, thresholds) in endpoints {
        if !thresholds.contains(&t) {
            continue;
        }
        tx.run(
            Statement::new(
                "INSERT INTO webhook_deliveries \
                   (id, event_id, endpoint_id, app, state, attempts, next_at, created_at) \
                 VALUES ($1 || '.' || $2, $1, $2, $3, 'pending', 0, $4, $4) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(id.as_str())
            .bind(endpoint.as_str())
            .bind(limit.app.as_str())
            .bind(now.0),
        )
        .await?;
    }
    Ok(())
}
