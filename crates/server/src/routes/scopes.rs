//! `/v1/scopes/{scope}/…`: unreleased sources, owner-data deletion.

use super::listing::{PageParams, cursor, limit, query};
use super::{NoParams, StrictQuery, view};
use crate::AppState;
use crate::auth::Caller;
use crate::dto::Identifier;
use crate::error::ApiError;
use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use tollgate_core::{ScopeId, SourceId, StepKey};
use tollgate_engine::ScopeState;
use tollgate_store::{ScopedSource, UnreleasedQuery};
use utoipa::ToSchema;

/// A (scope, source) pair with unreleased application tasks.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnreleasedSourceView {
    /// Scope.
    pub scope: String,
    /// Source id.
    pub source: String,
}

/// `GET /v1/scopes/{scope}/unreleased-sources` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnreleasedPageView {
    /// Up to 100 sources, in order.
    pub sources: Vec<UnreleasedSourceView>,
    /// Pass as `after` for the next page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

/// `DELETE /v1/scopes/{scope}/tasks` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct DeletedAnswer {
    /// How many application-owned tasks were deleted.
    pub deleted: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnreleasedParams {
    step: Option<String>,
    after: Option<String>,
}

#[utoipa::path(get, path = "/v1/scopes/{scope}/unreleased-sources", tag = "scopes",
    params(("scope" = Identifier, Path, description = "the scope"),
           ("step" = Option<Identifier>, Query, description = "only tasks of this step"),
           ("after" = Option<Identifier>, Query, description = "the `next` of the previous page")),
    responses((status = 200, body = UnreleasedPageView)), security(("api_key" = [])))]
pub(crate) async fn unreleased_sources(
    State(s): State<AppState>,
    Path(scope): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<UnreleasedParams>,
) -> Result<Json<UnreleasedPageView>, ApiError> {
    let scope = ScopeId::new(scope)?;
    let query = UnreleasedQuery {
        scope: Some(scope.clone()),
        step: q.step.map(StepKey::new).transpose()?,
        after: q
            .after
            .map(|a| -> Result<ScopedSource, ApiError> {
                Ok(ScopedSource {
                    scope: scope.clone(),
                    source: SourceId::new(a)?,
                })
            })
            .transpose()?,
        limit: 0,
        subject: None,
    };
    let page = view(&s, &caller).list_unreleased_sources(&query).await?;
    Ok(Json(UnreleasedPageView {
        sources: page
            .sources
            .into_iter()
            .map(|p| UnreleasedSourceView {
                scope: p.scope.into_string(),
                source: p.source.into_string(),
            })
            .collect(),
        next: page.next.map(|c| c.source.into_string()),
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeleteParams {
    source: Option<String>,
}

#[utoipa::path(delete, path = "/v1/scopes/{scope}/tasks", tag = "scopes",
    params(("scope" = Identifier, Path, description = "the scope"),
           ("source" = Option<Identifier>, Query, description = "only this source's tasks")),
    responses((status = 200, body = DeletedAnswer)), security(("api_key" = [])))]
pub(crate) async fn delete_owner_data(
    State(s): State<AppState>,
    Path(scope): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<DeleteParams>,
) -> Result<Json<DeletedAnswer>, ApiError> {
    let scope = ScopeId::new(scope)?;
    let source = q.source.map(SourceId::new).transpose()?;
    let deleted = view(&s, &caller)
        .delete_owner_data(&scope, source.as_ref())
        .await?;
    Ok(Json(DeletedAnswer { deleted }))
}

/// The budget policy in force for a scope (docs/conformance.md#budget-policies): the app's default policy.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyView {
    /// The policy's name.
    pub name: String,
    /// Distinct logical steps one source may have admitted in 24 h.
    pub max_steps_per_source: u32,
    /// Distinct sources the scope may have admitted in 24 h.
    pub sources_per_24_hours: u32,
    /// Admitted tasks of the scope that may be queued or running at once.
    pub scope_concurrent: u32,
    /// Admitted tasks of the whole server that may be queued or running at once.
    pub global_concurrent: u32,
    /// Token-bucket capacity.
    pub burst: u32,
    /// Token-bucket refill, tasks per minute.
    pub tasks_per_minute: u32,
    /// docs/conformance.md#cost-limits: the scope's spend limit in 24 h, USD (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usd_per_24_hours: Option<f64>,
    /// docs/conformance.md#cost-limits: the scope's model-token bucket refill, tokens per minute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u32>,
    /// docs/conformance.md#cost-limits: the scope's model-token bucket capacity.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_burst: Option<u32>,
}

/// A scope's policy and live admission state (docs/conformance.md#admission, docs/conformance.md#listings).
#[derive(Debug, Serialize, ToSchema)]
pub struct ScopeView {
    /// The scope.
    pub scope: String,
    /// The policy in force (the app's default; a task may name another allowed one).
    pub policy: PolicyView,
    /// Tokens in the bucket now, out of `policy.burst` (fractions refill continuously).
    pub bucket_tokens: f64,
    /// Admitted tasks queued or running now, against `policy.scope_concurrent`.
    pub active: u64,
    /// Distinct sources admitted in the 24 h window, against `policy.sources_per_24_hours`.
    pub sources_in_window: u64,
    /// Distinct steps admitted in the window, all sources together.
    pub steps_in_window: u64,
    /// The most distinct steps any one source has in the window, against
    /// `policy.max_steps_per_source`.
    pub busiest_source_steps: u64,
    /// Admissions in the window.
    pub admissions_in_window: u64,
    /// The newest admission in the window.
    #[schema(required = true)]
    pub last_admitted_at: Option<String>,
    /// Spend and tokens in the window, settled plus reserved (docs/conformance.md#cost-usage; see
    /// `GET /v1/scopes/{scope}/usage` for the split).
    #[schema(required = true)]
    pub cost: Option<CostView>,
}

/// Spend and tokens of a scope (docs/conformance.md#cost-usage).
#[derive(Debug, Serialize, ToSchema)]
pub struct CostView {
    /// Settled plus reserved spend in the window, micro-dollars (US).
    pub spent_micros: u64,
    /// Settled plus reserved model tokens in the window.
    pub tokens: u64,
}

impl From<&ScopeState> for ScopeView {
    fn from(s: &ScopeState) -> Self {
        ScopeView {
            scope: s.scope.to_string(),
            policy: PolicyView {
                name: s.policy_name.to_string(),
                max_steps_per_source: s.policy.max_steps_per_source.get(),
                sources_per_24_hours: s.policy.sources_per_24_hours.get(),
                scope_concurrent: s.policy.scope_concurrent.get(),
                global_concurrent: s.policy.global_concurrent.get(),
                burst: s.policy.burst.get(),
                tasks_per_minute: s.policy.tasks_per_minute.get(),
                usd_per_24_hours: s
                    .policy
                    .cost
                    .scope_nano_per_24_hours
                    .map(|n| tollgate_core::cost::nano_to_usd(n.get() as i64)),
                tokens_per_minute: s.policy.cost.token_rate.map(|r| r.tokens_per_minute.get()),
                token_burst: s.policy.cost.token_rate.map(|r| r.token_burst.get()),
            },
            bucket_tokens: (s.bucket_tokens * 1000.0).round() / 1000.0,
            active: s.active,
            sources_in_window: s.sources_in_window,
            steps_in_window: s.steps_in_window,
            busiest_source_steps: s.busiest_source_steps,
            admissions_in_window: s.admissions_in_window,
            last_admitted_at: s.last_admitted_at.map(|t| t.to_rfc3339()),
            cost: s.cost.as_ref().map(|c| CostView {
                spent_micros: c.spent_micros,
                tokens: c.tokens,
            }),
        }
    }
}

/// `GET /v1/scopes` answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScopePageView {
    /// Scopes with admission activity in the 24 h window, in name order.
    pub scopes: Vec<ScopeView>,
    /// Pass as `next` for the following page; absent on the last page.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub next: Option<String>,
}

#[utoipa::path(get, path = "/v1/scopes", tag = "scopes",
    params(
        ("limit" = Option<u32>, Query, minimum = 1, maximum = 500, description = "page size (default 50, at most 500)"),
        ("next" = Option<String>, Query, max_length = 259, pattern = r"^s1\.[^\x00-\x1F\x7F-\x9F]+$", description = "the `next` of the previous page (opaque: pass it back as given)")),
    responses((status = 200, body = ScopePageView, description = "the app's scopes with admitted tasks still active or an admission in the last 24 h, in name order"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: scopes count every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn list_scopes(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<PageParams>, QueryRejection>,
) -> Result<Json<ScopePageView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    let q = query(q)?;
    let after = cursor(q.next, 's')?;
    let page = view(&s, &caller)
        .list_scopes(after.as_ref(), limit(q.limit)?)
        .await?;
    Ok(Json(ScopePageView {
        scopes: page.items.iter().map(ScopeView::from).collect(),
        next: page.next.map(|c| c.encode()),
    }))
}

#[utoipa::path(get, path = "/v1/scopes/{scope}", tag = "scopes",
    params(("scope" = Identifier, Path, description = "the scope")),
    responses((status = 200, body = ScopeView, description = "the policy in force and the live state (a scope never admitted into shows a full bucket and zeros)"),
              (status = 403, body = crate::error::ErrorBody, description = "the key is bound to a subject: a scope's state counts every subject's work")),
    security(("api_key" = [])))]
pub(crate) async fn get_scope(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(scope): Path<String>,
    q: Result<Query<NoParams>, QueryRejection>,
) -> Result<Json<ScopeView>, ApiError> {
    let caller = s.auth.authenticate(&headers)?;
    query(q)?;
    let scope = ScopeId::new(scope)?;
    let state = view(&s, &caller).scope(&scope).await?;
    Ok(Json(ScopeView::from(&state)))
}
