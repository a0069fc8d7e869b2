//! Tollgate's HTTP API: a thin axum skin over [`tollgate_engine::Tollgate`]. Routes,
//! authentication, error → status mapping, the OpenAPI document, `/metrics`,
//! `/healthz` and `/readyz`. No business rule lives here. `docs/api.md` describes every
//! endpoint.

#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod dto;
pub mod error;
mod memory;
mod openai;
mod openapi;
pub mod request_id;
mod routes;
mod serve;
pub mod telemetry;
mod ui;

pub use auth::{Auth, Caller, KeyConfig};
pub use config::TollgateConfig;
pub use error::ApiError;
pub use openapi::openapi_json;
pub use serve::{ConnectionTimeouts, serve};
pub use ui::UI_CSP;

use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::AppId;
use tollgate_engine::Tollgate;

/// Largest HTTP body of a single submission, whatever `max_request_bytes` says: the
/// request limit itself is enforced on the canonical stored bytes (docs/conformance.md#task-kinds); this only
/// bounds what is read off the socket.
pub fn body_limit(max_request_bytes: usize) -> usize {
    max_request_bytes.saturating_mul(4).max(1 << 20)
}

/// Default of `[server] max_batch_body_bytes`: the largest HTTP body of a batch.
pub const DEFAULT_BATCH_BODY_LIMIT: usize = 8 << 20;

/// Default of `[server] batches_per_app`: batch requests of one app answered at once.
pub const DEFAULT_BATCHES_PER_APP: usize = 2;

/// Who may read `/metrics`, and where (`[metrics]`; docs/api.md, "Metrics").
#[derive(Debug, Clone, Default)]
pub struct MetricsAccess {
    /// The bearer token `/metrics` requires, when one is configured.
    pub token: Option<Arc<str>>,
    /// `/metrics` is served on its own address ([`metrics_router`]), not on the API's.
    pub elsewhere: bool,
}

/// The bounds of `POST /v1/tasks/batch` (docs/api.md, "Batches"): its body's size, and
/// how many one app may have answered at once (each slot is held from before its body
/// is read until its answer is built).
#[derive(Debug, Clone)]
pub struct BatchLimits {
    /// Largest body, in bytes (`[server] max_batch_body_bytes`).
    pub max_body_bytes: usize,
    /// Batch requests of one app at once (`[server] batches_per_app`).
    pub per_app: usize,
    in_flight: Arc<Mutex<HashMap<AppId, usize>>>,
}

impl BatchLimits {
    /// Bounds with a fresh count of batches in flight.
    pub fn new(max_body_bytes: usize, per_app: usize) -> BatchLimits {
        BatchLimits {
            max_body_bytes,
            per_app,
            in_flight: Arc::default(),
        }
    }

    /// Takes one of `app`'s batch slots, or 429 `WORKFLOW_AI_TOO_MANY_BATCHES`.
    pub(crate) fn enter(&self, app: &AppId) -> Result<BatchSlot, ApiError> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let count = in_flight.entry(app.clone()).or_insert(0);
        if *count >= self.per_app {
            return Err(ApiError::too_many(
                error::TOO_MANY_BATCHES,
                format!(
                    "app `{app}` already has {} batch requests being answered, its limit of concurrent batches ([server] batches_per_app): retry when one is answered",
                    self.per_app
                ),
                Duration::from_secs(1),
            ));
        }
        *count += 1;
        Ok(BatchSlot {
            in_flight: self.in_flight.clone(),
            app: app.clone(),
        })
    }
}

impl Default for BatchLimits {
    fn default() -> Self {
        BatchLimits::new(DEFAULT_BATCH_BODY_LIMIT, DEFAULT_BATCHES_PER_APP)
    }
}

/// One batch request of an app in flight; given back on drop.
#[derive(Debug)]
pub(crate) struct BatchSlot {
    in_flight: Arc<Mutex<HashMap<AppId, usize>>>,
    app: AppId,
}

impl Drop for BatchSlot {
    fn drop(&mut self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(count) = in_flight.get_mut(&self.app) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                in_flight.remove(&self.app);
            }
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct AppState {
    /// The engine.
    pub tollgate: Tollgate,
    /// The key table.
    pub auth: Auth,
    /// Longest `?wait=`.
    pub max_wait: Duration,
    /// Longest a request body may take to arrive (`[server] body_read_timeout`).
    pub body_read_timeout: Duration,
    /// Prometheus renderer for `/metrics`, when a recorder is installed.
    pub metrics: Option<PrometheusHandle>,
    /// Who may read `/metrics`, and where.
    pub metrics_access: MetricsAccess,
    /// The bounds of batch requests.
    pub batches: BatchLimits,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("tollgate", &self.tollgate)
            .field("max_wait", &self.max_wait)
            .finish_non_exhaustive()
    }
}

/// The whole HTTP API.
pub fn router(state: AppState) -> Router {
    routes::router(state.clone()).merge(openai::router(state))
}

/// `/metrics` alone, for its own listen address (`[metrics] addr`).
pub fn metrics_router(state: AppState) -> Router {
    routes::metrics_router(state)
}
