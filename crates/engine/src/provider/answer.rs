//! Turning a model's answer into a task's output, for every dialect: the text (or a
//! tool call's arguments) read as the [`AnswerShape`] the prompt asked for.

use super::http::excerpt;
use super::prompt::AnswerShape;
use serde_json::{Value, json};

impl AnswerShape {
    /// The output of an answer whose content is `content`: `{"text": content}`, or the
    /// content parsed as JSON (a Markdown code fence or text around one JSON value is
    /// tolerated) and unwrapped for [`AnswerShape::WrappedJson`]. `Err`: why the content
    /// is not an output (the worker asks again with it).
    pub fn output_from_text(self, content: &str) -> Result<Value, String> {
        match self {
            AnswerShape::Text => Ok(json!({ "text": content })),
            AnswerShape::Message => Ok(json!({ "content": content, "finish_reason": "stop" })),
            AnswerShape::Json | AnswerShape::WrappedJson => {
                let parsed = parse_json_text(content).map_err(|e| {
                    format!("the answer is not valid JSON ({e}): {}", excerpt(content))
                })?;
                self.output_from_json(parsed)
            }
        }
    }

    /// The output of an answer given as JSON (a tool call's arguments, or parsed
    /// content): as is, or unwrapped from `{"value": …}` for
    /// [`AnswerShape::WrappedJson`].
    pub fn output_from_json(self, value: Value) -> Result<Value, String> {
        match (self, value) {
            (AnswerShape::WrappedJson, Value::Object(mut map)) if map.contains_key("value") => {
                Ok(map.remove("value").unwrap_or(Value::Null))
            }
            (AnswerShape::WrappedJson, other) => Err(format!(
                "the answer must be an object {{\"value\": …}}, got {}",
                excerpt(&other.to_string())
            )),
            (AnswerShape::Text, Value::String(text)) => Ok(json!({ "text": text })),
            (AnswerShape::Text, other) => Ok(json!({ "text": other.to_string() })),
            (AnswerShape::Json | AnswerShape::Message, value) => Ok(value),
        }
    }
}

/// JSON in a model's text: as is, else inside a Markdown code fence (some local servers
/// add one despite the format), else the outermost `{…}` of the text (a model without a
/// structured-output feature may talk around it).
fn parse_json_text(content: &str) -> Result<Value, serde_json::Error> {
    let fenced = strip_code_fence(content);
    match serde_json::from_str(fenced) {
        Ok(v) => Ok(v),
        Err(e) => {
            let (Some(start), Some(end)) = (fenced.find('{'), fenced.rfind('}')) else {
                return Err(e);
            };
            if start >= end {
                return Err(e);
            }
            serde_json::from_str(&fenced[start..=end]).map_err(|_| e)
        }
    }
}

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
    fn json_is_found_in_talkative_answers() {
        let shape = AnswerShape::Json;
        assert_eq!(
            shape.output_from_text("Sure! Here it is: {\"a\": {\"b\": 1}} Hope this helps."),
            Ok(json!({"a": {"b": 1}}))
        );
        assert_eq!(
            shape.output_from_text("```json\n{\"a\":1}\n```"),
            Ok(json!({"a": 1}))
        );
        assert!(shape.output_from_text("no json here").is_err());
        assert_eq!(
            AnswerShape::WrappedJson.output_from_json(json!({"value": [1]})),
            Ok(json!([1]))
        );
        assert!(
            AnswerShape::WrappedJson
                .output_from_json(json!([1]))
                .is_err()
        );
    }
}
