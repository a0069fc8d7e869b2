//! `chat`: a plausible, deterministic assistant message. When tools are offered and the
//! choice allows it, a call of the forced tool (a named `tool_choice`) or the first tool,
//! its arguments the smallest instance of the tool's parameters — unless the
//! conversation ends with tool results and the choice is `auto`, when it answers in
//! text (so a tool loop ends). Otherwise text: the last message's first words.

use super::Refusal;
use super::instance::Builder;
use crate::cpu::Halt;
use serde_json::{Value, json};
use tollgate_core::ModelRef;
use tollgate_core::kinds::{ChatRequest, ChatTurn, ToolChoice, ToolChoiceMode};

/// The answer to `request`; `seed` makes the call id and the text's tag.
pub(super) fn answer(
    model: &ModelRef,
    request: &ChatRequest,
    seed: u64,
    budget: usize,
    halt: &Halt,
) -> Result<Value, Refusal> {
    let after_results = matches!(request.messages.last(), Some(ChatTurn::Tool { .. }));
    let tool = match request.effective_tool_choice() {
        ToolChoice::Mode(ToolChoiceMode::None) => None,
        ToolChoice::Mode(ToolChoiceMode::Auto) if after_results => None,
        ToolChoice::Mode(_) => request.tools.iter().flatten().next().map(|t| &t.function),
        ToolChoice::Function(named) => request.tool(&named.function.name),
    };
    if let Some(tool) = tool {
        let schema = tool.parameters_schema();
        let mut builder = Builder {
            root: &schema,
            budget,
            halt,
        };
        let arguments = builder.instance(&schema, 0)?;
        return Ok(json!({
            "content": Value::Null,
            "tool_calls": [{
                "id": format!("call_{seed:016x}"),
                "type": "function",
                "function": { "name": tool.name, "arguments": arguments.to_string() }
            }],
            "finish_reason": "tool_calls"
        }));
    }
    let mut text = format!("[dev provider, {}]", model.model);
    if after_results {
        text.push_str(" tool results:");
    }
    let source = last_text(request);
    let mut words: Vec<&str> = source.split_whitespace().take(12).collect();
    if let Some(limit) = request.sampling.max_output_tokens {
        words.truncate((limit as usize).saturating_sub(2));
    }
    for w in words {
        text.push(' ');
        text.push_str(w);
    }
    text.push_str(&format!(" (#{:08x})", seed as u32));
    Ok(json!({ "content": text, "finish_reason": "stop" }))
}

/// The text the answer echoes: the trailing tool results joined, else the last
/// message's text.
fn last_text(request: &ChatRequest) -> String {
    let results: Vec<&str> = request
        .messages
        .iter()
        .rev()
        .map_while(|turn| match turn {
            ChatTurn::Tool { content, .. } => Some(content.as_str()),
            _ => None,
        })
        .collect();
    if !results.is_empty() {
        return results.into_iter().rev().collect::<Vec<_>>().join(" ");
    }
    match request.messages.last() {
        Some(ChatTurn::System { content } | ChatTurn::User { content }) => content.clone(),
        Some(ChatTurn::Assistant { content, .. }) => content.clone().unwrap_or_default(),
        _ => String::new(),
    }
}
