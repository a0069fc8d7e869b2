//! Tollgate's HTTP API: a thin axum skin over [`tollgate_engine::Tollgate`]. Routes,
//! authentication, error → status mapping, the OpenAPI document, `/metrics`,
//! `/healthz` and `/readyz`. No business rule lives here. `docs/api.md` describes every
//! endpoint.

#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod dto;
pub mod error;
mod list_routes;
mod openai;
mod openapi;
pub mod request_id;
mod routes;
mod serve;
mod ui;

pub use auth::{Auth, Caller, KeyConfig};
pub use config::TollgateConfig;
pub use error::ApiError;
pub use openapi::openapi_json;
pub use serve::{ConnectionTimeouts, serve};

use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use std::time::Duration;
use tollgate_engine::Tollgate;

/// Largest HTTP body of a single submission, whatever `max_request_bytes` says: the
/// request limit itself is enforced on the canonical stored bytes (SPEC §2); this only
/// bounds what is read off the socket.
pub fn body_limit(max_request_bytes: usize) -> usize {
    max_request_bytes.saturating_mul(4).max(1 << 20)
}

/// Largest HTTP body of a batch.
pub const BATCH_BODY_LIMIT: usize = 64 << 20;

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
