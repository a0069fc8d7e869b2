//! Reading a Messages API answer: the usage (cache reads and writes included), a
//! refusal, the output from the forced tool's input or the text blocks, in the
//! [`AnswerShape`] the request asked for.

use crate::provider::http::excerpt;
use crate::provider::prompt::AnswerShape;
use crate::provider::{ProviderAnswer, ProviderError};
use serde_json::{Value, json};
use tollgate_core::Usage;

/// Reads a Messages API answer. Anthropic's `input_tokens` counts only the input after
/// the last cache breakpoint: the usage's `input_tokens` is the whole input (that plus
/// `cache_read_input_tokens` and `cache_creation_input_tokens`), of which the cache
/// reads are `cached_input_tokens` and the cache writes `cache_write_input_tokens`.
pub fn parse_answer(answer: &Value, shape: AnswerShape) -> Result<ProviderAnswer, ProviderError> {
    let reported = |key: &str| {
        answer
            .get("usage")
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
    };
    let (input, output) = (reported("input_tokens"), reported("output_tokens"));
    let cache_read = reported("cache_read_input_tokens");
    let cache_write = reported("cache_creation_input_tokens");
    let usage = Usage {
        input_tokens: input
            .unwrap_or(0)
            .saturating_add(cache_read.unwrap_or(0))
            .saturating_add(cache_write.unwrap_or(0)),
        output_tokens: output.unwrap_or(0),
        cost_usd: None,
        cost_nano_usd: None,
        cached_input_tokens: cache_read,
        cache_write_input_tokens: cache_write,
        // No usage reported: the worker counts the attempt at its bound (docs/budgets.md).
        estimated: input.is_none() || output.is_none(),
    };
    let invalid = |message: String| ProviderError::InvalidOutput {
        message,
        usage,
        billed_before: false,
    };
    let Some(blocks) = answer.get("content").and_then(Value::as_array) else {
        return Err(ProviderError::Failed(format!(
            "the provider's answer has no content: {}",
            excerpt(&answer.to_string())
        )));
    };
    if answer.get("stop_reason").and_then(Value::as_str) == Some("refusal") {
        return Err(invalid(format!(
            "the model refused: {}",
            excerpt(&text_of(blocks))
        )));
    }
    if shape == AnswerShape::Message {
        return Ok(ProviderAnswer {
            output: message_output(answer, blocks),
            usage,
            billed_before: false,
        });
    }
    let tool_input = blocks
        .iter()
        .find(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .and_then(|b| b.get("input"));
    let output = match tool_input {
        Some(input) if shape != AnswerShape::Text => shape.output_from_json(input.clone()),
        _ => {
            let text = text_of(blocks);
            if text.is_empty() && shape != AnswerShape::Text {
                return Err(invalid(
                    "the answer has no text and no tool call".to_string(),
                ));
            }
            shape.output_from_text(&text)
        }
    };
    Ok(ProviderAnswer {
        output: output.map_err(invalid)?,
        usage,
        billed_before: false,
    })
}

/// A `chat` answer: the text blocks as the content (`null` when there is none), the
/// `tool_use` blocks as tool calls, the stop reason as a finish reason.
fn message_output(answer: &Value, blocks: &[Value]) -> Value {
    let text = text_of(blocks);
    let calls: Vec<Value> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .map(|b| {
            json!({
                "id": b.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": b.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": b.get("input").map(Value::to_string).unwrap_or_default(),
                }
            })
        })
        .collect();
    let finish_reason = match answer.get("stop_reason").and_then(Value::as_str) {
        Some("tool_use") => "tool_calls",
        Some("max_tokens") => "length",
        _ => "stop",
    };
    let mut output = json!({
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) },
        "finish_reason": finish_reason,
    });
    if !calls.is_empty() {
        output["tool_calls"] = Value::Array(calls);
    }
    output
}

/// The text blocks of an answer, joined.
fn text_of(blocks: &[Value]) -> String {
    blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text").and_then(Value::as_str))
        .collect::<Vec<_>>()
        .join("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_counts_cache_reads_and_writes_as_input() {
        let answer = json!({
            "content": [{"type": "text", "text": "Sure."},
                        {"type": "tool_use", "name": "classify", "input": {"label": "ham"}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 4,
                      "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}
        });
        let parsed = parse_answer(&answer, AnswerShape::Json).unwrap();
        assert_eq!(parsed.output, json!({"label": "ham"}));
        assert_eq!(
            (
                parsed.usage.input_tokens,
                parsed.usage.cached_input_tokens,
                parsed.usage.cache_write_input_tokens,
                parsed.usage.estimated
            ),
            (130, Some(100), Some(20), false)
        );
    }

    #[test]
    fn a_chat_answer_reads_text_and_tool_use_blocks() {
        let answer = json!({
            "content": [{"type": "text", "text": "Checking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                        {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 10, "output_tokens": 4}
        });
        let parsed = parse_answer(&answer, AnswerShape::Message).unwrap();
        assert_eq!(
            parsed.output,
            json!({"content": "Checking.", "finish_reason": "tool_calls", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "toolu_2", "type": "function", "function": {"name": "time", "arguments": "{}"}}
            ]})
        );
        let text =
            json!({"content": [{"type": "text", "text": "Sunny."}], "stop_reason": "end_turn"});
        assert_eq!(
            parse_answer(&text, AnswerShape::Message).unwrap().output,
            json!({"content": "Sunny.", "finish_reason": "stop"})
        );
    }

    #[test]
    fn refusals_and_bad_text_are_invalid_outputs() {
        let refused = json!({"content": [{"type": "text", "text": "I can't."}],
                             "stop_reason": "refusal", "usage": {"input_tokens": 1, "output_tokens": 1}});
        assert!(matches!(
            parse_answer(&refused, AnswerShape::Json),
            Err(ProviderError::InvalidOutput { message, .. }) if message.contains("refused")
        ));
        let bad = json!({"content": [{"type": "text", "text": "{nope"}]});
        match parse_answer(&bad, AnswerShape::Json) {
            Err(ProviderError::InvalidOutput { usage, .. }) => assert!(usage.estimated),
            other => panic!("{other:?}"),
        }
        let text = json!({"content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}],
                          "usage": {"input_tokens": 1, "output_tokens": 1}});
        assert_eq!(
            parse_answer(&text, AnswerShape::Text).unwrap().output,
            json!({"text": "Hello"})
        );
    }
}
