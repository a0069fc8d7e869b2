//! A streamed Messages API answer (`stream: true`): `message_start` (the message and
//! its input usage), `content_block_start` / `content_block_delta` (`text_delta`,
//! `input_json_delta`) / `content_block_stop` per block, `message_delta` (the
//! `stop_reason` and the output usage), `message_stop`; `ping`s; an `error` event ends
//! it. The pieces are published as they come; the message is rebuilt as the
//! non-streaming API gives it, so [`parse_answer`](super::parse_answer) reads it.

use crate::provider::http::excerpt;
use crate::provider::prompt::AnswerShape;
use crate::provider::sse::{StreamBroke, StreamParser, event_json};
use crate::stream::StreamSink;
use serde_json::{Map, Value, json};

/// One content block being put together.
#[derive(Debug)]
struct Block {
    block: Value,
    /// A `tool_use` block's input, as JSON text pieces.
    input: String,
    /// A `tool_use` block's position among the answer's tool calls.
    call: Option<u32>,
}

/// Reads one streamed Messages API answer.
#[derive(Debug)]
pub struct MessageStream {
    shape: AnswerShape,
    message: Map<String, Value>,
    usage: Map<String, Value>,
    blocks: Vec<Block>,
    calls: u32,
    done: bool,
    bytes: usize,
}

impl MessageStream {
    /// A reader for an answer of `shape`: a `chat`'s `tool_use` blocks are published as
    /// tool calls, a forced tool's input (structured output) as the answer's text.
    pub fn new(shape: AnswerShape) -> MessageStream {
        MessageStream {
            shape,
            message: Map::new(),
            usage: Map::new(),
            blocks: Vec::new(),
            calls: 0,
            done: false,
            bytes: 0,
        }
    }

    fn block(&mut self, event: &Value) -> Option<&mut Block> {
        let index = event.get("index").and_then(Value::as_u64)? as usize;
        self.blocks.get_mut(index)
    }
}

impl StreamParser for MessageStream {
    fn event(&mut self, _name: &str, data: &str, sink: &StreamSink) -> Result<(), StreamBroke> {
        let event = event_json(data)?;
        let merge = |usage: &mut Map<String, Value>, from: Option<&Value>| {
            if let Some(Value::Object(u)) = from {
                for (k, v) in u {
                    if !v.is_null() {
                        usage.insert(k.clone(), v.clone());
                    }
                }
            }
        };
        match event
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
        {
            "message_start" => {
                if let Some(Value::Object(m)) = event.get("message") {
                    self.message = m.clone();
                }
                merge(&mut self.usage, self.message.get("usage"));
            }
            "content_block_start" => {
                let block = event.get("content_block").cloned().unwrap_or(json!({}));
                let tool = block.get("type").and_then(Value::as_str) == Some("tool_use");
                let call = tool.then(|| {
                    self.calls += 1;
                    self.calls - 1
                });
                if let (Some(index), AnswerShape::Message) = (call, self.shape) {
                    let text = |k: &str| block.get(k).and_then(Value::as_str);
                    sink.tool_call(index, text("id"), text("name"), "");
                }
                let at = event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                if at > self.blocks.len() + 64 {
                    return Err(StreamBroke::Failed(format!(
                        "a stream event names content block {at}, far past the others"
                    )));
                }
                while self.blocks.len() <= at {
                    self.blocks.push(Block {
                        block: json!({"type": "text", "text": ""}),
                        input: String::new(),
                        call: None,
                    });
                }
                self.blocks[at] = Block {
                    block,
                    input: String::new(),
                    call,
                };
            }
            "content_block_delta" => {
                let delta = event.get("delta").cloned().unwrap_or(Value::Null);
                let shape = self.shape;
                let Some(block) = self.block(&event) else {
                    return Ok(());
                };
                let mut added = 0;
                if let Some(text) = delta.get("text").and_then(Value::as_str) {
                    let mut whole = block
                        .block
                        .get("text")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    whole.push_str(text);
                    block.block["text"] = Value::String(whole);
                    added = text.len();
                    sink.text(text);
                }
                if let Some(piece) = delta.get("partial_json").and_then(Value::as_str) {
                    block.input.push_str(piece);
                    added = piece.len();
                    match (shape, block.call) {
                        (AnswerShape::Message, Some(index)) => {
                            sink.tool_call(index, None, None, piece)
                        }
                        _ => sink.text(piece),
                    }
                }
                self.bytes += added;
            }
            "content_block_stop" => {
                if let Some(block) = self.block(&event)
                    && block.call.is_some()
                {
                    let text = if block.input.trim().is_empty() {
                        "{}"
                    } else {
                        block.input.as_str()
                    };
                    let input = serde_json::from_str(text)
                        .unwrap_or_else(|_| Value::String(block.input.clone()));
                    block.block["input"] = input;
                }
            }
            "message_delta" => {
                if let Some(Value::Object(delta)) = event.get("delta") {
                    for (k, v) in delta {
                        self.message.insert(k.clone(), v.clone());
                    }
                }
                merge(&mut self.usage, event.get("usage"));
            }
            "message_stop" => self.done = true,
            "error" => {
                return Err(StreamBroke::Broken(format!(
                    "the provider's stream ended with an error: {}",
                    excerpt(&event.get("error").unwrap_or(&event).to_string())
                )));
            }
            _ => {} // `ping`, and events added later
        }
        Ok(())
    }

    fn complete(&self) -> bool {
        self.done
    }

    fn output_bytes(&self) -> usize {
        self.bytes
    }

    fn answer(self: Box<Self>) -> Value {
        let mut message = self.message;
        message.insert(
            "content".into(),
            Value::Array(self.blocks.into_iter().map(|b| b.block).collect()),
        );
        if !self.usage.is_empty() {
            message.insert("usage".into(), Value::Object(self.usage));
        }
        Value::Object(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::anthropic::parse_answer;

    #[test]
    fn a_streamed_message_reads_as_the_whole_message() {
        let events = [
            json!({"type": "message_start", "message": {"id": "m", "type": "message", "role": "assistant", "content": [], "usage": {"input_tokens": 7, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            json!({"type": "ping"}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me"}}),
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " check."}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "t1", "name": "f", "input": {}}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"a\": "}}),
            json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "1}"}}),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 12}}),
            json!({"type": "message_stop"}),
        ];
        let mut parser = MessageStream::new(AnswerShape::Message);
        let sink = StreamSink::detached();
        for e in &events {
            parser.event("x", &e.to_string(), &sink).unwrap();
        }
        assert!(parser.complete());
        let answer = Box::new(parser).answer();
        let parsed = parse_answer(&answer, AnswerShape::Message).unwrap();
        assert_eq!(parsed.output["content"], json!("Let me check."));
        assert_eq!(
            parsed.output["tool_calls"][0]["function"]["arguments"],
            json!("{\"a\":1}")
        );
        assert_eq!(
            (parsed.usage.input_tokens, parsed.usage.output_tokens),
            (7, 12)
        );
        assert!(!parsed.usage.estimated);
    }
}
