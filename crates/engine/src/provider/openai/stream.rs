//! A streamed chat completion (`stream: true`, `stream_options.include_usage: true`):
//! `chat.completion.chunk` events whose `choices[0].delta` carries the content, a
//! refusal or tool-call pieces, then `finish_reason`, then a chunk with the `usage`, then
//! `[DONE]`. The pieces are published as they come; the answer is rebuilt as the
//! non-streaming API gives it (`choices[0].message`, `finish_reason`, `usage`), so
//! [`parse_answer`](super::parse_answer) reads it. A stream without a usage chunk
//! rebuilds an answer without `usage`: the call is then counted at its bound, as any
//! answer without usage (docs/budgets.md).

use crate::provider::http::excerpt;
use crate::provider::prompt::AnswerShape;
use crate::provider::sse::{StreamBroke, StreamParser, event_json};
use crate::stream::StreamSink;
use serde_json::{Map, Value, json};

/// One tool call being put together.
#[derive(Debug, Default)]
struct Call {
    id: Option<String>,
    kind: Option<String>,
    name: String,
    arguments: String,
}

/// Reads one streamed chat completion.
#[derive(Debug)]
pub struct ChatStream {
    shape: AnswerShape,
    content: String,
    refusal: Option<String>,
    calls: Vec<Call>,
    finish_reason: Option<Value>,
    usage: Option<Value>,
    done: bool,
    bytes: usize,
}

impl ChatStream {
    /// A reader for an answer of `shape`: a `chat`'s tool calls are published as tool
    /// calls, a forced tool's arguments (structured output) as the answer's text.
    pub fn new(shape: AnswerShape) -> ChatStream {
        ChatStream {
            shape,
            content: String::new(),
            refusal: None,
            calls: Vec::new(),
            finish_reason: None,
            usage: None,
            done: false,
            bytes: 0,
        }
    }

    fn tool_piece(&mut self, position: usize, piece: &Value, sink: &StreamSink) {
        let index = piece
            .get("index")
            .and_then(Value::as_u64)
            .map_or(position, |i| i as usize);
        if index > self.calls.len() + 64 {
            return; // an absurd index: nothing to publish or keep
        }
        while self.calls.len() <= index {
            self.calls.push(Call::default());
        }
        let call = &mut self.calls[index];
        let text = |path: &str| piece.pointer(path).and_then(Value::as_str);
        let first = call.id.is_none() && call.name.is_empty();
        if let Some(id) = text("/id") {
            call.id = Some(id.to_string());
        }
        if let Some(kind) = text("/type") {
            call.kind = Some(kind.to_string());
        }
        let name = text("/function/name");
        if let Some(name) = name {
            call.name.push_str(name);
        }
        let arguments = text("/function/arguments").unwrap_or_default();
        call.arguments.push_str(arguments);
        self.bytes += arguments.len();
        if self.shape == AnswerShape::Message {
            let id = if first { text("/id") } else { None };
            sink.tool_call(
                u32::try_from(index).unwrap_or(u32::MAX),
                id,
                name,
                arguments,
            );
        } else {
            sink.text(arguments);
        }
    }
}

impl StreamParser for ChatStream {
    fn event(&mut self, _name: &str, data: &str, sink: &StreamSink) -> Result<(), StreamBroke> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(());
        }
        let chunk = event_json(data)?;
        if let Some(error) = chunk.get("error").filter(|e| !e.is_null()) {
            return Err(StreamBroke::Broken(format!(
                "the provider's stream ended with an error: {}",
                excerpt(&error.to_string())
            )));
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return Ok(());
        };
        if let Some(delta) = choice.get("delta") {
            if let Some(text) = delta.get("content").and_then(Value::as_str) {
                self.content.push_str(text);
                self.bytes += text.len();
                sink.text(text);
            }
            if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
                self.refusal.get_or_insert_with(String::new).push_str(text);
            }
            if let Some(pieces) = delta.get("tool_calls").and_then(Value::as_array) {
                for (position, piece) in pieces.iter().enumerate() {
                    self.tool_piece(position, piece, sink);
                }
            }
        }
        if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
            self.finish_reason = Some(reason.clone());
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.done || self.finish_reason.is_some()
    }

    fn output_bytes(&self) -> usize {
        self.bytes
    }

    fn answer(self: Box<Self>) -> Value {
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        let content = if self.content.is_empty() && !self.calls.is_empty() {
            Value::Null
        } else {
            Value::String(self.content)
        };
        message.insert("content".into(), content);
        if let Some(refusal) = self.refusal {
            message.insert("refusal".into(), Value::String(refusal));
        }
        if !self.calls.is_empty() {
            let calls: Vec<Value> = self
                .calls
                .into_iter()
                .map(|c| {
                    json!({
                        "id": c.id,
                        "type": c.kind.unwrap_or_else(|| "function".into()),
                        "function": {"name": c.name, "arguments": c.arguments},
                    })
                })
                .collect();
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        let mut answer = json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": self.finish_reason}],
        });
        if let Some(usage) = self.usage {
            answer["usage"] = usage;
        }
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::openai::parse_answer;
    use crate::stream::StreamSink;

    fn read(shape: AnswerShape, events: &[Value]) -> Value {
        let mut parser = ChatStream::new(shape);
        let sink = StreamSink::detached();
        for e in events {
            parser.event("message", &e.to_string(), &sink).unwrap();
        }
        parser.event("message", "[DONE]", &sink).unwrap();
        assert!(parser.complete());
        Box::new(parser).answer()
    }

    #[test]
    fn a_streamed_answer_reads_as_the_whole_answer() {
        let chunk = |delta: Value, finish: Value| json!({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        let answer = read(
            AnswerShape::Text,
            &[
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
                chunk(json!({"content": "Hel"}), Value::Null),
                chunk(json!({"content": "lo"}), Value::Null),
                chunk(json!({}), json!("stop")),
                json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
            ],
        );
        let parsed = parse_answer(&answer, AnswerShape::Text).unwrap();
        assert_eq!(parsed.output, json!({"text": "Hello"}));
        assert_eq!(
            (parsed.usage.input_tokens, parsed.usage.output_tokens),
            (5, 2)
        );
        assert!(!parsed.usage.estimated);

        let calls = read(
            AnswerShape::Message,
            &[
                chunk(
                    json!({"tool_calls": [{"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}]}),
                    Value::Null,
                ),
                chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"a\":"}}]}),
                    Value::Null,
                ),
                chunk(
                    json!({"tool_calls": [{"index": 0, "function": {"arguments": "1}"}}]}),
                    Value::Null,
                ),
                chunk(json!({}), json!("tool_calls")),
            ],
        );
        let parsed = parse_answer(&calls, AnswerShape::Message).unwrap();
        assert_eq!(
            parsed.output,
            json!({"content": null, "finish_reason": "tool_calls", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}
            ]})
        );
        // No usage chunk: the call is counted at its bound.
        assert!(parsed.usage.estimated);
    }
}
