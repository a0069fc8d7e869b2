//! The OpenAI-compatible door under `/openai/v1`: `POST /chat/completions`,
//! `POST /embeddings` and `GET /models` (`/models/{id}`) in OpenAI's shapes, so code written for the official
//! SDKs works with only `base_url` and `api_key` changed. Each call is one durable
//! Tollgate task, submitted through the engine like `POST /v1/tasks` (same
//! authentication, idempotency, cache and admission) and waited for up to the server's
//! `max_wait`. docs/openai.md says what maps to what.

mod answer;
mod embeddings;
mod error;
mod live;
mod request;

use crate::AppState;
use crate::auth::Caller;
use crate::body_limit;
use crate::routes::{read_body, view};
use axum::Router;
use axum::body::Body;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use error::OpenAiError;
use serde_json::Value;
use tollgate_core::{
    BudgetName, EffectKey, EngineKeySpace, ErrorCode, ModelId, ScopeId, SourceId, SourceRevision,
    StepKey, TaskKind, TaskStatus, ValidatedRequest,
};
use tollgate_engine::{CallerView, SourceSpec, Submission, SubmissionOwner, TaskWaiter};

/// The header naming the Tollgate task of an answer.
pub(crate) const TASK_ID_HEADER: &str = "x-tollgate-task-id";
/// The scope of a call without `X-Tollgate-Scope`.
pub const DEFAULT_SCOPE: &str = "openai";
/// The revision of a source named without `X-Tollgate-Source-Revision`.
pub const DEFAULT_SOURCE_REVISION: &str = "1";
/// The step name of every task of this door.
pub const STEP: &str = "openai-chat";
/// Prefix of the effect keys of this door (`openai-<Idempotency-Key>`): the engine's
/// namespace [`EngineKeySpace::OpenAiDoor`], which `POST /v1/tasks` keys can never
/// enter, so the two never collide.
pub const EFFECT_KEY_PREFIX: &str = EngineKeySpace::OpenAiDoor.prefix();

const SCOPE_HEADER: &str = "x-tollgate-scope";
const SOURCE_HEADER: &str = "x-tollgate-source";
const REVISION_HEADER: &str = "x-tollgate-source-revision";
const BUDGET_HEADER: &str = "x-tollgate-budget";
const IDEMPOTENCY_HEADER: &str = "idempotency-key";

/// The door's routes, merged into the main router.
pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/openai/v1/chat/completions", post(chat_completions))
        .route("/openai/v1/embeddings", post(embeddings::embeddings))
        .route("/openai/v1/models", get(list_models))
        .route("/openai/v1/models/{id}", get(get_model))
        .route(
            "/openai/v1/{*rest}",
            axum::routing::any(|| async {
                OpenAiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "Tollgate's OpenAI-compatible API has POST /openai/v1/chat/completions, \
                     POST /openai/v1/embeddings and GET /openai/v1/models only",
                )
            }),
        )
        .method_not_allowed_fallback(|| async {
            OpenAiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(DefaultBodyLimit::disable())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::telemetry::layer,
        ))
        .layer(axum::middleware::from_fn(crate::request_id::layer))
        .with_state(state)
}

/// The authenticated caller of a door route: the API's [`Caller`] extractor, its 401 in
/// OpenAI's shape.
struct DoorCaller(Caller);

impl FromRequestParts<AppState> for DoorCaller {
    type Rejection = OpenAiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        Ok(DoorCaller(Caller::from_request_parts(parts, state).await?))
    }
}

/// A header's text, or a 400 naming it: sent twice (which one counts would be
/// ambiguous, as on `/v1/tasks`) or not text.
fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, OpenAiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(OpenAiError::new(
            StatusCode::BAD_REQUEST,
            "ambiguous_request",
            format!("two {name} headers: send it once"),
        )
        .param(name));
    }
    value
        .to_str()
        .map(|t| Some(t.trim()))
        .map_err(|_| OpenAiError::invalid(name, format!("the {name} header is not text")))
}

/// An identifier from a header, or a 400 naming the header.
fn header_id<T>(
    name: &str,
    text: &str,
    make: impl FnOnce(String) -> Result<T, tollgate_core::InvalidInput>,
) -> Result<T, OpenAiError> {
    make(text.to_string()).map_err(|e| {
        let reason = match e {
            tollgate_core::InvalidInput::Field { reason, .. } => reason,
            other => other.to_string(),
        };
        OpenAiError::invalid(name, format!("the {name} header {reason}"))
    })
}

/// The submission of a call: the caller's app and subject, the headers' scope, source,
/// budget and key, and the task request.
fn submission(
    caller: &Caller,
    headers: &HeaderMap,
    model: &str,
    kind: TaskKind,
    request: &Value,
) -> Result<(Submission, bool), OpenAiError> {
    let scope = header(headers, SCOPE_HEADER)?.unwrap_or(DEFAULT_SCOPE);
    let scope = header_id(SCOPE_HEADER, scope, ScopeId::new)?;
    let client_key = header(headers, IDEMPOTENCY_HEADER)?;
    let effect_key = match client_key {
        Some("") => {
            return Err(OpenAiError::invalid(
                IDEMPOTENCY_HEADER,
                "the Idempotency-Key header is empty",
            ));
        }
        Some(k) => format!("{EFFECT_KEY_PREFIX}{k}"),
        // No key: every call is new work; nothing is derived from the request.
        None => format!("{EFFECT_KEY_PREFIX}call-{}", uuid::Uuid::new_v4().simple()),
    };
    let effect_key = header_id(IDEMPOTENCY_HEADER, &effect_key, EffectKey::new)?;
    let revision = header(headers, REVISION_HEADER)?;
    let source = match header(headers, SOURCE_HEADER)? {
        Some(id) => Some(SourceSpec {
            id: header_id(SOURCE_HEADER, id, SourceId::new)?,
            revision: header_id(
                REVISION_HEADER,
                revision.unwrap_or(DEFAULT_SOURCE_REVISION),
                SourceRevision::new,
            )?,
            recompute: false,
        }),
        None if revision.is_some() => {
            return Err(OpenAiError::invalid(
                REVISION_HEADER,
                "X-Tollgate-Source-Revision needs X-Tollgate-Source",
            ));
        }
        // A call without a source is unsourced: no cache, no source limits; its policy's
        // USD and token limits apply (docs/budgets.md, "Tasks without a source").
        None => None,
    };
    let budget = header(headers, BUDGET_HEADER)?
        .map(|b| header_id(BUDGET_HEADER, b, BudgetName::new))
        .transpose()?;
    let model = ModelId::new(model.to_string()).map_err(|_| model_not_found(model))?;
    let submission = Submission {
        priority: None,
        app: caller.app.clone(),
        owner: SubmissionOwner::Application { scope },
        subject: caller.subject.clone(),
        step: Some(StepKey::new(STEP).map_err(OpenAiError::from)?),
        effect_key,
        kind,
        request: request.clone(),
        model: Some(model),
        source,
        budget,
    };
    Ok((submission, client_key.is_some()))
}

fn model_not_found(model: &str) -> OpenAiError {
    OpenAiError::new(
        StatusCode::NOT_FOUND,
        "model_not_found",
        format!(
            "The model `{model}` does not exist: use a Tollgate model id (GET /openai/v1/models)"
        ),
    )
    .param("model")
}

/// A door call's body, read within the request size limit and parsed as JSON. A key named
/// twice (`{"model": "slow", "model": "default"}`) is refused, as on `/v1/tasks`, never
/// read as the last one.
async fn read_json_body(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
    max_request_bytes: usize,
) -> Result<Value, OpenAiError> {
    let bytes = read_body(s, headers, body, body_limit(max_request_bytes)).await?;
    tollgate_core::json::parse_unambiguous(&bytes).map_err(|e| {
        if e.is_data() {
            OpenAiError::new(
                StatusCode::BAD_REQUEST,
                "ambiguous_request",
                format!("the body is ambiguous: {e}"),
            )
        } else {
            OpenAiError::invalid("", format!("the body is not valid JSON: {e}"))
        }
    })
}

/// The call's `model` is one of the Tollgate model ids (404 in OpenAI's shape otherwise).
fn check_model(s: &AppState, model: &str) -> Result<(), OpenAiError> {
    let id = ModelId::new(model.to_string()).map_err(|_| model_not_found(model))?;
    match s.tollgate.models().resolve(Some(&id)) {
        Ok(_) => Ok(()),
        Err(_) => Err(model_not_found(model)),
    }
}

async fn chat_completions(
    State(s): State<AppState>,
    caller: DoorCaller,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, OpenAiError> {
    let max_request_bytes = s.tollgate.config().max_request_bytes;
    let value = read_json_body(&s, &headers, body, max_request_bytes).await?;
    let chat = request::parse(&value)?;
    check_model(&s, &chat.model)?;
    // Request-shape errors are 400 here and write nothing (the engine checks again).
    ValidatedRequest::new(chat.kind, &chat.request, max_request_bytes)?;
    let (sub, keyed) = submission(&caller.0, &headers, &chat.model, chat.kind, &chat.request)?;
    // docs/openai.md, "Streaming": text and chat answers are forwarded as the provider
    // sends them; a structured answer is validated first, then sent whole.
    let task = if chat.stream && matches!(chat.kind, TaskKind::GenerateText | TaskKind::Chat) {
        let (view, waiter, task) = submit_door_task(&s, &caller.0, sub).await?;
        let how = live::Live {
            include_usage: chat.include_usage,
            max_tokens: chat.max_tokens,
            keyed,
            max_wait: s.max_wait,
        };
        match live::open(how, &view, waiter, task).await? {
            live::Opened::Live(response) => return Ok(response),
            live::Opened::Ended(task) => *task,
        }
    } else {
        run_door_task(&s, &caller.0, sub, keyed).await?
    };
    let completion = answer::Completion::of(&task, chat.max_tokens);
    let mut response = if chat.stream {
        answer::stream(&completion, chat.include_usage)
    } else {
        axum::Json(completion.object()).into_response()
    };
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&task.id.to_string()) {
        h.insert(TASK_ID_HEADER, v);
    }
    h.insert(
        "x-tollgate-cached",
        HeaderValue::from_static(if task.cached() { "true" } else { "false" }),
    );
    Ok(response)
}

/// Submits a door call's task, waits for it up to `max_wait` and answers it once
/// succeeded; a task still pending or failed is the door's error (the same for chat
/// completions and embeddings).
async fn run_door_task(
    s: &AppState,
    caller: &Caller,
    sub: Submission,
    keyed: bool,
) -> Result<tollgate_core::Task, OpenAiError> {
    let (view, waiter, mut task) = submit_door_task(s, caller, sub).await?;
    if !task.status.is_terminal()
        && let Some(now) = view.wait_known(waiter, task.clone(), s.max_wait).await?
    {
        task = now;
    }
    door_answer(task, keyed, s.max_wait)
}

/// Submits a door call's task (its waiter slot taken first, so a call refused for want of
/// one submitted nothing) and releases it; answers the view, the waiter and the task.
async fn submit_door_task(
    s: &AppState,
    caller: &Caller,
    sub: Submission,
) -> Result<(CallerView, TaskWaiter, tollgate_core::Task), OpenAiError> {
    let view = view(s, caller);
    let scope = match &sub.owner {
        SubmissionOwner::Application { scope } => scope.clone(),
        SubmissionOwner::Run(_) => unreachable!("the door submits application tasks"),
    };
    // The engine judges a replayed key: the same call answers its task, another request
    // is `TaskConflict` (409 naming the task), a key of a task the caller cannot see is
    // `EffectKeyTaken` (409 naming nothing).
    // A door call waits for its task: its waiter slot is taken before submitting.
    let waiter = view.waiter_with_slot()?;
    let submitted = view.submit_door_call(sub).await?;
    // Nothing replays a door task after it is answered but a retried call, so the engine
    // releases it in the write that creates it: deleted `sweeper.retention` after it
    // finishes, replayable until then. A replayed key of a task created unreleased (by
    // an older version) is released here.
    if submitted.task.released_at.is_none() {
        view.release(&scope, &submitted.task.effect_key).await?;
    }
    Ok((view, waiter, submitted.task))
}

/// A door task as the call's answer: succeeded, or the door's error for a task still
/// pending after `max_wait` (504 `task_pending`) or one that failed or was canceled.
fn door_answer(
    task: tollgate_core::Task,
    keyed: bool,
    max_wait: std::time::Duration,
) -> Result<tollgate_core::Task, OpenAiError> {
    match task.status {
        TaskStatus::Succeeded => {}
        TaskStatus::Queued | TaskStatus::Running => {
            let retry = if keyed {
                "retry with the same Idempotency-Key to keep waiting for it"
            } else {
                "send an Idempotency-Key to be able to wait for a call again"
            };
            return Err(OpenAiError::new(
                StatusCode::GATEWAY_TIMEOUT,
                "task_pending",
                format!(
                    "task {} is still {} after the server's longest wait ({} s); {retry}",
                    task.id,
                    task.status.as_str(),
                    max_wait.as_secs()
                ),
            )
            // Retrying without a key would start a second task.
            .should_retry(keyed)
            .task(task.id));
        }
        TaskStatus::Failed | TaskStatus::Canceled => {
            let (code, message) = match &task.error {
                Some(e) => (e.code, e.message.clone()),
                None => (ErrorCode::ProviderError, "the task failed".to_string()),
            };
            let status = match code {
                ErrorCode::QueueTimeout => StatusCode::GATEWAY_TIMEOUT,
                ErrorCode::Interrupted => StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Canceled => StatusCode::CONFLICT,
                _ => StatusCode::BAD_GATEWAY,
            };
            let error = OpenAiError::new(
                status,
                code.as_str(),
                format!("task {} {}: {message}", task.id, task.status.as_str()),
            )
            .task(task.id);
            // A finished task answers the same error to every replay of its key; without
            // a key a retry is a new call, and the SDK's own rules apply.
            return Err(if keyed {
                error.should_retry(false)
            } else {
                error
            });
        }
    }
    Ok(task)
}

async fn list_models(State(s): State<AppState>, _: DoorCaller) -> Result<Response, OpenAiError> {
    let registry = s.tollgate.models();
    let mut data = Vec::new();
    for id in registry.ids() {
        let m = registry.resolve(Some(&id))?;
        data.push(answer::model(id.as_str(), &m.model_ref.provider, &m.route));
    }
    Ok(axum::Json(serde_json::json!({"object": "list", "data": data})).into_response())
}

async fn get_model(
    State(s): State<AppState>,
    _: DoorCaller,
    Path(id): Path<String>,
) -> Result<Response, OpenAiError> {
    let model = ModelId::new(id.clone()).map_err(|_| model_not_found(&id))?;
    let m = s
        .tollgate
        .models()
        .resolve(Some(&model))
        .map_err(|_| model_not_found(&id))?;
    Ok(axum::Json(answer::model(
        model.as_str(),
        &m.model_ref.provider,
        &m.route,
    ))
    .into_response())
}
