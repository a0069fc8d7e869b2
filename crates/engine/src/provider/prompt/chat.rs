//! A `chat` request's prompt: its conversation as messages (tool calls and results
//! included) and the tools it offers.

use super::{PromptMessage, PromptRole, ToolOffer};
use tollgate_core::kinds::{ChatRequest, ChatTurn};

/// The conversation, message for message.
pub(super) fn messages(request: &ChatRequest) -> Vec<PromptMessage> {
    request
        .messages
        .iter()
        .map(|turn| match turn {
            ChatTurn::System { content } => {
                PromptMessage::new(PromptRole::System, content.as_str())
            }
            ChatTurn::User { content } => PromptMessage::new(PromptRole::User, content.as_str()),
            ChatTurn::Assistant {
                content,
                tool_calls,
            } => PromptMessage {
                tool_calls: tool_calls.clone().unwrap_or_default(),
                ..PromptMessage::new(PromptRole::Assistant, content.as_deref().unwrap_or(""))
            },
            ChatTurn::Tool {
                tool_call_id,
                content,
            } => PromptMessage {
                tool_call_id: Some(tool_call_id.clone()),
                ..PromptMessage::new(PromptRole::Tool, content.as_str())
            },
        })
        .collect()
}

/// The tools offered, with the choice and parallelism asked for; `None` without tools
/// (the APIs refuse `tool_choice` and `parallel_tool_calls` without tools, and without
/// tools there is nothing to call).
pub(super) fn offer(request: &ChatRequest) -> Option<ToolOffer> {
    let tools = request.tools.clone()?;
    Some(ToolOffer {
        tools,
        tool_choice: request.tool_choice.clone(),
        parallel_tool_calls: request.parallel_tool_calls,
    })
}
