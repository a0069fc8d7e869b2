//! `GET /v1/stats` and spend (`GET /v1/usage`, `GET /v1/scopes/{scope}/usage`): the
//! app's numbers, from the database.

use super::listing::query;
use super::{NoParams, view};
use crate::AppState;
use crate::dto::Identifier;
use crate::error::ApiError;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde::Serialize;
use tollgate_core::ScopeId;
use tollgate_engine::{TaskStats, UsageReport};
use utoipa::ToSchema;

/// docs/conformance.md#cost-usage `GET /v1/scopes/{scope}/usage` and `GET /v1/usage` answer: spend and model
/// tokens in the 24 h window (settled: what ended tasks cost; reserved: the worst case
/// of tasks still queued or running), the limits in force, and what cache hits saved.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageReportView {
    /// The scope (absent: the whole app).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scope: Option<String>,
    /// Start of the window's oldest hourly bucket: the window read is 24 to 25 hours
    /// long (spend leaves it up to an hour late, never early).
    pub since: String,
    /// The server's now.
    pub now: String,
    /// What ended tasks cost, USD (failed and canceled attempts included).
    pub settled_usd: f64,
    /// Reserved by tasks not yet ended, USD.
    pub reserved_usd: f64,
    /// Model tokens ended tasks used.
    pub settled_tokens: u64,
    /// Model tokens reserved by tasks not yet ended.
    pub reserved_tokens: u64,
    /// Settled spend above its reservation (a provider reported more than the bound), USD.
    pub overrun_usd: f64,
    /// What cache hits saved, USD.
    pub saved_usd: f64,
    /// The USD limit of this window: the default policy's `usd_per_24_hours` for a scope,
    /// the app's for the app (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit_usd: Option<f64>,
    /// The default policy's `tokens_per_minute` (scope reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// The default policy's `token_burst` (scope reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_burst: Option<u32>,
    /// Model tokens in the scope's bucket now, out of `token_burst`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_available: Option<f64>,
    /// The policy the limits are of (scope reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
}

impl From<UsageReport> for UsageReportView {
    fn from(u: UsageReport) -> Self {
        let round = |usd: f64| (usd * 1e9).round() / 1e9;
        UsageReportView {
            scope: u.scope.map(|s| s.to_string()),
            since: u.since.to_rfc3339(),
            now: u.now.to_rfc3339(),
            settled_usd: round(u.settled_usd),
            reserved_usd: round(u.reserved_usd),
            settled_tokens: u.settled_tokens,
            reserved_tokens: u.reserved_tokens,
            overrun_usd: round(u.overrun_usd),
            saved_usd: round(u.saved_usd),
            limit_usd: u.limit_usd,
            tokens_per_minute: u.tokens_per_minute,
            token_burst: u.token_burst,
            tokens_available: u.tokens_available.map(|t| (t * 1000.0).round() / 1000.0),
            policy: u.policy_name.map(|p| p.to_string()),
        }
    }
}

#[utoipa::path(get, path = "/v1/scopes/{scope}/usage", tag = "scopes",
    params(("scope" = Identifier, Path, description = "the scope")),
    responses((status = 200, body = UsageReportView, description = "the scope's spend and tokens in the 24 h window (docs/conformance.md#cost-usage)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: spend counts every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn scope_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(scope): Path<String>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<UsageReportView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let scope = ScopeId::new(scope)?;
    let report = view(&s, &caller).usage(Some(&scope)).await?;
    Ok(Json(report.into()))
}

#[utoipa::path(get, path = "/v1/usage", tag = "discovery",
    responses((status = 200, body = UsageReportView, description = "the app's spend and tokens in the 24 h window, all scopes (docs/conformance.md#cost-usage)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: spend counts every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn app_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<UsageReportView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let report = view(&s, &caller).usage(None).await?;
    Ok(Json(report.into()))
}

/// Failures of one error code.
#[derive(Debug, Serialize, ToSchema)]
pub struct FailureCount {
    /// The error code.
    pub code: String,
    /// How many tasks ended with it.
    pub count: u64,
}

/// Tasks that finished in one minute of the stats window.
#[derive(Debug, Serialize, ToSchema)]
pub struct MinuteCountView {
    /// The minute's start (RFC 3339).
    pub start: String,
    /// Succeeded in it.
    pub succeeded: u64,
    /// Failed in it.
    pub failed: u64,
    /// Canceled in it.
    pub canceled: u64,
}

/// Claimed → finished times, in milliseconds.
#[derive(Debug, Serialize, ToSchema)]
pub struct LatencyView {
    /// Median.
    pub p50: i64,
    /// 90th percentile.
    pub p90: i64,
    /// 99th percentile.
    pub p99: i64,
}

/// `GET /v1/stats` answer: the app's tasks now and over the last hour, computed from the
/// database (per app, unlike `/metrics`, which counts the whole server).
#[derive(Debug, Serialize, ToSchema)]
pub struct StatsView {
    /// Always `database`: where these numbers come from.
    pub source: String,
    /// The window's length, in seconds (3600).
    pub window_seconds: u64,
    /// The window's start (RFC 3339).
    pub since: String,
    /// Tasks queued now.
    pub queued: u64,
    /// Tasks running now.
    pub running: u64,
    /// Tasks that succeeded in the window.
    pub succeeded: u64,
    /// Tasks that failed in the window.
    pub failed: u64,
    /// Tasks canceled in the window.
    pub canceled: u64,
    /// Tasks finished per minute over the window (the hour's average).
    pub throughput_per_minute: f64,
    /// The recent window's length, in seconds (60).
    pub recent_window_seconds: u64,
    /// Tasks finished per minute over the recent window: the current rate.
    pub recent_throughput_per_minute: f64,
    /// The window minute by minute, oldest first (60 buckets, the last one ending now):
    /// what finished in each.
    pub per_minute: Vec<MinuteCountView>,
    /// Failed and canceled tasks of the window by error code, most frequent first.
    pub failures_by_code: Vec<FailureCount>,
    /// Succeeded tasks of the window served from the cache.
    pub cache_hits: u64,
    /// `cache_hits / succeeded` (`null` when nothing succeeded).
    #[schema(required = true)]
    pub cache_hit_rate: Option<f64>,
    /// Provider latency: claimed → finished of tasks a worker ran in the window (`null`
    /// when none ran).
    #[schema(required = true)]
    pub latency_ms: Option<LatencyView>,
    /// True when the window held more than 10,000 finished tasks: the figures are of the
    /// newest 10,000.
    pub sampled: bool,
}

impl From<&TaskStats> for StatsView {
    fn from(t: &TaskStats) -> Self {
        let finished = t.succeeded + t.failed + t.canceled;
        let window = tollgate_engine::STATS_WINDOW.as_secs();
        let recent = tollgate_engine::STATS_RECENT_WINDOW;
        StatsView {
            source: "database".to_string(),
            window_seconds: window,
            since: t.since.to_rfc3339(),
            queued: t.queued,
            running: t.running,
            succeeded: t.succeeded,
            failed: t.failed,
            canceled: t.canceled,
            throughput_per_minute: ((finished as f64 * 60.0 / window as f64) * 100.0).round()
                / 100.0,
            recent_window_seconds: recent.as_secs(),
            recent_throughput_per_minute: t.per_minute.last().map_or(0.0, |m| {
                ((m.finished() as f64 * 60.0 / recent.as_secs_f64()) * 100.0).round() / 100.0
            }),
            per_minute: t
                .per_minute
                .iter()
                .map(|m| MinuteCountView {
                    start: m.start.to_rfc3339(),
                    succeeded: m.succeeded,
                    failed: m.failed,
                    canceled: m.canceled,
                })
                .collect(),
            failures_by_code: t
                .failures_by_code
                .iter()
                .map(|(code, count)| FailureCount {
                    code: code.clone(),
                    count: *count,
                })
                .collect(),
            cache_hits: t.cache_hits,
            cache_hit_rate: t.cache_hit_rate.map(|r| (r * 10_000.0).round() / 10_000.0),
            latency_ms: t
                .run_ms_percentiles
                .map(|[p50, p90, p99]| LatencyView { p50, p90, p99 }),
            sampled: t.sampled,
        }
    }
}

#[utoipa::path(get, path = "/v1/stats", tag = "discovery",
    responses((status = 200, body = StatsView, description = "the app's queue, throughput, failures, cache hit rate and latency over the last hour (from the database)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: stats count every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn stats(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<StatsView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let stats = view(&s, &caller).stats().await?;
    Ok(Json(StatsView::from(&stats)))
}
