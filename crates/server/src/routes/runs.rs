//! `/v1/runs…`: workflow runs.

use super::*;

fn run_id(text: &str) -> Result<RunId, ApiError> {
    RunId::parse(text).map_err(|_| ApiError::not_found("run"))
}

#[utoipa::path(post, path = "/v1/runs", tag = "runs", request_body = RunBody,
    responses((status = 201, body = RunView)), security(("api_key" = [])))]
pub(crate) async fn create_run(
    State(s): State<AppState>,
    headers: HeaderMap,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
    body: Body,
) -> Result<Response, ApiError> {
    let body: RunBody = json_body(&s, &headers, body, SMALL_BODY_LIMIT).await?;
    let run = s
        .tollgate
        .create_run(tollgate_core::NewRun {
            app: caller.app,
            scope: ScopeId::new(body.scope)?,
            subject: caller.subject,
            input: Value::Object(body.input),
        })
        .await?;
    Ok((StatusCode::CREATED, Json(RunView::from(&run))).into_response())
}

#[utoipa::path(get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "the run id"),
           ("wait" = Option<String>, Query, pattern = r"^[0-9]{1,9}(ms|s|m|h)?$", description = "wait up to this long for a terminal state: a number of seconds, or a number with `ms`, `s`, `m` or `h` (at most the server's `max_wait`)")),
    responses((status = 200, body = RunView, description = "the run; a pipeline run shows its steps under `pipeline`"),
              (status = 404, body = crate::error::ErrorBody, description = "no such run in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn get_run(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(q): StrictQuery<WaitQuery>,
) -> Result<Json<RunView>, ApiError> {
    let wait = parse_wait(q.wait.as_deref(), s.max_wait)?;
    let id = run_id(&id)?;
    let view = view(&s, &caller);
    let run = match wait {
        Some(wait) => view.wait_run(id, wait).await?,
        None => view.get_run(id).await?,
    }
    .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(run_view(&view, &run).await?))
}

/// A run's view, with its steps when it is a pipeline run.
pub(crate) async fn run_view(view: &CallerView, run: &Run) -> Result<RunView, ApiError> {
    let pipeline = view.pipeline_run(run).await?;
    Ok(RunView::with_pipeline(run, pipeline.as_ref()))
}

#[utoipa::path(post, path = "/v1/runs/{id}/cancel", tag = "runs",
    params(("id" = String, Path, description = "the run id")),
    responses((status = 200, body = RunView), (status = 404, body = crate::error::ErrorBody, description = "no such run in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn cancel_run(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Json<RunView>, ApiError> {
    let view = view(&s, &caller);
    let cancel = view
        .cancel_run(run_id(&id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))?;
    Ok(Json(run_view(&view, &cancel.run).await?))
}
