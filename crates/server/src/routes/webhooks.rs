//! `/v1/webhooks…`: an app's webhook endpoints, their deliveries and replays
//! (docs/webhooks.md).

use super::{NoParams, SMALL_BODY_LIMIT, StrictQuery, json_body, view};
use crate::AppState;
use crate::auth::Caller;
use crate::error::ApiError;
use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Deserializer, Serialize};
use tollgate_core::InvalidInput;
use tollgate_core::webhook::WebhookEventType;
use tollgate_core::webhook::budget::BudgetThreshold;
use tollgate_engine::{CallerView, WebhookChange, WebhookInput};
use tollgate_store::webhooks::{DeliveryQuery, DeliveryState, WebhookDelivery, WebhookEndpoint};
use utoipa::ToSchema;

/// An event type an endpoint may receive.
#[derive(Debug, ToSchema)]
#[allow(dead_code)]
pub enum WebhookEventName {
    /// A task finished with an output.
    #[schema(rename = "task.succeeded")]
    TaskSucceeded,
    /// A task finished with an error.
    #[schema(rename = "task.failed")]
    TaskFailed,
    /// A task was canceled.
    #[schema(rename = "task.canceled")]
    TaskCanceled,
    /// A run finished (succeeded, failed or canceled).
    #[schema(rename = "run.finished")]
    RunFinished,
    /// A scope's or the app's settled spend in a 24 h window reached one of the endpoint's
    /// `budget_thresholds` of a USD limit.
    #[schema(rename = "budget.threshold")]
    BudgetThreshold,
}

/// Where a delivery stands.
#[derive(Debug, ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum DeliveryStateName {
    /// Not delivered yet; due at `next_at`.
    Pending,
    /// The endpoint answered 2xx.
    Delivered,
    /// Retried for the whole retry schedule without success.
    Dead,
}

/// The schema of `budget_thresholds`: 1 to 10 shares of a USD limit, each from one basis
/// point to 1 (core's rule, [`tollgate_core::webhook::budget`]), or `null` for the default.
fn budget_thresholds_schema() -> utoipa::openapi::schema::Array {
    use tollgate_core::webhook::budget::{MAX_THRESHOLDS, MIN_THRESHOLD};
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, SchemaType, Type};
    ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(
            ObjectBuilder::new()
                .schema_type(Type::Number)
                .minimum(Some(MIN_THRESHOLD))
                .maximum(Some(1.0)),
        )
        .min_items(Some(1))
        .max_items(Some(MAX_THRESHOLDS))
        .description(Some(
            "The shares of a USD limit `budget.threshold` is sent for: each from 0.0001 \
             (one basis point) to 1, kept to the nearest basis point (default `[0.8]`).",
        ))
        .build()
}

/// `POST /v1/webhooks` body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookBody {
    /// Where deliveries are POSTed: `https` (or `http` where the operator allows it), not
    /// an internal address unless the operator allows its network.
    #[schema(max_length = 2048)]
    pub url: String,
    /// The event types it receives (at least one).
    #[schema(value_type = Vec<WebhookEventName>, min_items = 1)]
    pub events: Vec<String>,
    /// The shares of a USD limit (above 0, at most 1) `budget.threshold` is sent for
    /// (default `[0.8]`).
    #[serde(default)]
    #[schema(schema_with = budget_thresholds_schema)]
    pub budget_thresholds: Option<Vec<f64>>,
    /// Free text (at most 500 characters).
    #[serde(default)]
    #[schema(max_length = 500)]
    pub description: Option<String>,
    /// Whether it receives deliveries (default true).
    #[serde(default)]
    pub enabled: Option<bool>,
    /// The signing secret, `whsec_<base64 of 24 to 64 bytes>`; one is made when absent.
    #[serde(default)]
    #[schema(pattern = r"^whsec_[A-Za-z0-9+/=]+$")]
    pub secret: Option<String>,
}

fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

/// `PATCH /v1/webhooks/{id}` body: each field given replaces that field.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WebhookPatchBody {
    /// New url.
    #[serde(default)]
    #[schema(max_length = 2048)]
    pub url: Option<String>,
    /// New event types.
    #[serde(default)]
    #[schema(value_type = Option<Vec<WebhookEventName>>, min_items = 1)]
    pub events: Option<Vec<String>>,
    /// New budget thresholds.
    #[serde(default)]
    #[schema(schema_with = budget_thresholds_schema)]
    pub budget_thresholds: Option<Vec<f64>>,
    /// New description (`null` clears it).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, max_length = 500)]
    pub description: Option<Option<String>>,
    /// Enable or disable.
    #[serde(default)]
    pub enabled: Option<bool>,
    /// New signing secret (`whsec_…`).
    #[serde(default)]
    #[schema(pattern = r"^whsec_[A-Za-z0-9+/=]+$")]
    pub secret: Option<String>,
}

/// A webhook endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookView {
    /// Endpoint id (`whe_…`; `cfg_<app>_<name>` for the configuration file's).
    pub id: String,
    /// Where deliveries go.
    pub url: String,
    /// The event types it receives.
    #[schema(value_type = Vec<WebhookEventName>)]
    pub events: Vec<String>,
    /// The shares of a USD limit `budget.threshold` is sent for, ascending.
    pub budget_thresholds: Vec<f64>,
    /// Whether it receives deliveries.
    pub enabled: bool,
    /// Free text.
    #[schema(required = true)]
    pub description: Option<String>,
    /// From the configuration file: read-only here.
    pub from_config: bool,
    /// The signing secret (on creation and when reading one endpoint; not in listings).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub secret: Option<String>,
    /// Creation time (RFC 3339, UTC).
    pub created_at: String,
    /// Last change.
    pub updated_at: String,
}

impl WebhookView {
    fn of(e: &WebhookEndpoint, with_secret: bool) -> WebhookView {
        WebhookView {
            id: e.id.clone(),
            url: e.url.clone(),
            events: e.events.iter().map(|t| t.as_str().to_string()).collect(),
            budget_thresholds: e.budget_thresholds.iter().map(|t| t.fraction()).collect(),
            enabled: e.enabled,
            description: e.description.clone(),
            from_config: e.from_config,
            secret: with_secret.then(|| e.secret.clone()),
            created_at: e.created_at.to_rfc3339(),
            updated_at: e.updated_at.to_rfc3339(),
        }
    }
}

/// `GET /v1/webhooks` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookListView {
    /// The app's endpoints, oldest first.
    pub webhooks: Vec<WebhookView>,
}

/// One delivery of an event to an endpoint.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryView {
    /// Delivery id.
    pub id: String,
    /// The event: the `webhook-id` header of every attempt (and replay) of it.
    pub event_id: String,
    /// What happened.
    #[schema(value_type = WebhookEventName)]
    pub event_type: String,
    /// The endpoint.
    pub endpoint_id: String,
    /// `pending`, `delivered` or `dead`.
    #[schema(value_type = DeliveryStateName)]
    pub state: String,
    /// Attempts made.
    pub attempts: u32,
    /// When a pending delivery is due.
    pub next_at: String,
    /// The HTTP status of the last answer, if one came.
    #[schema(required = true)]
    pub response_code: Option<u16>,
    /// Why the last attempt failed.
    #[schema(required = true)]
    pub last_error: Option<String>,
    /// When the last attempt ended.
    #[schema(required = true)]
    pub last_attempt_at: Option<String>,
    /// When the endpoint took it.
    #[schema(required = true)]
    pub delivered_at: Option<String>,
    /// The delivery this one replays.
    #[schema(required = true)]
    pub replay_of: Option<String>,
    /// Creation time.
    pub created_at: String,
}

impl From<&WebhookDelivery> for DeliveryView {
    fn from(d: &WebhookDelivery) -> Self {
        DeliveryView {
            id: d.id.clone(),
            event_id: d.event_id.clone(),
            event_type: d.event_type.as_str().to_string(),
            endpoint_id: d.endpoint_id.clone(),
            state: d.state.as_str().to_string(),
            attempts: d.attempts,
            next_at: d.next_at.to_rfc3339(),
            response_code: d.response_code,
            last_error: d.last_error.clone(),
            last_attempt_at: d.last_attempt_at.map(|t| t.to_rfc3339()),
            delivered_at: d.delivered_at.map(|t| t.to_rfc3339()),
            replay_of: d.replay_of.clone(),
            created_at: d.created_at.to_rfc3339(),
        }
    }
}

/// `GET /v1/webhooks/{id}/deliveries` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeliveryListView {
    /// The endpoint's deliveries, newest first.
    pub deliveries: Vec<DeliveryView>,
}

fn events(names: Vec<String>) -> Result<Vec<WebhookEventType>, InvalidInput> {
    names.iter().map(|n| WebhookEventType::parse(n)).collect()
}

fn thresholds(values: Vec<f64>) -> Result<Vec<BudgetThreshold>, InvalidInput> {
    values
        .into_iter()
        .map(BudgetThreshold::from_fraction)
        .collect()
}

async fn endpoint(view: &CallerView, id: &str) -> Result<WebhookEndpoint, ApiError> {
    view.get_webhook(id)
        .await?
        .ok_or_else(|| ApiError::not_found("webhook"))
}

#[utoipa::path(post, path = "/v1/webhooks", tag = "webhooks", request_body = WebhookBody,
    responses((status = 201, body = WebhookView, description = "the endpoint, with its signing secret")),
    security(("api_key" = [])))]
pub(crate) async fn create_webhook(
    State(s): State<AppState>,
    headers: HeaderMap,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Response, ApiError> {
    let body: WebhookBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let created = view(&s, &caller)
        .create_webhook(WebhookInput {
            url: body.url,
            events: events(body.events)?,
            budget_thresholds: body.budget_thresholds.map(thresholds).transpose()?,
            description: body.description,
            enabled: body.enabled,
            secret: body.secret,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(WebhookView::of(&created, true))).into_response())
}

#[utoipa::path(get, path = "/v1/webhooks", tag = "webhooks",
    responses((status = 200, body = WebhookListView, description = "the app's endpoints (without secrets)")),
    security(("api_key" = [])))]
pub(crate) async fn list_webhooks(
    State(s): State<AppState>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Json<WebhookListView>, ApiError> {
    let list = view(&s, &caller).list_webhooks().await?;
    Ok(Json(WebhookListView {
        webhooks: list.iter().map(|e| WebhookView::of(e, false)).collect(),
    }))
}

#[utoipa::path(get, path = "/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint id")),
    responses((status = 200, body = WebhookView, description = "the endpoint, with its signing secret"),
              (status = 404, body = crate::error::ErrorBody, description = "no such endpoint in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_webhook(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Json<WebhookView>, ApiError> {
    let e = endpoint(&view(&s, &caller), &id).await?;
    Ok(Json(WebhookView::of(&e, true)))
}

#[utoipa::path(patch, path = "/v1/webhooks/{id}", tag = "webhooks", request_body = WebhookPatchBody,
    params(("id" = String, Path, description = "the endpoint id")),
    responses((status = 200, body = WebhookView),
              (status = 404, body = crate::error::ErrorBody, description = "no such endpoint in the caller's app"),
              (status = 409, body = crate::error::ErrorBody, description = "the endpoint comes from the configuration file")),
    security(("api_key" = [])))]
pub(crate) async fn update_webhook(
    State(s): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Json<WebhookView>, ApiError> {
    let body: WebhookPatchBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let updated = view(&s, &caller)
        .update_webhook(
            &id,
            WebhookChange {
                url: body.url,
                events: body.events.map(events).transpose()?,
                budget_thresholds: body.budget_thresholds.map(thresholds).transpose()?,
                description: body.description,
                enabled: body.enabled,
                secret: body.secret,
            },
        )
        .await?
        .ok_or_else(|| ApiError::not_found("webhook"))?;
    Ok(Json(WebhookView::of(&updated, true)))
}

#[utoipa::path(delete, path = "/v1/webhooks/{id}", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint id")),
    responses((status = 204, description = "deleted, with its deliveries"),
              (status = 404, body = crate::error::ErrorBody, description = "no such endpoint in the caller's app"),
              (status = 409, body = crate::error::ErrorBody, description = "the endpoint comes from the configuration file")),
    security(("api_key" = [])))]
pub(crate) async fn delete_webhook(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<StatusCode, ApiError> {
    if view(&s, &caller).delete_webhook(&id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found("webhook"))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeliveryParams {
    state: Option<String>,
    limit: Option<u32>,
}

#[utoipa::path(get, path = "/v1/webhooks/{id}/deliveries", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint id"),
           ("state" = Option<DeliveryStateName>, Query, description = "only deliveries in this state"),
           ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "at most this many (default 50)")),
    responses((status = 200, body = DeliveryListView, description = "the endpoint's deliveries, newest first"),
              (status = 404, body = crate::error::ErrorBody, description = "no such endpoint in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn list_deliveries(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<DeliveryParams>,
) -> Result<Json<DeliveryListView>, ApiError> {
    let state = q
        .state
        .map(|s| {
            DeliveryState::parse(&s)
                .ok_or_else(|| InvalidInput::field("state", "must be pending, delivered or dead"))
        })
        .transpose()?;
    let limit = match q.limit {
        None => 50,
        Some(n @ 1..=500) => n,
        Some(_) => return Err(InvalidInput::field("limit", "must be from 1 to 500").into()),
    };
    let view = view(&s, &caller);
    endpoint(&view, &id).await?;
    let list = view
        .webhook_deliveries(&DeliveryQuery {
            endpoint_id: Some(id),
            state,
            limit,
            ..DeliveryQuery::default()
        })
        .await?;
    Ok(Json(DeliveryListView {
        deliveries: list.iter().map(DeliveryView::from).collect(),
    }))
}

#[utoipa::path(post, path = "/v1/webhooks/{id}/deliveries/{delivery}/replay", tag = "webhooks",
    params(("id" = String, Path, description = "the endpoint id"),
           ("delivery" = String, Path, description = "the delivery id")),
    responses((status = 201, body = DeliveryView, description = "a new pending delivery of the same event (same `webhook-id`), due now"),
              (status = 404, body = crate::error::ErrorBody, description = "no such delivery of this endpoint in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn replay_delivery(
    State(s): State<AppState>,
    Path((id, delivery)): Path<(String, String)>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Response, ApiError> {
    let view = view(&s, &caller);
    let of_endpoint = view
        .webhook_deliveries(&DeliveryQuery {
            id: Some(delivery.clone()),
            endpoint_id: Some(id),
            event_id: None,
            state: None,
            limit: 1,
        })
        .await?
        .len()
        == 1;
    if !of_endpoint {
        return Err(ApiError::not_found("delivery"));
    }
    let replay = view
        .replay_webhook_delivery(&delivery)
        .await?
        .ok_or_else(|| ApiError::not_found("delivery"))?;
    Ok((StatusCode::CREATED, Json(DeliveryView::from(&replay))).into_response())
}
