//! `/v1/scopes/{scope}/…`: unreleased sources, owner-data deletion.

use super::*;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UnreleasedParams {
    step: Option<String>,
    after: Option<String>,
}

#[utoipa::path(get, path = "/v1/scopes/{scope}/unreleased-sources", tag = "scopes",
    params(("scope" = String, Path, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the scope"),
           ("step" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only tasks of this step"),
           ("after" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the `next` of the previous page")),
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
    params(("scope" = String, Path, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "the scope"),
           ("source" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "only this source's tasks")),
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
