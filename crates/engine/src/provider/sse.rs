//! Server-sent events from a provider (a streamed answer): the decoder of the
//! `text/event-stream` format, and what each dialect's [`StreamParser`] does with the
//! events — publish the pieces to the call's [`StreamSink`] and rebuild the answer the
//! non-streaming API would have given, so the dialect's usual answer parser reads it
//! (the same output and usage as without streaming).
//!
//! A small decoder rather than a crate (`eventsource-stream` was considered): the
//! format is a few lines (WHATWG HTML, "Server-sent events"), and reading is bounded by
//! the call's output limit here, chunk by chunk.

use crate::stream::StreamSink;
use serde_json::Value;

/// Why a stream cannot be read further.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamBroke {
    /// The stream is malformed (not the dialect's events): trying again would not help.
    Failed(String),
    /// The provider reported an error or the stream stopped short: a later try may
    /// succeed (it may have been billed).
    Broken(String),
}

/// A dialect's reading of its stream's events.
pub trait StreamParser: Send {
    /// One event: its name (`message` when it has none) and data.
    fn event(&mut self, name: &str, data: &str, sink: &StreamSink) -> Result<(), StreamBroke>;
    /// Whether the answer is whole (the stream's last event was seen).
    fn complete(&self) -> bool;
    /// Bytes of output read so far (text and tool arguments), for the output limit.
    fn output_bytes(&self) -> usize;
    /// The answer as the non-streaming API gives it.
    fn answer(self: Box<Self>) -> Value;
}

/// An event decoded from a `text/event-stream` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// `event:` (`message` when absent).
    pub name: String,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Decodes a `text/event-stream` body fed in arbitrary chunks.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// Bytes of an unfinished line.
    line: Vec<u8>,
    name: String,
    data: Option<String>,
    /// The previous chunk ended with `\r` (a `\n` starting the next one ends nothing).
    after_cr: bool,
}

impl SseDecoder {
    /// The events completed by `chunk`.
    pub fn feed(&mut self, chunk: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in chunk {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    self.line_done(&String::from_utf8_lossy(&line), &mut events);
                }
                _ => self.line.push(byte),
            }
        }
        events
    }

    /// The last event, when the body ended without the blank line that closes it.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let mut events = Vec::new();
        if !self.line.is_empty() {
            let line = std::mem::take(&mut self.line);
            self.line_done(&String::from_utf8_lossy(&line), &mut events);
        }
        self.line_done("", &mut events);
        events.pop()
    }

    fn line_done(&mut self, line: &str, events: &mut Vec<SseEvent>) {
        if line.is_empty() {
            let name = std::mem::take(&mut self.name);
            if let Some(data) = self.data.take() {
                events.push(SseEvent {
                    name: if name.is_empty() {
                        "message".into()
                    } else {
                        name
                    },
                    data,
                });
            }
            return;
        }
        if line.starts_with(':') {
            return; // a comment (keep-alive)
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.name = value.to_string(),
            "data" => match &mut self.data {
                Some(data) => {
                    data.push('\n');
                    data.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            _ => {}
        }
    }
}

/// A stream event's data as JSON, or why it is not.
pub fn event_json(data: &str) -> Result<Value, StreamBroke> {
    serde_json::from_str(data).map_err(|e| {
        StreamBroke::Failed(format!(
            "a stream event of the provider is not JSON ({e}): {}",
            super::http::excerpt(data)
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_decoded_across_chunks_and_line_ends() {
        let mut d = SseDecoder::default();
        let body = b": keep-alive\r\n\r\nevent: ping\ndata: {\"a\":\ndata: 1}\n\ndata: [DONE]\r\n\r\ndata: x";
        let mut events = Vec::new();
        for chunk in body.chunks(3) {
            events.extend(d.feed(chunk));
        }
        events.extend(d.finish());
        assert_eq!(
            events,
            vec![
                SseEvent {
                    name: "ping".into(),
                    data: "{\"a\":\n1}".into()
                },
                SseEvent {
                    name: "message".into(),
                    data: "[DONE]".into()
                },
                SseEvent {
                    name: "message".into(),
                    data: "x".into()
                },
            ]
        );
        assert_eq!(d.finish(), None);
    }
}
