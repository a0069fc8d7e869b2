//! A finished task in OpenAI's shapes: `chat.completion`, the `chat.completion.chunk`
//! stream, and `model` objects.

use axum::body::Body;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tollgate_core::Task;

/// What an answer says, from a succeeded task. Everything comes from the stored task,
/// so a replay of the same task answers the same id, `created` and content.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Completion {
    id: String,
    created: i64,
    model: String,
    /// The text (`null` for a `chat` answer that only calls tools).
    content: Value,
    /// A `chat` answer's tool calls.
    tool_calls: Option<Value>,
    finish_reason: String,
    usage: Value,
}

impl Completion {
    /// `max_tokens` is the call's output cap: an answer that used all of it was cut
    /// (`finish_reason: "length"`), as far as the recorded usage tells.
    pub(crate) fn of(task: &Task, max_tokens: Option<u64>) -> Completion {
        let output = task.output.clone().unwrap_or(Value::Null);
        let mut tool_calls = None;
        let mut reported_finish = None;
        let content = match &output {
            // generate_text: the text itself; extract_data: the JSON value as text.
            Value::Object(map) if task.kind == tollgate_core::TaskKind::GenerateText => {
                json!(map.get("text").and_then(Value::as_str).unwrap_or_default())
            }
            // chat: the assistant message as the model gave it (core normalized it).
            Value::Object(map) if task.kind == tollgate_core::TaskKind::Chat => {
                tool_calls = map.get("tool_calls").cloned();
                reported_finish = map
                    .get("finish_reason")
                    .and_then(Value::as_str)
                    .map(str::to_string);
                map.get("content").cloned().unwrap_or(Value::Null)
            }
            other => json!(other.to_string()),
        };
        let (prompt, completion, cached) = task.usage.as_ref().map_or((0, 0, None), |u| {
            (u.input_tokens, u.output_tokens, u.cached_input_tokens)
        });
        let finish_reason = match (reported_finish, max_tokens) {
            (Some(reason), _) => reason,
            (None, Some(cap)) if !task.cached() && completion >= cap => "length".to_string(),
            _ => "stop".to_string(),
        };
        // A cache hit's recorded usage is zero: no provider call, nothing spent. The
        // provider's prompt-cache count is shown where it reported one.
        let mut usage = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        });
        if let Some(cached) = cached {
            usage["prompt_tokens_details"] = json!({ "cached_tokens": cached });
        }
        Completion {
            id: format!("chatcmpl-{}", task.id),
            created: task.created_at.millis().div_euclid(1000),
            model: task.model.to_string(),
            content,
            tool_calls,
            finish_reason,
            usage,
        }
    }

    /// The `chat.completion` object.
    pub(crate) fn object(&self) -> Value {
        let mut message = json!({ "role": "assistant", "content": self.content, "refusal": null });
        if let Some(calls) = &self.tool_calls {
            message["tool_calls"] = calls.clone();
        }
        json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [{
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": self.finish_reason,
            }],
            "usage": self.usage,
        })
    }

    fn chunk(&self, choices: Value, usage: Option<&Value>) -> Value {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            chunk["usage"] = u.clone();
        }
        chunk
    }

    /// A chunk with one `delta` (with include_usage every chunk carries `usage: null`
    /// but the last, as OpenAI's do).
    pub(crate) fn delta_chunk(&self, delta: Value, include_usage: bool) -> Value {
        let none = include_usage.then_some(Value::Null);
        self.chunk(
            json!([{"index": 0, "delta": delta, "logprobs": null, "finish_reason": null}]),
            none.as_ref(),
        )
    }

    /// The stream's first chunk: the assistant's role.
    pub(crate) fn role_chunk(&self, include_usage: bool) -> Value {
        self.delta_chunk(json!({"role": "assistant", "content": ""}), include_usage)
    }

    /// The stream's last chunks: the `finish_reason`, then with include_usage the usage.
    pub(crate) fn closing_chunks(&self, include_usage: bool) -> Vec<Value> {
        let none = include_usage.then_some(Value::Null);
        let mut chunks = vec![self.chunk(
            json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": self.finish_reason}]),
            none.as_ref(),
        )];
        if include_usage {
            chunks.push(self.chunk(json!([]), Some(&self.usage)));
        }
        chunks
    }

    /// The stream's events, in order, without the final `[DONE]`.
    pub(crate) fn chunks(&self, include_usage: bool) -> Vec<Value> {
        let none = include_usage.then_some(Value::Null);
        let mut chunks = vec![self.role_chunk(include_usage)];
        if !self.content.is_null() {
            chunks.push(self.delta_chunk(json!({"content": self.content}), include_usage));
        }
        if let Some(Value::Array(calls)) = &self.tool_calls {
            // Each call whole in one delta, with its index, as streamed tool calls are.
            let deltas: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, call)| {
                    let mut delta = call.clone();
                    delta["index"] = json!(i);
                    delta
                })
                .collect();
            chunks.push(self.chunk(
                json!([{"index": 0, "delta": {"tool_calls": deltas}, "logprobs": null, "finish_reason": null}]),
                none.as_ref(),
            ));
        }
        chunks.extend(self.closing_chunks(include_usage));
        chunks
    }
}

/// One server-sent event of a stream: `data: <json>`.
pub(crate) fn sse_data(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// The stream's end.
pub(crate) const SSE_DONE: &str = "data: [DONE]\n\n";

/// The headers of a `text/event-stream` answer.
pub(crate) fn sse_headers(response: &mut Response) {
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
}

/// `text/event-stream` of the chunks and `data: [DONE]`, for a task that has finished
/// (a replay, a cache hit, a structured kind): the whole answer at once.
pub(crate) fn stream(completion: &Completion, include_usage: bool) -> Response {
    let mut text = String::new();
    for chunk in completion.chunks(include_usage) {
        text.push_str(&sse_data(&chunk));
    }
    text.push_str(SSE_DONE);
    let mut response = Body::from(text).into_response();
    sse_headers(&mut response);
    response
}

/// A `model` object. Tollgate does not know when a model was created: `created` is 0.
/// docs/routes.md: the OpenAI model object, with the model id's route (strategy and
/// deployments, never keys) as `tollgate_route`.
pub(crate) fn model(id: &str, provider: &str, route: &tollgate_core::Route) -> Value {
    let route = crate::routes::meta::RouteView::from(route);
    json!({
        "id": id, "object": "model", "created": 0, "owned_by": provider,
        "tollgate_route": route,
    })
}
