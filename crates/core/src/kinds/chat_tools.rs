//! `chat`'s tools and `tool_choice`: parsed field by field, every error naming its path.

use std::collections::HashSet;

use serde_json::Value;

use super::chat::{
    ChatTool, FunctionTool, MAX_CHAT_TOOLS, MAX_TOOL_NAME_BYTES, NamedToolChoice, ToolChoice,
    ToolChoiceMode, ToolType, array,
};
use super::extract_data::check_schema;
use super::messages::{clip, describe};
use super::parse::{de, object, optional};
use crate::error::InvalidInput;

/// The offered tools: 1 to [`MAX_CHAT_TOOLS`], names valid and unique, each
/// `parameters` an object JSON Schema.
pub(super) fn parse_tools(value: &Value) -> Result<Vec<ChatTool>, InvalidInput> {
    let path = "request.tools";
    let elements = array(value, path)?;
    if elements.is_empty() {
        return Err(InvalidInput::field(
            path,
            "must offer at least one tool (leave `tools` out to offer none)",
        ));
    }
    if elements.len() > MAX_CHAT_TOOLS {
        return Err(InvalidInput::field(
            path,
            format!(
                "has {} tools, over the limit of {MAX_CHAT_TOOLS}",
                elements.len()
            ),
        ));
    }
    let mut names: HashSet<&str> = HashSet::new();
    let mut tools = Vec::with_capacity(elements.len());
    for (i, element) in elements.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let map = object(element, &at, &["type", "function"])?;
        let function_path = format!("{at}.function");
        match map.get("type") {
            Some(Value::String(t)) if t == "function" => {}
            Some(other) => {
                return Err(InvalidInput::field(
                    format!("{at}.type"),
                    format!("must be \"function\", got {}", clip(&other.to_string())),
                ));
            }
            None => return Err(InvalidInput::field(&at, "missing field `type`")),
        }
        let Some(function) = map.get("function") else {
            return Err(InvalidInput::field(&at, "missing field `function`"));
        };
        let fmap = object(
            function,
            &function_path,
            &["name", "description", "parameters", "strict"],
        )?;
        let name: String = match fmap.get("name") {
            Some(v) => de(v, &format!("{function_path}.name"))?,
            None => {
                return Err(InvalidInput::field(&function_path, "missing field `name`"));
            }
        };
        check_tool_name(&name, &format!("{function_path}.name"))?;
        let parameters = match fmap.get("parameters") {
            None | Some(Value::Null) => None,
            Some(schema) => {
                let at = format!("{function_path}.parameters");
                check_parameters(schema, &at)?;
                Some(schema.clone())
            }
        };
        tools.push(ChatTool {
            tool_type: ToolType::Function,
            function: FunctionTool {
                name,
                description: optional(fmap, "description", &function_path)?,
                parameters,
                strict: optional(fmap, "strict", &function_path)?,
            },
        });
    }
    for (i, tool) in tools.iter().enumerate() {
        if !names.insert(tool.function.name.as_str()) {
            return Err(InvalidInput::field(
                format!("{path}[{i}].function.name"),
                format!(
                    "`{}` is the name of another tool: names must be unique",
                    clip(&tool.function.name)
                ),
            ));
        }
    }
    Ok(tools)
}

/// Letters, digits, `_` and `-`, 1 to [`MAX_TOOL_NAME_BYTES`] bytes.
fn check_tool_name(name: &str, path: &str) -> Result<(), InvalidInput> {
    let valid = !name.is_empty()
        && name.len() <= MAX_TOOL_NAME_BYTES
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if valid {
        Ok(())
    } else {
        Err(InvalidInput::field(
            path,
            format!(
                "`{}` is not a tool name: use 1 to {MAX_TOOL_NAME_BYTES} letters, digits, `_` \
                 or `-`",
                clip(name)
            ),
        ))
    }
}

/// A tool's arguments schema: a JSON object whose `type`, if any, is `object`, checked as
/// a caller's schema is, its validation cost capped.
fn check_parameters(schema: &Value, path: &str) -> Result<(), InvalidInput> {
    let Value::Object(map) = schema else {
        return Err(InvalidInput::field(
            path,
            format!(
                "must be a JSON Schema object describing the arguments object, not {}",
                describe(schema)
            ),
        ));
    };
    match map.get("type") {
        None => {}
        Some(Value::String(t)) if t == "object" => {}
        Some(other) => {
            return Err(InvalidInput::field(
                path,
                format!(
                    "must describe an object (`\"type\": \"object\"`): a tool's arguments are a \
                     JSON object, got `type` {}",
                    clip(&other.to_string())
                ),
            ));
        }
    }
    check_schema(schema, path)?;
    super::check_schema_cost(schema).map_err(|e| match e {
        InvalidInput::Field { reason, .. } => InvalidInput::field(path, reason),
        other => other,
    })
}

/// `tool_choice`: a mode, or a named function among the tools; `required` and a name
/// need tools.
pub(super) fn parse_tool_choice(
    value: &Value,
    tools: Option<&[ChatTool]>,
) -> Result<ToolChoice, InvalidInput> {
    let path = "request.tool_choice";
    let choice = match value {
        Value::String(mode) => match mode.as_str() {
            "auto" => ToolChoice::Mode(ToolChoiceMode::Auto),
            "none" => ToolChoice::Mode(ToolChoiceMode::None),
            "required" => ToolChoice::Mode(ToolChoiceMode::Required),
            other => {
                return Err(InvalidInput::field(
                    path,
                    format!(
                        "unknown tool choice `{}`: use auto, none, required or \
                         {{\"type\": \"function\", \"function\": {{\"name\": …}}}}",
                        clip(other)
                    ),
                ));
            }
        },
        Value::Object(_) => ToolChoice::Function(de::<NamedToolChoice>(value, path)?),
        other => {
            return Err(InvalidInput::field(
                path,
                format!("must be a string or an object, not {}", describe(other)),
            ));
        }
    };
    let offered = |name: &str| tools.into_iter().flatten().any(|t| t.function.name == name);
    match &choice {
        ToolChoice::Mode(ToolChoiceMode::Required) if tools.is_none() => Err(InvalidInput::field(
            path,
            "`required` needs `tools`: no tool is offered",
        )),
        ToolChoice::Function(named) if !offered(&named.function.name) => Err(InvalidInput::field(
            format!("{path}.function.name"),
            format!(
                "`{}` is not one of the offered tools",
                clip(&named.function.name)
            ),
        )),
        _ => Ok(choice),
    }
}
