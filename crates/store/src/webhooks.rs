//! Webhooks' storage (docs/webhooks.md): endpoints per app, the outbox of events (written
//! by the terminal moves of tasks and runs in their own transaction, see
//! `shared::webhooks`), and deliveries leased to one delivering replica at a time.

use crate::StoreResult;
use async_trait::async_trait;
use std::time::Duration;
use tollgate_core::webhook::budget::BudgetThreshold;
use tollgate_core::webhook::{RetrySchedule, WebhookEvent, WebhookEventType};
use tollgate_core::{AppId, Timestamp, WorkerId};

/// An endpoint as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookEndpoint {
    /// `whe_…` (API) or `cfg_<app>_<name>` (configuration file).
    pub id: String,
    /// The app whose events it receives.
    pub app: AppId,
    /// Where deliveries are POSTed.
    pub url: String,
    /// The signing secret, `whsec_<base64>`.
    pub secret: String,
    /// The event types it receives.
    pub events: Vec<WebhookEventType>,
    /// The shares of a USD limit it hears `budget.threshold` about, sorted.
    pub budget_thresholds: Vec<BudgetThreshold>,
    /// Disabled endpoints get no new deliveries and their pending ones wait.
    pub enabled: bool,
    /// Free text.
    pub description: Option<String>,
    /// It comes from the configuration file (read-only over the API).
    pub from_config: bool,
    /// When it was created.
    pub created_at: Timestamp,
    /// When it last changed.
    pub updated_at: Timestamp,
}

/// A new endpoint (its url and secret already checked by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct NewWebhookEndpoint {
    /// Its id (the engine makes one).
    pub id: String,
    /// Its app.
    pub app: AppId,
    /// Where deliveries go.
    pub url: String,
    /// `whsec_<base64>`.
    pub secret: String,
    /// The event types (at least one).
    pub events: Vec<WebhookEventType>,
    /// The shares of a USD limit it hears `budget.threshold` about (checked by the
    /// caller; empty means [`BudgetThreshold::DEFAULT`]).
    pub budget_thresholds: Vec<BudgetThreshold>,
    /// Whether it receives deliveries.
    pub enabled: bool,
    /// Free text.
    pub description: Option<String>,
    /// From the configuration file.
    pub from_config: bool,
}

/// A change to an endpoint: each `Some` replaces that field.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WebhookEndpointPatch {
    /// New url.
    pub url: Option<String>,
    /// New secret.
    pub secret: Option<String>,
    /// New event types.
    pub events: Option<Vec<WebhookEventType>>,
    /// New budget thresholds.
    pub budget_thresholds: Option<Vec<BudgetThreshold>>,
    /// Enable or disable.
    pub enabled: Option<bool>,
    /// New description (`Some(None)` clears it).
    pub description: Option<Option<String>>,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Not yet delivered; due at `next_at`.
    Pending,
    /// The endpoint answered 2xx.
    Delivered,
    /// Retried for the schedule's whole time without success (dead-lettered).
    Dead,
}

impl DeliveryState {
    /// The stored name.
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Dead => "dead",
        }
    }

    /// The state of a stored name.
    pub fn parse(s: &str) -> Option<DeliveryState> {
        match s {
            "pending" => Some(DeliveryState::Pending),
            "delivered" => Some(DeliveryState::Delivered),
            "dead" => Some(DeliveryState::Dead),
            _ => None,
        }
    }
}

/// One delivery of an event to an endpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookDelivery {
    /// `<event id>.<endpoint id>`, or `whd_…` for a replay.
    pub id: String,
    /// The event (its id is the `webhook-id` header).
    pub event_id: String,
    /// What happened.
    pub event_type: WebhookEventType,
    /// The endpoint.
    pub endpoint_id: String,
    /// The app.
    pub app: AppId,
    /// Where it stands.
    pub state: DeliveryState,
    /// Attempts made.
    pub attempts: u32,
    /// When it is due (pending deliveries).
    pub next_at: Timestamp,
    /// When its first attempt started.
    pub first_attempt_at: Option<Timestamp>,
    /// When its last attempt ended.
    pub last_attempt_at: Option<Timestamp>,
    /// The HTTP status of the last answer, if any came.
    pub response_code: Option<u16>,
    /// Why the last attempt failed.
    pub last_error: Option<String>,
    /// The delivery it replays.
    pub replay_of: Option<String>,
    /// When it was created.
    pub created_at: Timestamp,
    /// When the endpoint took it.
    pub delivered_at: Option<Timestamp>,
}

/// A delivery a replica holds: what to send and where.
#[derive(Debug, Clone, PartialEq)]
pub struct LeasedDelivery {
    /// The delivery.
    pub delivery: WebhookDelivery,
    /// The event it carries.
    pub event: WebhookEvent,
    /// The endpoint's url.
    pub url: String,
    /// The endpoint's secret.
    pub secret: String,
}

/// How one attempt went.
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptResult {
    /// The endpoint answered 2xx.
    Delivered {
        /// Its status.
        code: u16,
    },
    /// It did not (an error status, a timeout, no connection, an address refused).
    Failed {
        /// The status, when an answer came.
        code: Option<u16>,
        /// What went wrong.
        error: String,
    },
}

/// Query of [`WebhookStore::list_webhook_deliveries`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeliveryQuery {
    /// Only the delivery of this id.
    pub id: Option<String>,
    /// Only this endpoint's.
    pub endpoint_id: Option<String>,
    /// Only this event's.
    pub event_id: Option<String>,
    /// Only in this state.
    pub state: Option<DeliveryState>,
    /// At most this many (1 to 500), newest first.
    pub limit: u32,
}

/// Webhooks' storage, written once for both backends (`shared::webhooks`). Methods taking
/// an [`AppId`] see only that app's rows.
#[async_trait]
pub trait WebhookStore: Send + Sync {
    /// Creates an endpoint.
    async fn create_webhook_endpoint(
        &self,
        new: NewWebhookEndpoint,
    ) -> StoreResult<WebhookEndpoint>;

    /// The app's endpoints, oldest first.
    async fn list_webhook_endpoints(&self, app: &AppId) -> StoreResult<Vec<WebhookEndpoint>>;

    /// One endpoint of the app.
    async fn get_webhook_endpoint(
        &self,
        app: &AppId,
        id: &str,
    ) -> StoreResult<Option<WebhookEndpoint>>;

    /// Changes an endpoint of the app; `None` when it has none of that id.
    async fn update_webhook_endpoint(
        &self,
        app: &AppId,
        id: &str,
        patch: WebhookEndpointPatch,
    ) -> StoreResult<Option<WebhookEndpoint>>;

    /// Deletes an endpoint of the app and its deliveries; false when it had none.
    async fn delete_webhook_endpoint(&self, app: &AppId, id: &str) -> StoreResult<bool>;

    /// Makes the configuration file's endpoints exactly `endpoints`: each is created or
    /// updated by id, and every other endpoint from the configuration is deleted (with
    /// its deliveries). Endpoints made over the API are left alone.
    async fn sync_config_webhook_endpoints(
        &self,
        endpoints: Vec<NewWebhookEndpoint>,
    ) -> StoreResult<()>;

    /// The app's events, newest first (at most `limit`).
    async fn list_webhook_events(&self, app: &AppId, limit: u32) -> StoreResult<Vec<WebhookEvent>>;

    /// The app's deliveries, newest first.
    async fn list_webhook_deliveries(
        &self,
        app: &AppId,
        query: &DeliveryQuery,
    ) -> StoreResult<Vec<WebhookDelivery>>;

    /// Sends a delivery of the app again: a new pending delivery of the same event to the
    /// same endpoint, due now (the same `webhook-id`, so a receiver that deduplicates
    /// sees it once). `None` when the app has no such delivery.
    async fn replay_webhook_delivery(
        &self,
        app: &AppId,
        id: &str,
    ) -> StoreResult<Option<WebhookDelivery>>;

    /// Leases up to `limit` due pending deliveries of enabled endpoints for `lease`, at
    /// most `per_app` of one app, none of the apps in `skip_apps`. A delivery is held by
    /// one replica at a time; one whose lease ran out (its replica died) is due again.
    async fn lease_webhook_deliveries(
        &self,
        worker: &WorkerId,
        lease: Duration,
        limit: u32,
        per_app: u32,
        skip_apps: &[AppId],
    ) -> StoreResult<Vec<LeasedDelivery>>;

    /// Records an attempt of a delivery `worker` holds and gives the lease up: delivered,
    /// or failed — then due again after the schedule's wait (`random` in 0..1 draws the
    /// jitter) or dead-lettered once the schedule's time is up. False (nothing changed)
    /// when `worker` no longer holds it.
    async fn record_webhook_attempt(
        &self,
        id: &str,
        worker: &WorkerId,
        result: AttemptResult,
        schedule: &RetrySchedule,
        random: f64,
    ) -> StoreResult<bool>;

    /// Gives up the lease of a delivery `worker` holds without an attempt (due again at
    /// once).
    async fn release_webhook_delivery(&self, id: &str, worker: &WorkerId) -> StoreResult<bool>;
}
