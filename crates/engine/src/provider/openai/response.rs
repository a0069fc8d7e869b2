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
    let invalid = |message: String| ProviderError::InvalidOutput { message, usage };
    let message = answer.pointer("/choices/0/message").ok_or_else(|| {
        ProviderError::Failed(format!(
            "the provider's answer has no choices[0].message: {}",
            excerpt(&answer.to_string())
        ))
    })?;
    if let Some(refusal) = message.get("refusal").and_then(Value::as_str) {
        return Err(invalid(format!("the model refused: {}", excerpt(refusal))));
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
    Ok(ProviderAnswer { output, usage })
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
