//! `/v1/pipelines…`: register, read, start runs.

use super::*;

/// A pipeline name from a path: one that cannot exist is reported like a missing one.
fn pipeline_name(text: String) -> Result<PipelineName, ApiError> {
    PipelineName::new(text).map_err(|_| ApiError::not_found("pipeline"))
}

#[utoipa::path(post, path = "/v1/pipelines", tag = "pipelines", request_body = PipelineBody,
    responses((status = 201, body = PipelineView, description = "a new version was registered"),
              (status = 200, body = PipelineView, description = "the app had this version already"),
              (status = 422, body = crate::error::ErrorBody, description = "an invalid definition: the message names the field and the reason; nothing is stored")),
    security(("api_key" = [])))]
pub(crate) async fn register_pipeline(
    State(s): State<AppState>,
    headers: HeaderMap,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Response, ApiError> {
    let body: PipelineBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let name = PipelineName::new(body.name)?;
    let (stored, created) = s
        .tollgate
        .register_pipeline(&caller.app, &name, &body.definition)
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(PipelineView::of(&stored, created))).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VersionQuery {
    version: Option<String>,
}

#[utoipa::path(get, path = "/v1/pipelines/{name}", tag = "pipelines",
    params(("name" = String, Path, description = "the pipeline's name"),
           ("version" = Option<String>, Query, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "a version (default: the newest); an identifier")),
    responses((status = 200, body = PipelineView), (status = 404, body = crate::error::ErrorBody, description = "no such pipeline (or version) in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_pipeline(
    State(s): State<AppState>,
    Path(name): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<VersionQuery>,
) -> Result<Json<PipelineView>, ApiError> {
    let version = q.version;
    let stored = s
        .tollgate
        .get_pipeline(&caller.app, &pipeline_name(name)?, version.as_deref())
        .await?
        .ok_or_else(|| ApiError::not_found(not_found_pipeline(version.as_deref())))?;
    Ok(Json(PipelineView::of(&stored, false)))
}

fn not_found_pipeline(version: Option<&str>) -> &'static str {
    if version.is_some() {
        "pipeline version"
    } else {
        "pipeline"
    }
}

#[utoipa::path(post, path = "/v1/pipelines/{name}/runs", tag = "pipelines",
    params(("name" = String, Path, description = "the pipeline's name"),
           ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 256, pattern = r"^[^\x00-\x1F\x7F-\x9F]+$", description = "starts the run once per key: a retried start answers the run it started"),
           ("wait" = Option<String>, Query, pattern = r"^[0-9]{1,9}(ms|s|m|h)?$", description = "wait up to this long for the run to end: a number of seconds, or a number with `ms`, `s`, `m` or `h` (at most the server's `max_wait`)")),
    request_body = PipelineRunBody,
    responses((status = 201, body = RunView, description = "the run was started; `pipeline` shows its steps"),
              (status = 200, body = RunView, description = "the run this Idempotency-Key started earlier"),
              (status = 404, body = crate::error::ErrorBody, description = "no such pipeline (or version) in the caller's app"),
              (status = 409, body = crate::error::ErrorBody, description = "the Idempotency-Key started a different run (another pipeline, version, scope or input)"),
              (status = 422, body = crate::error::ErrorBody, description = "the input lacks what a step reads, or an invalid scope")),
    security(("api_key" = [])))]
pub(crate) async fn start_pipeline_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<WaitQuery>,
    body: Body,
) -> Result<Response, ApiError> {
    let wait = parse_wait(q.wait.as_deref(), s.max_wait)?;
    let start_key = idempotency_key(&headers)?;
    let body: PipelineRunBody = json_body(
        &s,
        &headers,
        body,
        body_limit(s.tollgate.config().max_request_bytes),
    )
    .await?;
    let name = pipeline_name(name)?;
    let scope = ScopeId::new(body.scope)?;
    let view = view(&s, &caller);
    let started = view
        .start_pipeline(PipelineStart {
            app: caller.app.clone(),
            subject: caller.subject.clone(),
            name: name.clone(),
            version: body.version.clone(),
            scope: scope.clone(),
            input: body.input.clone(),
            start_key,
        })
        .await?
        .ok_or_else(|| ApiError::not_found(not_found_pipeline(body.version.as_deref())))?;
    let status = if started.created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let run = waited(&view, started.run, wait).await?;
    Ok((status, Json(run_view(&view, &run).await?)).into_response())
}

/// The run after waiting up to `wait` for it to end (as it was if it vanished meanwhile).
async fn waited(view: &CallerView, run: Run, wait: Option<Duration>) -> Result<Run, ApiError> {
    let Some(wait) = wait else {
        return Ok(run);
    };
    Ok(view.wait_run(run.id, wait).await?.unwrap_or(run))
}
