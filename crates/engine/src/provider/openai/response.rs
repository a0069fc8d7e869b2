//! Reading a chat completions answer: the usage, a refusal, the content as the output in
//! the [`AnswerShape`] the request asked for.

use super::http::excerpt;
use crate::provider::prompt::AnswerShape;
use crate::provider::{ProviderAnswer, ProviderError};
use serde_json::{Value, json};
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
    let Some(content) = message.get("content").and_then(Value::as_str) else {
        return Err(invalid("the answer has no message content".to_string()));
    };
    let output = match shape {
        AnswerShape::Text => json!({ "text": content }),
        AnswerShape::Json | AnswerShape::WrappedJson => {
            let parsed: Value = serde_json::from_str(strip_code_fence(content)).map_err(|e| {
                invalid(format!(
                    "the answer is not valid JSON ({e}): {}",
                    excerpt(content)
                ))
            })?;
            if shape == AnswerShape::WrappedJson {
                match parsed {
                    Value::Object(mut map) if map.contains_key("value") => {
                        map.remove("value").unwrap_or(Value::Null)
                    }
                    other => {
                        return Err(invalid(format!(
                            "the answer must be an object {{\"value\": …}}, got {}",
                            excerpt(&other.to_string())
                        )));
                    }
                }
            } else {
                parsed
            }
        }
    };
    Ok(ProviderAnswer { output, usage })
}

/// Some local servers wrap JSON in a Markdown code fence despite `response_format`.
fn strip_code_fence(content: &str) -> &str {
    let trimmed = content.trim();
    let Some(rest) = trimmed.strip_prefix("```") else {
        return trimmed;
    };
    let rest = rest.strip_prefix("json").unwrap_or(rest);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

#[cfg(test)]
mod tests {
    use super::*;

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
