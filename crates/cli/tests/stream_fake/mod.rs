//! A scripted OpenAI-compatible provider that streams (`crates/cli/tests/streaming_reasks.rs`).
//!
//! Each call is matched to a script by a tag its messages contain (`[reask]`, …) and
//! answers that script's next [`Reply`] as `chat.completion.chunk` events: the role
//! chunk, the reply's `now` deltas at once, then — when it has `held` deltas — waits for
//! the test's [`Fake::release`] before sending them, then ends as its [`End`] says. So
//! "arrived before the provider finished" is observed, not inferred from timing. A call
//! no script matches (or one past its script's replies) is answered 500 and recorded.

pub mod http;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// How a reply's stream ends.
#[derive(Debug, Clone)]
pub enum End {
    /// A chunk with this `finish_reason`, then the usage chunk (prompt, completion
    /// tokens) and `[DONE]`.
    Finish(&'static str, (u64, u64)),
    /// The connection dies (no finish, no usage).
    Drop,
    /// An error event (`data: {"error": …}`) 100 ms later, then the stream closes.
    Error,
}

/// One scripted answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Deltas sent at once (after the role chunk).
    pub now: Vec<Value>,
    /// Deltas sent after the test's release.
    pub held: Vec<Value>,
    pub end: End,
}

impl Reply {
    /// A text answer: `now` and `held` as `content` pieces.
    pub fn text(now: &[&str], held: &[&str], end: End) -> Reply {
        let pieces = |p: &[&str]| p.iter().map(|t| json!({ "content": t })).collect();
        Reply {
            now: pieces(now),
            held: pieces(held),
            end,
        }
    }
}

#[derive(Default)]
struct Script {
    replies: Mutex<HashMap<String, VecDeque<Reply>>>,
    /// Every call: its tag ("" for none) and body.
    calls: Mutex<Vec<(String, Value)>>,
    /// Deltas sent per tag (the role chunks not counted).
    sent: Mutex<HashMap<String, u32>>,
    release: Notify,
}

pub struct Fake {
    pub url: String,
    script: Arc<Script>,
}

impl Fake {
    pub async fn start() -> Fake {
        let script = Arc::new(Script::default());
        let app = Router::new()
            .route("/v1/chat/completions", post(answer))
            .with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Fake { url, script }
    }

    /// The calls whose messages contain `tag` answer these replies, in order.
    pub fn script(&self, tag: &str, replies: Vec<Reply>) {
        self.script
            .replies
            .lock()
            .unwrap()
            .insert(tag.to_string(), replies.into());
    }

    /// The bodies of the calls matched to `tag`, in order.
    pub fn calls(&self, tag: &str) -> Vec<Value> {
        let calls = self.script.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(t, _)| t == tag)
            .map(|(_, b)| b.clone())
            .collect()
    }

    /// Every call made, whatever its tag.
    pub fn all_calls(&self) -> usize {
        self.script.calls.lock().unwrap().len()
    }

    /// Deltas sent so far to calls of `tag`.
    pub fn sent(&self, tag: &str) -> u32 {
        let sent = self.script.sent.lock().unwrap();
        sent.get(tag).copied().unwrap_or(0)
    }

    /// Lets the held deltas of the (next) held reply go.
    pub fn release(&self) {
        self.script.release.notify_one();
    }
}

fn chunk(delta: Value, finish: Value) -> String {
    let c = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1,
                   "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    format!("data: {c}\n\n")
}

async fn answer(State(script): State<Arc<Script>>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let messages = body["messages"].to_string();
    let next = {
        let mut replies = script.replies.lock().unwrap();
        let tag = replies
            .keys()
            .find(|t| messages.contains(t.as_str()))
            .cloned()
            .unwrap_or_default();
        let reply = replies.get_mut(&tag).and_then(VecDeque::pop_front);
        script
            .calls
            .lock()
            .unwrap()
            .push((tag.clone(), body.clone()));
        reply.map(|r| (tag, r))
    };
    let streamed = body["stream"] == true && body["stream_options"]["include_usage"] == true;
    let Some((tag, reply)) = next.filter(|_| streamed) else {
        let error = json!({"error": {"message": format!("unscripted or unstreamed call: {body}")}});
        return (StatusCode::INTERNAL_SERVER_ERROR, error.to_string()).into_response();
    };
    let (tx, rx) = mpsc::channel::<Result<String, std::io::Error>>(64);
    tokio::spawn(async move {
        let _ = tx
            .send(Ok(chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            )))
            .await;
        let send = |delta: Value| {
            let (tx, script, tag) = (tx.clone(), script.clone(), tag.clone());
            async move {
                *script.sent.lock().unwrap().entry(tag).or_default() += 1;
                let _ = tx.send(Ok(chunk(delta, Value::Null))).await;
            }
        };
        for delta in reply.now {
            send(delta).await;
        }
        if !reply.held.is_empty() {
            script.release.notified().await;
            for delta in reply.held {
                send(delta).await;
            }
        }
        match reply.end {
            End::Finish(reason, (prompt, completion)) => {
                let _ = tx.send(Ok(chunk(json!({}), json!(reason)))).await;
                let usage = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                    "choices": [], "usage": {"prompt_tokens": prompt,
                    "completion_tokens": completion, "total_tokens": prompt + completion}});
                let _ = tx.send(Ok(format!("data: {usage}\n\n"))).await;
                let _ = tx.send(Ok("data: [DONE]\n\n".to_string())).await;
            }
            End::Drop => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = tx
                    .send(Err(std::io::Error::other("the fake dies mid-answer")))
                    .await;
            }
            End::Error => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let error = json!({"error": {"message": "the fake is overloaded mid-answer",
                                             "type": "server_error"}});
                let _ = tx.send(Ok(format!("data: {error}\n\n"))).await;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    let mut response = Body::from_stream(stream).into_response();
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    response
}

pub use crate::common::Events;

/// Waits (up to 20 s) until `fake` has sent `n` deltas to calls of `tag`.
pub async fn until_sent(fake: &Fake, tag: &str, n: u32) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while fake.sent(tag) < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{tag}: {} deltas sent, not {n}",
            fake.sent(tag)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
