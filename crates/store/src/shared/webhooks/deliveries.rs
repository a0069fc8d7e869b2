//! The deliveries' side of [`Webhooks`]: events and deliveries listed, replays, leases
//! and attempts.

use super::rows::{DELIVERY_COLUMNS, DeliveryRow, EVENT_COLUMNS, EventRow, LeasedRow};
use super::{Webhooks, fetch_delivery, id_set};
use crate::StoreResult;
use crate::shared::sql::{Arg, Backend, Exec, Statement, TxExec};
use crate::webhooks::{
    AttemptResult, DeliveryQuery, DeliveryState, LeasedDelivery, WebhookDelivery,
};
use std::time::Duration;
use tollgate_core::webhook::{RetryDecision, RetrySchedule, WebhookEvent};
use tollgate_core::{AppId, Timestamp, WorkerId, time::duration_ms};

impl Webhooks {
    pub(crate) async fn list_events<B: Backend>(
        store: &B,
        app: &AppId,
        limit: u32,
    ) -> StoreResult<Vec<WebhookEvent>> {
        let rows: Vec<EventRow> = store
            .reader()
            .all(
                Statement::new(format!(
                    "SELECT {EVENT_COLUMNS} FROM webhook_events v WHERE v.app = $1 \
                     ORDER BY v.created_at DESC, v.id DESC LIMIT $2"
                ))
                .bind(app.as_str())
                .bind(i64::from(limit.clamp(1, 1000))),
            )
            .await?;
        rows.into_iter().map(EventRow::into_event).collect()
    }

    pub(crate) async fn list_deliveries<B: Backend>(
        store: &B,
        app: &AppId,
        query: &DeliveryQuery,
    ) -> StoreResult<Vec<WebhookDelivery>> {
        let mut s = Statement::new(format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d \
             JOIN webhook_events v ON v.id = d.event_id WHERE d.app = $1"
        ))
        .bind(app.as_str());
        if let Some(id) = &query.id {
            let p = s.placeholder(Arg::from(id.as_str()));
            s.push(&format!(" AND d.id = {p}"));
        }
        if let Some(endpoint) = &query.endpoint_id {
            let p = s.placeholder(Arg::from(endpoint.as_str()));
            s.push(&format!(" AND d.endpoint_id = {p}"));
        }
        if let Some(event) = &query.event_id {
            let p = s.placeholder(Arg::from(event.as_str()));
            s.push(&format!(" AND d.event_id = {p}"));
        }
        if let Some(state) = query.state {
            let p = s.placeholder(Arg::from(state.as_str()));
            s.push(&format!(" AND d.state = {p}"));
        }
        let p = s.placeholder(Arg::from(i64::from(query.limit.clamp(1, 500))));
        s.push(&format!(" ORDER BY d.created_at DESC, d.id DESC LIMIT {p}"));
        let rows: Vec<DeliveryRow> = store.reader().all(s).await?;
        rows.into_iter().map(DeliveryRow::into_delivery).collect()
    }

    pub(crate) async fn replay<B: Backend>(
        store: &B,
        app: &AppId,
        id: &str,
    ) -> StoreResult<Option<WebhookDelivery>> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let Some(original) = fetch_delivery(&mut tx, app, id).await? else {
            tx.rollback_tx().await?;
            return Ok(None);
        };
        let new_id = format!("whd_{}", uuid::Uuid::now_v7().simple());
        tx.run(
            Statement::new(
                "INSERT INTO webhook_deliveries (id, event_id, endpoint_id, app, state, attempts, \
                 next_at, replay_of, created_at) VALUES ($1, $2, $3, $4, 'pending', 0, $5, $6, $5)",
            )
            .bind(new_id.as_str())
            .bind(original.event_id.as_str())
            .bind(original.endpoint_id.as_str())
            .bind(app.as_str())
            .bind(now.0)
            .bind(id),
        )
        .await?;
        let replay = fetch_delivery(&mut tx, app, &new_id).await?;
        tx.commit_tx().await?;
        Ok(replay)
    }

    pub(crate) async fn lease<B: Backend>(
        store: &B,
        worker: &WorkerId,
        lease: Duration,
        limit: u32,
        per_app: u32,
        skip_apps: &[AppId],
    ) -> StoreResult<Vec<LeasedDelivery>> {
        if limit == 0 || per_app == 0 {
            return Ok(Vec::new());
        }
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let mut s = Statement::new("")
            .bind(worker.as_str())
            .bind(now.plus(lease).0)
            .bind(now.0)
            .bind(i64::from(per_app))
            .bind(i64::from(limit));
        let skip = if skip_apps.is_empty() {
            String::new()
        } else {
            let apps: Vec<String> = skip_apps.iter().map(|a| a.as_str().to_string()).collect();
            format!(" AND app NOT{}", id_set(&mut s, &apps))
        };
        s.push(&format!(
            "UPDATE webhook_deliveries SET leased_by = $1, lease_until = $2, \
               first_attempt_at = COALESCE(first_attempt_at, $3) \
             WHERE id IN ( \
               SELECT id FROM ( \
                 SELECT id, next_at, ROW_NUMBER() OVER (PARTITION BY app ORDER BY next_at, id) AS n \
                 FROM webhook_deliveries \
                 WHERE state = 'pending' AND next_at <= $3 \
                   AND (lease_until IS NULL OR lease_until <= $3){skip} \
                   AND EXISTS (SELECT 1 FROM webhook_endpoints e \
                     WHERE e.id = webhook_deliveries.endpoint_id AND e.enabled) \
               ) due WHERE n <= $4 ORDER BY next_at, id LIMIT $5) \
             AND state = 'pending' AND (lease_until IS NULL OR lease_until <= $3) \
             RETURNING id"
        ));
        let leased: Vec<(String,)> = tx.all(s).await?;
        if leased.is_empty() {
            tx.commit_tx().await?;
            return Ok(Vec::new());
        }
        let ids: Vec<String> = leased.into_iter().map(|(id,)| id).collect();
        let mut s = Statement::new("");
        let set = id_set(&mut s, &ids);
        s.push(&format!(
            "SELECT {DELIVERY_COLUMNS}, {EVENT_COLUMNS}, e.url, e.secret \
             FROM webhook_deliveries d JOIN webhook_events v ON v.id = d.event_id \
             JOIN webhook_endpoints e ON e.id = d.endpoint_id \
             WHERE d.id{set} ORDER BY d.next_at, d.id"
        ));
        let rows: Vec<LeasedRow> = tx.all(s).await?;
        tx.commit_tx().await?;
        rows.into_iter()
            .map(|r| {
                Ok(LeasedDelivery {
                    delivery: r.delivery.into_delivery()?,
                    event: r.event.into_event()?,
                    url: r.url,
                    secret: r.secret,
                })
            })
            .collect()
    }

    pub(crate) async fn record_attempt<B: Backend>(
        store: &B,
        id: &str,
        worker: &WorkerId,
        result: AttemptResult,
        schedule: &RetrySchedule,
        random: f64,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let held: Option<(i64, Option<i64>)> = tx
            .optional(
                Statement::new(
                    "SELECT attempts, first_attempt_at FROM webhook_deliveries \
                     WHERE id = $1 AND leased_by = $2 AND state = 'pending'",
                )
                .bind(id)
                .bind(worker.as_str()),
            )
            .await?;
        let Some((attempts, first)) = held else {
            tx.rollback_tx().await?;
            return Ok(false);
        };
        let attempts = attempts.saturating_add(1);
        let (state, next_at, code, error, delivered_at) = match result {
            AttemptResult::Delivered { code } => {
                (DeliveryState::Delivered, now, Some(code), None, Some(now.0))
            }
            AttemptResult::Failed { code, error } => {
                let elapsed = Duration::from_millis(
                    u64::try_from(now.0 - first.unwrap_or(now.0)).unwrap_or(0),
                );
                let n = u32::try_from(attempts).unwrap_or(u32::MAX);
                match schedule.after_failure(n, elapsed, random) {
                    RetryDecision::RetryAfter(wait) => (
                        DeliveryState::Pending,
                        Timestamp(now.0.saturating_add(duration_ms(wait))),
                        code,
                        Some(error),
                        None,
                    ),
                    RetryDecision::DeadLetter => {
                        (DeliveryState::Dead, now, code, Some(error), None)
                    }
                }
            }
        };
        tx.run(
            Statement::new(
                "UPDATE webhook_deliveries SET state = $1, attempts = $2, next_at = $3, \
                 response_code = $4, last_error = $5, last_attempt_at = $6, delivered_at = $7, \
                 leased_by = NULL, lease_until = NULL WHERE id = $8",
            )
            .bind(state.as_str())
            .bind(attempts)
            .bind(next_at.0)
            .bind(code.map(i64::from))
            .bind(error.map(|e| tollgate_core::truncate_message(&e)))
            .bind(now.0)
            .bind(delivered_at)
            .bind(id),
        )
        .await?;
        tx.commit_tx().await?;
        Ok(true)
    }

    pub(crate) async fn release<B: Backend>(
        store: &B,
        id: &str,
        worker: &WorkerId,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        let n = tx
            .run(
                Statement::new(
                    "UPDATE webhook_deliveries SET leased_by = NULL, lease_until = NULL \
                     WHERE id = $1 AND leased_by = $2 AND state = 'pending'",
                )
                .bind(id)
                .bind(worker.as_str()),
            )
            .await?;
        tx.commit_tx().await?;
        Ok(n > 0)
    }
}
