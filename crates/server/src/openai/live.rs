//! `stream: true` while the task runs (docs/openai.md, "Streaming"): the door reads the
//! task's events ([`TaskEvents`]) and forwards each piece as a `chat.completion.chunk`
//! as the provider sends it; the task's end closes the stream with its `finish_reason`,
//! usage and `[DONE]`, or with an error event. The answer starts (200) with the task's
//! first piece: a task that fails, or is still pending after `max_wait`, before any
//! piece is answered as an ordinary error, as without streaming. A client that goes
//! away drops the reader only: the task goes on (cancel is explicit).

use super::TASK_ID_HEADER;
use super::answer::{Completion, SSE_DONE, sse_data, sse_headers};
use super::error::OpenAiError;
use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use std::collections::VecDeque;
use std::time::Duration;
use tollgate_core::Task;
use tollgate_engine::{CallerView, StreamEvent, TaskEvent, TaskEvents, TaskWaiter};

/// How a call streams.
#[derive(Debug, Clone, Copy)]
pub(super) struct Live {
    /// `stream_options.include_usage`.
    pub(super) include_usage: bool,
    /// The call's output cap (for `finish_reason: "length"`).
    pub(super) max_tokens: Option<u64>,
    /// The call had an `Idempotency-Key`.
    pub(super) keyed: bool,
    /// The server's longest wait for the first piece.
    pub(super) max_wait: Duration,
}

/// What a streamed call answers.
pub(super) enum Opened {
    /// The stream, open: pieces follow as the provider sends them.
    Live(Response),
    /// The task succeeded before any piece was seen here (a replay, a cache hit, another
    /// replica's execution): answered whole.
    Ended(Box<Task>),
}

/// Opens the stream of `task`, just submitted through `view` (`waiter` holds the call's
/// waiter slot, which the reader then holds).
pub(super) async fn open(
    how: Live,
    view: &CallerView,
    waiter: TaskWaiter,
    task: Task,
) -> Result<Opened, OpenAiError> {
    let pending = |task: Task| {
        super::door_answer(task, how.keyed, how.max_wait).map(|t| Opened::Ended(Box::new(t)))
    };
    if task.status.is_terminal() {
        return pending(task);
    }
    let Some(mut events) = view.events_known(waiter, &task).await? else {
        return pending(task); // deleted meanwhile: answered as still pending
    };
    let first = match tokio::time::timeout(how.max_wait, events.next()).await {
        Ok(Some(TaskEvent::End(ended))) => return pending(*ended),
        Ok(Some(first)) => first,
        Ok(None) | Err(_) => return pending(task),
    };
    let mut stream = Stream {
        how,
        head: Completion::of(&task, how.max_tokens),
        task_id: task.id.to_string(),
        events,
        out: VecDeque::new(),
        ended: false,
    };
    stream
        .out
        .push_back(sse_data(&stream.head.role_chunk(how.include_usage)));
    stream.on(first);
    let body = futures::stream::unfold(stream, |mut s| async move {
        let next = s.next().await?;
        Some((Ok::<_, std::convert::Infallible>(next), s))
    });
    let mut response = Body::from_stream(body).into_response();
    sse_headers(&mut response);
    let h = response.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&task.id.to_string()) {
        h.insert(TASK_ID_HEADER, v);
    }
    h.insert("x-tollgate-cached", HeaderValue::from_static("false"));
    Ok(Opened::Live(response))
}

/// An open stream: the task's events turned into server-sent events.
struct Stream {
    how: Live,
    /// The completion's `id`, `created` and `model` (from the task as submitted).
    head: Completion,
    task_id: String,
    events: TaskEvents,
    out: VecDeque<String>,
    ended: bool,
}

impl Stream {
    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(event) = self.out.pop_front() {
                return Some(event);
            }
            if self.ended {
                return None;
            }
            match self.events.next().await {
                Some(event) => self.on(event),
                None => self.error(OpenAiError::new(
                    StatusCode::NOT_FOUND,
                    "not_found",
                    "the task was deleted while it ran",
                )),
            }
        }
    }

    fn error(&mut self, error: OpenAiError) {
        self.ended = true;
        self.out.push_back(sse_data(&error.body()));
    }

    fn on(&mut self, event: TaskEvent) {
        let usage = self.how.include_usage;
        match event {
            TaskEvent::Stream(StreamEvent::Text(text)) => {
                let chunk = self.head.delta_chunk(json!({ "content": text }), usage);
                self.out.push_back(sse_data(&chunk));
            }
            TaskEvent::Stream(StreamEvent::ToolCall {
                index,
                id,
                name,
                arguments,
            }) => {
                let mut call = Map::new();
                call.insert("index".into(), json!(index));
                let mut function = Map::new();
                if let Some(id) = id {
                    call.insert("id".into(), json!(id));
                    call.insert("type".into(), json!("function"));
                }
                if let Some(name) = name {
                    function.insert("name".into(), json!(name));
                }
                function.insert("arguments".into(), json!(arguments));
                call.insert("function".into(), Value::Object(function));
                let chunk = self
                    .head
                    .delta_chunk(json!({ "tool_calls": [call] }), usage);
                self.out.push_back(sse_data(&chunk));
            }
            TaskEvent::Stream(StreamEvent::Restart { reason }) => {
                // OpenAI's chunks cannot take text back: the stream ends here, the task
                // goes on; its answer is a replay of the key (or GET /v1/tasks/{id}).
                let id = self.task_id.clone();
                self.error(
                    OpenAiError::new(
                        StatusCode::BAD_GATEWAY,
                        "stream_restarted",
                        format!(
                            "the answer started over ({reason}) after part of it was sent; \
                             task {id} goes on: replay the call with the same Idempotency-Key \
                             (or read GET /v1/tasks/{id}) for its answer"
                        ),
                    )
                    .task(&id),
                );
            }
            TaskEvent::End(task) => {
                match super::door_answer(*task, self.how.keyed, self.how.max_wait) {
                    Ok(task) => {
                        let completion = Completion::of(&task, self.how.max_tokens);
                        for chunk in completion.closing_chunks(usage) {
                            self.out.push_back(sse_data(&chunk));
                        }
                        self.out.push_back(SSE_DONE.to_string());
                        self.ended = true;
                    }
                    Err(e) => self.error(e),
                }
            }
        }
    }
}
