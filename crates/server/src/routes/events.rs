//! `GET /v1/tasks/{id}/events`: a task's output as server-sent events while it runs, then
//! its end (docs/api.md, "Streaming a task").

use super::tasks::task_id;
use super::{NoParams, StrictQuery, view};
use crate::AppState;
use crate::auth::Caller;
use crate::dto::TaskView;
use crate::error::ApiError;
use axum::extract::{Path, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tollgate_engine::{CallerView, StreamEvent, TaskEvent, TaskEvents};
use utoipa::ToSchema;

/// The data of a `delta` event: one piece of the output — text, or a piece of a tool call.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct TaskDeltaEvent {
    /// The next piece of the output's text (a structured kind's raw model text; the
    /// `end` event carries the validated output).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// A piece of a tool call (kind `chat`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call: Option<ToolCallDelta>,
}

/// A piece of a tool call: the first piece of a call names its `id` and function; the
/// `arguments` pieces of one `index` concatenate to the call's arguments.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct ToolCallDelta {
    /// The call's position among the answer's calls.
    pub index: u32,
    /// The call's id (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The function called (first piece only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments' JSON text.
    pub arguments: String,
}

/// The data of a `restart` event: every `delta` before it is void (a re-ask, a fallback
/// to another deployment, another attempt); the output starts over.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub(crate) struct TaskRestartEvent {
    /// What started the output over.
    pub reason: String,
}

fn sse_event(event: TaskEvent, attempts: Vec<tollgate_core::Attempt>) -> Event {
    let (name, data) = match event {
        TaskEvent::Stream(StreamEvent::Text(text)) => (
            "delta",
            serde_json::to_value(TaskDeltaEvent {
                text: Some(text),
                tool_call: None,
            }),
        ),
        TaskEvent::Stream(StreamEvent::ToolCall {
            index,
            id,
            name,
            arguments,
        }) => (
            "delta",
            serde_json::to_value(TaskDeltaEvent {
                text: None,
                tool_call: Some(ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                }),
            }),
        ),
        TaskEvent::Stream(StreamEvent::Restart { reason }) => {
            ("restart", serde_json::to_value(TaskRestartEvent { reason }))
        }
        TaskEvent::End(task) => (
            "end",
            serde_json::to_value(TaskView::detail(&task, &attempts)),
        ),
    };
    let data = data.unwrap_or_else(|e| serde_json::json!({"error": e.to_string()}));
    Event::default().event(name).data(data.to_string())
}

#[utoipa::path(get, path = "/v1/tasks/{id}/events", tag = "tasks",
    params(("id" = String, Path, description = "the task id")),
    responses(
        (status = 200, content_type = "text/event-stream", body = String, description = "server-sent events until the task ends: `delta` (data `TaskDeltaEvent`: a piece of the output as the provider sends it), `restart` (data `TaskRestartEvent`: the deltas so far are void), then one `end` (data `TaskView`: the task as `GET /v1/tasks/{id}` answers it, with its validated output and usage, or its error). A task that ended already, or whose live output this replica cannot see, gets its whole answer as one `delta` before `end`. Disconnecting does not cancel the task"),
        (status = 404, body = crate::error::ErrorBody, description = "no such task in the caller's app")),
    security(("api_key" = [])))]
pub(crate) async fn task_events(
    State(s): State<AppState>,
    Path(id): Path<String>,
    caller: Caller,
    StrictQuery(NoParams {}): StrictQuery<NoParams>,
) -> Result<Response, ApiError> {
    let view = view(&s, &caller);
    let events = view
        .events(task_id(&id)?)
        .await?
        .ok_or_else(|| ApiError::not_found("task"))?;
    // Dropping the stream (the client went away) drops the reader and its waiter slot;
    // the task goes on.
    let stream = futures::stream::unfold(
        (events, view),
        |(mut events, view): (TaskEvents, CallerView)| async move {
            let event = events.next().await?;
            let attempts = match &event {
                TaskEvent::End(task) => view.attempts(task).await.unwrap_or_default(),
                TaskEvent::Stream(_) => Vec::new(),
            };
            let sse = sse_event(event, attempts);
            Some((Ok::<_, std::convert::Infallible>(sse), (events, view)))
        },
    );
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}
