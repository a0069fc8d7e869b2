//! `generate_text`: its request type and parsing.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Sampling;
use super::parse::{ROOT, list, object, optional};
use super::sampling::with_sampling_fields;
use crate::error::InvalidInput;

/// The fields of a `generate_text` request besides the sampling fields.
const GENERATE_TEXT_FIELDS: [&str; 3] = ["messages", "prompt", "system"];

/// A `generate_text` request: exactly one of `messages` or `prompt`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerateTextRequest {
    /// The chat so far (non-empty); exclusive with `prompt`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<ChatMessage>>,
    /// A single user prompt (non-empty); exclusive with `messages`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt: Option<String>,
    /// A system prompt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The sampling fields (flattened into the request object).
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// One message of a chat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: ChatRole,
    /// What is said.
    pub content: String,
}

/// The author of a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChatRole {
    /// Instructions to the model.
    System,
    /// The human side.
    User,
    /// The model side.
    Assistant,
}

pub(super) fn parse_generate_text(value: &Value) -> Result<GenerateTextRequest, InvalidInput> {
    let map = object(value, ROOT, &with_sampling_fields(&GENERATE_TEXT_FIELDS))?;
    let messages: Option<Vec<ChatMessage>> = match map.get("messages") {
        None | Some(Value::Null) => None,
        Some(v) => Some(list(v, "request.messages", usize::MAX, "messages")?),
    };
    let request = GenerateTextRequest {
        messages,
        prompt: optional(map, "prompt", ROOT)?,
        system: optional(map, "system", ROOT)?,
        sampling: Sampling::read(map)?,
    };
    match (&request.messages, &request.prompt) {
        (Some(_), Some(_)) => {
            return Err(InvalidInput::field(
                ROOT,
                "give exactly one of `messages` or `prompt`, not both",
            ));
        }
        (None, None) => {
            return Err(InvalidInput::field(
                ROOT,
                "one of `messages` or `prompt` is required",
            ));
        }
        _ => {}
    }
    if request.messages.as_ref().is_some_and(Vec::is_empty) {
        return Err(InvalidInput::field(
            "request.messages",
            "must contain at least one message",
        ));
    }
    if request.prompt.as_ref().is_some_and(String::is_empty) {
        return Err(InvalidInput::field("request.prompt", "must not be empty"));
    }
    request.sampling.check()?;
    Ok(request)
}

#[cfg(test)]
mod tests {
    use crate::kinds::TaskKind;
    use crate::kinds::test_support::*;
    use crate::kinds::{ChatRole, TaskRequest};
    use serde_json::json;

    #[test]
    fn generate_text_accepts_prompt_or_messages() {
        let r = accepts(
            TaskKind::GenerateText,
            json!({ "prompt": "Write a haiku", "system": "be brief", "max_output_tokens": 1, "temperature": 0 }),
        );
        let TaskRequest::GenerateText(g) = &r else {
            panic!()
        };
        assert_eq!(g.prompt.as_deref(), Some("Write a haiku"));
        assert_eq!(g.sampling.max_output_tokens, Some(1));
        assert_eq!(g.sampling.temperature, Some(0.0));
        let r = accepts(
            TaskKind::GenerateText,
            json!({ "messages": [
                { "role": "system", "content": "s" },
                { "role": "user", "content": "u" },
                { "role": "assistant", "content": "a" }
            ], "temperature": 2, "max_output_tokens": u32::MAX }),
        );
        let TaskRequest::GenerateText(g) = &r else {
            panic!()
        };
        let roles: Vec<ChatRole> = g
            .messages
            .as_ref()
            .unwrap()
            .iter()
            .map(|m| m.role)
            .collect();
        assert_eq!(
            roles,
            [ChatRole::System, ChatRole::User, ChatRole::Assistant]
        );
        assert_eq!(
            r.to_value(),
            json!({ "messages": [
                { "role": "system", "content": "s" },
                { "role": "user", "content": "u" },
                { "role": "assistant", "content": "a" }
            ], "temperature": 2.0, "max_output_tokens": u32::MAX })
        );
    }

    #[test]
    fn generate_text_needs_exactly_one_of_messages_or_prompt() {
        rejects(
            TaskKind::GenerateText,
            json!({}),
            "request",
            "one of `messages` or `prompt` is required",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "system": "s" }),
            "request",
            "is required",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "messages": [{ "role": "user", "content": "u" }] }),
            "request",
            "not both",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "messages": [] }),
            "request.messages",
            "at least one message",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "" }),
            "request.prompt",
            "must not be empty",
        );
    }

    #[test]
    fn generate_text_ranges() {
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "max_output_tokens": 0 }),
            "request.max_output_tokens",
            "at least 1",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": -0.01 }),
            "request.temperature",
            "from 0 to 2",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 2.0001 }),
            "request.temperature",
            "from 0 to 2",
        );
        rejects(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 1e308 }),
            "request.temperature",
            "from 0 to 2",
        );
        accepts(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 0.7 }),
        );
        accepts(
            TaskKind::GenerateText,
            json!({ "prompt": "p", "temperature": 2 }),
        );
    }
}
