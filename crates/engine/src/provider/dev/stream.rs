//! The dev provider's streamed answers: its answer, once built, published with the model
//! parameter `stream_delay_ms` in small deterministic pieces (a text word by word, JSON
//! in pieces of 16 characters, each tool call whole), waiting that long before each
//! piece after the first, so tests can watch a stream arrive piece by piece; without it,
//! as one piece (and one per tool call), at once.

use crate::provider::ProviderAnswer;
use crate::stream::{StreamEvent, StreamSink, output_events};
use serde_json::Value;
use std::time::Duration;
use tollgate_core::{ModelRef, TaskKind};

/// Characters per piece of a JSON answer.
const JSON_PIECE_CHARS: usize = 16;

/// `text` in pieces: word by word (each word with the spaces after it) for text, every
/// [`JSON_PIECE_CHARS`] characters for JSON.
pub(super) fn pieces(text: &str, json: bool) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut piece = String::new();
    let mut count = 0;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        piece.push(c);
        count += 1;
        let end = if json {
            count == JSON_PIECE_CHARS
        } else {
            c.is_whitespace() && chars.peek().is_some_and(|n| !n.is_whitespace())
        };
        if end {
            pieces.push(std::mem::take(&mut piece));
            count = 0;
        }
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// Publishes `answer` to `sink` piece by piece.
pub(super) async fn publish(
    model: &ModelRef,
    kind: TaskKind,
    answer: &ProviderAnswer,
    sink: &StreamSink,
) {
    let delay = model
        .params
        .get("stream_delay_ms")
        .and_then(Value::as_u64)
        .map(Duration::from_millis);
    let json = !matches!(kind, TaskKind::GenerateText | TaskKind::Chat);
    let mut first = true;
    for event in output_events(kind, &answer.output) {
        let parts = match event {
            StreamEvent::Text(text) if delay.is_some() => pieces(&text, json)
                .into_iter()
                .map(StreamEvent::Text)
                .collect(),
            other => vec![other],
        };
        for part in parts {
            if let (Some(delay), false) = (delay, first) {
                tokio::time::sleep(delay).await;
            }
            first = false;
            sink.publish(part);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_join_to_the_whole() {
        let text = "Hello  dear world ";
        assert_eq!(pieces(text, false), vec!["Hello  ", "dear ", "world "]);
        let json = "{\"a\":\"0123456789abcdef\"}";
        let p = pieces(json, true);
        assert_eq!(p.len(), 2);
        assert_eq!(p.concat(), json);
    }
}
