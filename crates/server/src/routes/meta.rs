//! Discovery (`/v1/kinds`, `/v1/models`), `/openapi.json`, health, `/metrics`.

use super::{NoParams, StrictQuery};
use crate::AppState;
use crate::auth::{Caller, single_header};
use crate::dto::KindName;
use crate::error::ApiError;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;
use tollgate_core::TaskKind;
use tollgate_core::kinds::{output_schema, request_schema};
use utoipa::ToSchema;

/// One kind's published schemas.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindView {
    /// The kind.
    #[schema(value_type = KindName)]
    pub kind: String,
    /// JSON Schema of its request object.
    #[schema(value_type = Object)]
    pub request_schema: Value,
    /// JSON Schema of its output.
    #[schema(value_type = Object)]
    pub output_schema: Value,
}

/// `GET /v1/kinds` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct KindsAnswer {
    /// Every kind, in documentation order.
    pub kinds: Vec<KindView>,
}

/// One configured model.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelView {
    /// The id callers use.
    pub id: String,
    /// Provider name.
    pub provider: String,
    /// Provider's model name.
    pub model: String,
    /// Hash of the resolved configuration (changes invalidate cached results).
    pub config_hash: String,
    /// Whether it is the default model.
    pub default: bool,
    /// docs/conformance.md#cost-prices: its prices (`null`: unpriced, its costs are unknown); a
    /// route's first deployment's.
    #[schema(required = true)]
    pub prices: Option<PricesView>,
    /// docs/routes.md: its route — `provider` and `model` above are its first deployment.
    pub route: RouteView,
}

/// docs/routes.md: a model id's route (never its providers' keys).
#[derive(Debug, Serialize, ToSchema)]
pub struct RouteView {
    /// How each call's deployment is picked: `fallback` (in order) or `weighted`.
    #[schema(value_type = String, example = "fallback")]
    pub strategy: &'static str,
    /// Its deployments, in order (one for a single-deployment model).
    pub deployments: Vec<DeploymentView>,
    /// How long a failed deployment is skipped, in milliseconds.
    pub cooldown_ms: u64,
    /// The longest one call may take before the route moves on, in milliseconds (`null`:
    /// the provider's own timeout).
    #[schema(required = true)]
    pub attempt_timeout_ms: Option<u64>,
}

/// One deployment of a route.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeploymentView {
    /// `provider/model`: the name its cooldown, pace and metrics go by.
    pub name: String,
    /// Provider name.
    pub provider: String,
    /// Provider's model name.
    pub model: String,
    /// Its share of a `weighted` route's calls.
    pub weight: u32,
    /// Its prices (`null`: unpriced).
    #[schema(required = true)]
    pub prices: Option<PricesView>,
}

impl From<&tollgate_core::Route> for RouteView {
    fn from(r: &tollgate_core::Route) -> Self {
        RouteView {
            strategy: r.strategy.as_str(),
            deployments: r
                .deployments
                .iter()
                .map(|d| DeploymentView {
                    name: d.name(),
                    provider: d.provider.clone(),
                    model: d.model.clone(),
                    weight: d.weight,
                    prices: d.prices.as_ref().map(Into::into),
                })
                .collect(),
            cooldown_ms: r.cooldown_ms,
            attempt_timeout_ms: r.attempt_timeout_ms,
        }
    }
}

/// A model's prices, US dollars per million tokens.
#[derive(Debug, Serialize, ToSchema)]
pub struct PricesView {
    /// Per million input tokens neither read from nor written to the provider's prompt
    /// cache.
    pub input_usd_per_million: f64,
    /// Per million output tokens.
    pub output_usd_per_million: f64,
    /// Per million input tokens served from the provider's prompt cache.
    pub cached_input_usd_per_million: f64,
    /// Per million input tokens written to the provider's prompt cache (docs/providers.md).
    pub cache_write_input_usd_per_million: f64,
}

impl From<&tollgate_core::Prices> for PricesView {
    fn from(p: &tollgate_core::Prices) -> Self {
        // Pico-dollars per token are micro-dollars per million tokens.
        let usd = |pico: u64| pico as f64 / 1e6;
        PricesView {
            input_usd_per_million: usd(p.input),
            output_usd_per_million: usd(p.output),
            cached_input_usd_per_million: usd(p.cached_input),
            cache_write_input_usd_per_million: usd(p.cache_write_input),
        }
    }
}

/// `GET /v1/models` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ModelsAnswer {
    /// Configured models.
    pub models: Vec<ModelView>,
}

#[utoipa::path(get, path = "/v1/kinds", tag = "discovery",
    responses((status = 200, body = KindsAnswer)), security(("api_key" = [])))]
pub(crate) async fn kinds(
    _caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Json<KindsAnswer>, ApiError> {
    Ok(Json(KindsAnswer {
        kinds: TaskKind::ALL
            .into_iter()
            .map(|k| KindView {
                kind: k.as_str().to_string(),
                request_schema: request_schema(k),
                output_schema: output_schema(k),
            })
            .collect(),
    }))
}

#[utoipa::path(get, path = "/v1/models", tag = "discovery",
    responses((status = 200, body = ModelsAnswer)), security(("api_key" = [])))]
pub(crate) async fn models(
    State(s): State<AppState>,
    _caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Json<ModelsAnswer>, ApiError> {
    let registry = s.tollgate.models();
    let mut models = Vec::new();
    for id in registry.ids() {
        let m = registry.resolve(Some(&id))?;
        models.push(ModelView {
            id: id.to_string(),
            provider: m.model_ref.provider.clone(),
            model: m.model_ref.model.clone(),
            config_hash: m.config_hash.as_str().to_string(),
            default: &id == registry.default_id(),
            prices: m.prices.as_ref().map(Into::into),
            route: (&m.route).into(),
        });
    }
    Ok(Json(ModelsAnswer { models }))
}

pub(crate) async fn openapi(StrictQuery(NoParams {}): StrictQuery<NoParams>) -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        crate::openapi::openapi_json(),
    )
        .into_response()
}

pub(crate) async fn healthz(StrictQuery(NoParams {}): StrictQuery<NoParams>) -> Response {
    Json(serde_json::json!({"status": "ok"})).into_response()
}

/// Longest `/readyz` waits for the database: a probe must get an answer, not a hang.
const READY_BOUND: std::time::Duration = std::time::Duration::from_secs(3);

pub(crate) async fn readyz(
    State(s): State<AppState>,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Response {
    let unavailable = |why: String| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "database_unavailable", why).into_response()
    };
    match tokio::time::timeout(READY_BOUND, s.tollgate.ping()).await {
        Ok(Ok(())) => Json(serde_json::json!({"status": "ready"})).into_response(),
        Ok(Err(e)) => ApiError::internal(
            StatusCode::SERVICE_UNAVAILABLE,
            "database_unavailable",
            format!("the database does not answer: {e}"),
        )
        .into_response(),
        Err(_) => unavailable(format!(
            "the database did not answer within {}s",
            READY_BOUND.as_secs()
        )),
    }
}

/// `/metrics` on the API's address: not there when it has its own (`[metrics] addr`).
pub(crate) async fn metrics(
    State(s): State<AppState>,
    headers: HeaderMap,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Response, ApiError> {
    if s.metrics_access.elsewhere {
        return Err(ApiError::not_found("route"));
    }
    render_metrics(&s, &headers)
}

/// `/metrics` on its own address.
pub(crate) async fn metrics_only(
    State(s): State<AppState>,
    headers: HeaderMap,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Response, ApiError> {
    render_metrics(&s, &headers)
}

/// The Prometheus text, to a caller with the `[metrics]` token when one is configured
/// (docs/api.md, "Metrics"). The series carry no tenant-chosen label value unless the
/// operator opted in (`[metrics] app_labels`).
fn render_metrics(s: &AppState, headers: &HeaderMap) -> Result<Response, ApiError> {
    if let Some(token) = &s.metrics_access.token {
        let given = single_header(headers, header::AUTHORIZATION.as_str())
            .ok()
            .flatten()
            .and_then(|t| {
                t.strip_prefix("Bearer ")
                    .or_else(|| t.strip_prefix("bearer "))
            })
            .map(str::trim)
            .unwrap_or_default();
        if !crate::auth::same_secret(given, token) {
            let mut refused = ApiError::unauthorized(
                "/metrics needs Authorization: Bearer <the [metrics] token>",
            )
            .into_response();
            refused.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                axum::http::HeaderValue::from_static("Bearer"),
            );
            return Ok(refused);
        }
    }
    let text = s.metrics.as_ref().map(|h| h.render()).unwrap_or_default();
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}
