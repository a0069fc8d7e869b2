//! Reading a chat completions answer: the usage, a refusal, the content as the output in
//! the [`AnswerShape`] the request asked for.

use crate::provider::http::excerpt;
use crate::provider::prompt::AnswerShape;
use crate::provider::{ProviderAnswer, ProviderError};
use serde_json::Value;
use tollgate_core::Usage;

/// Reads a chat completions answer.
pub fn parse_answer(answer: &Value, shape: AnswerShape) -> Result<ProviderAnswer, ProviderError> {
    let reported = |key: &str| {
        answer
            .get("usage")
            .and_then(|u| u.get(key))
            .and_then(Value::as_u64)
    };
    let (input, output) = (reported("prompt_tokens"), reported("completion_tokens"));
    let usage = Usage {
        input_tokens: input.unwrap_or(0),
        output_tokens: output.unwrap_or(0),
        cost_usd: None,
        cached_input_tokens: answer
            .pointer("/usage/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64),
        cache_write_input_tokens: None,
        // No usage reported: the worker counts the attempt at its bound (docs/budgets.md).
        estimated: input.is_none() || output.is_none(),
        cost_nano_usd: None,
    };
    let invalid = |message: String| ProviderError::InvalidOutput {
        message,
        usage,
        billed_before: false,
    };
    let message = answer.pointer("/choices/0/message").ok_or_else(|| {
        ProviderError::Failed(format!(
            "the provider's answer has no choices[0].message: {}",
            excerpt(&answer.to_string())
        ))
    })?;
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
        return Err(invalid(format!("the model refused: {}", excerpt(refusal))));
    }
    if shape == AnswerShape::Message {
        // A chat's answer is the message itself; core validates its calls.
        let mut output = serde_json::Map::new();
        output.insert(
            "content".into(),
            message.get("content").cloned().unwrap_or(Value::Null),
        );
        match message.get("tool_calls") {
            None | Some(Value::Null) => {}
            Some(Value::Array(calls)) => {
                output.insert(
                    "tool_calls".into(),
                    Value::Array(calls.iter().map(call_fields).collect()),
                );
            }
            Some(other) => {
                output.insert("tool_calls".into(), other.clone());
            }
        }
        if let Some(reason) = answer.pointer("/choices/0/finish_reason") {
            output.insert("finish_reason".into(), reason.clone());
        }
        return Ok(ProviderAnswer {
            output: Value::Object(output),
            usage,
            billed_before: false,
        });
    }
    // A forced tool call (`structured_output = "tool"`) answers in its arguments, a
    // JSON text; anything else in the content.
    let arguments = message
        .pointer("/tool_calls/0/function/arguments")
        .and_then(Value::as_str);
    let content = match (arguments, message.get("content").and_then(Value::as_str)) {
        (Some(args), _) if shape != AnswerShape::Text => args,
        (_, Some(content)) => content,
        (Some(args), None) => args,
        (None, None) => return Err(invalid("the answer has no message content".to_string())),
    };
    let output = shape.output_from_text(content).map_err(invalid)?;
    Ok(ProviderAnswer {
        output,
        usage,
        billed_before: false,
    })
}

/// A tool call's own fields (`id`, `type`, `function.name`, `function.arguments`):
/// servers that add others (an `index`, …) are not refused for them.
fn call_fields(call: &Value) -> Value {
    let Value::Object(map) = call else {
        return call.clone();
    };
    let mut kept = serde_json::Map::new();
    for key in ["id", "type"] {
        if let Some(v) = map.get(key) {
            kept.insert(key.into(), v.clone());
        }
    }
    if let Some(function) = map.get("function") {
        let value = match function {
            Value::Object(f) => Value::Object(
                f.iter()
                    .filter(|(k, _)| matches!(k.as_str(), "name" | "arguments"))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
            ),
            other => other.clone(),
        };
        kept.insert("function".into(), value);
    }
    Value::Object(kept)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_tool_call_answers_in_its_arguments() {
        let answer = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"type": "function", "function": {"name": "classify", "arguments": "{\"label\":\"ham\"}"}}
        ]}}]});
        assert_eq!(
            parse_answer(&answer, AnswerShape::Json).unwrap().output,
            json!({"label": "ham"})
        );
    }

    #[test]
    fn a_chat_answer_is_its_message() {
        let answer = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"index": 0, "id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ]}, "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}});
        let parsed = parse_answer(&answer, AnswerShape::Message).unwrap();
        assert_eq!(
            parsed.output,
            json!({"content": null, "finish_reason": "tool_calls", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ]})
        );
        let text = json!({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]});
        assert_eq!(
            parse_answer(&text, AnswerShape::Message).unwrap().output,
            json!({"content": "hi", "finish_reason": "stop"})
        );
    }

    #[test]
    fn malformed_content_is_an_invalid_output_not_a_failure() {
        let answer = json!({"choices": [{"message": {"content": "{not json"}}]});
        match parse_answer(&answer, AnswerShape::Json) {
            Err(ProviderError::InvalidOutput { message, .. }) => {
                assert!(message.contains("not valid JSON"), "{message}")
            }
            other => panic!("{other:?}"),
        }
        let fenced = json!({"choices": [{"message": {"content": "```json\n{\"a\":1}\n```"}}]});
        assert_eq!(
            parse_answer(&fenced, AnswerShape::Json).unwrap().output,
            json!({"a": 1})
        );
    }
}
