//! Row shapes of the webhook tables and the columns that select them.

use super::{app_id, corrupt, event_type};
use crate::StoreResult;
use crate::webhooks::{DeliveryState, WebhookDelivery, WebhookEndpoint};
use tollgate_core::Timestamp;
use tollgate_core::webhook::budget::parse_thresholds;
use tollgate_core::webhook::{WebhookEvent, parse_subscription};

/// An endpoint as stored.
#[derive(sqlx::FromRow)]
pub(crate) struct EndpointRow {
    id: String,
    app: String,
    url: String,
    secret: String,
    events: String,
    budget_thresholds: String,
    enabled: bool,
    description: Option<String>,
    from_config: bool,
    created_at: i64,
    updated_at: i64,
}

pub(super) const ENDPOINT_COLUMNS: &str = "id, app, url, secret, events, budget_thresholds, enabled, description, \
     from_config, created_at, updated_at";

impl EndpointRow {
    pub(super) fn into_endpoint(self) -> StoreResult<WebhookEndpoint> {
        Ok(WebhookEndpoint {
            id: self.id,
            app: app_id(self.app)?,
            url: self.url,
            secret: self.secret,
            events: parse_subscription(&self.events),
            budget_thresholds: parse_thresholds(&self.budget_thresholds),
            enabled: self.enabled,
            description: self.description,
            from_config: self.from_config,
            created_at: Timestamp(self.created_at),
            updated_at: Timestamp(self.updated_at),
        })
    }
}

/// A delivery with its event's type.
#[derive(sqlx::FromRow)]
pub(crate) struct DeliveryRow {
    id: String,
    event_id: String,
    event_type: String,
    endpoint_id: String,
    app: String,
    state: String,
    attempts: i64,
    next_at: i64,
    first_attempt_at: Option<i64>,
    last_attempt_at: Option<i64>,
    response_code: Option<i64>,
    last_error: Option<String>,
    replay_of: Option<String>,
    created_at: i64,
    delivered_at: Option<i64>,
}

pub(super) const DELIVERY_COLUMNS: &str = "d.id, d.event_id, v.type AS event_type, d.endpoint_id, d.app, \
     d.state, d.attempts, d.next_at, d.first_attempt_at, d.last_attempt_at, d.response_code, \
     d.last_error, d.replay_of, d.created_at, d.delivered_at";

impl DeliveryRow {
    pub(super) fn into_delivery(self) -> StoreResult<WebhookDelivery> {
        Ok(WebhookDelivery {
            id: self.id,
            event_id: self.event_id,
            event_type: event_type(&self.event_type)?,
            endpoint_id: self.endpoint_id,
            app: app_id(self.app)?,
            state: DeliveryState::parse(&self.state)
                .ok_or_else(|| corrupt("delivery state", &self.state))?,
            attempts: u32::try_from(self.attempts).unwrap_or(u32::MAX),
            next_at: Timestamp(self.next_at),
            first_attempt_at: self.first_attempt_at.map(Timestamp),
            last_attempt_at: self.last_attempt_at.map(Timestamp),
            response_code: self.response_code.and_then(|c| u16::try_from(c).ok()),
            last_error: self.last_error,
            replay_of: self.replay_of,
            created_at: Timestamp(self.created_at),
            delivered_at: self.delivered_at.map(Timestamp),
        })
    }
}

/// An event, its columns prefixed `ev_` so it flattens beside a delivery.
#[derive(sqlx::FromRow)]
pub(crate) struct EventRow {
    ev_id: String,
    ev_app: String,
    ev_type: String,
    ev_task_id: Option<String>,
    ev_run_id: Option<String>,
    ev_scope: Option<String>,
    ev_state: Option<String>,
    ev_error_code: Option<String>,
    ev_data: Option<String>,
    ev_created_at: i64,
}

pub(super) const EVENT_COLUMNS: &str = "v.id AS ev_id, v.app AS ev_app, v.type AS ev_type, \
     v.task_id AS ev_task_id, v.run_id AS ev_run_id, v.scope AS ev_scope, v.state AS ev_state, \
     v.error_code AS ev_error_code, v.data AS ev_data, v.created_at AS ev_created_at";

impl EventRow {
    pub(super) fn into_event(self) -> StoreResult<WebhookEvent> {
        Ok(WebhookEvent {
            id: self.ev_id,
            app: self.ev_app,
            event_type: event_type(&self.ev_type)?,
            task_id: self.ev_task_id,
            run_id: self.ev_run_id,
            scope: self.ev_scope,
            state: self.ev_state,
            error_code: self.ev_error_code,
            data: self
                .ev_data
                .map(|d| serde_json::from_str(&d).map_err(|e| corrupt("event data", e)))
                .transpose()?,
            created_at: Timestamp(self.ev_created_at),
        })
    }
}

/// A leased delivery: the delivery, its event and its endpoint's address and secret.
#[derive(sqlx::FromRow)]
pub(crate) struct LeasedRow {
    #[sqlx(flatten)]
    pub(super) delivery: DeliveryRow,
    #[sqlx(flatten)]
    pub(super) event: EventRow,
    pub(super) url: String,
    pub(super) secret: String,
}
