//! OpenAI's chat completions request → a Tollgate task request. What this door supports
//! is turned into a `generate_text` request (`response_format` absent or `text`), an
//! `extract_data` request (`json_object`, `json_schema`) or, with `tools` or tool calls in
//! the history, a `chat` request; everything else is refused with a 400 naming the
//! parameter, never silently dropped. Ranges (temperature, top_p, stop,
//! seed, max tokens) are core's rules, checked when the task request is validated.

use super::error::OpenAiError;
use serde_json::{Map, Value, json};
use tollgate_core::TaskKind;

mod chat;

/// Parameters this door reads.
const SUPPORTED: [&str; 17] = [
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "messages",
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "n",
    "response_format",
    "user",
    "metadata",
    "stream",
    "stream_options",
];

/// Parameters of OpenAI's API that Tollgate does not support, with the reason given.
const REFUSED: [(&str, &str); 18] = [
    (
        "functions",
        "the deprecated function calling is not supported: use `tools`",
    ),
    (
        "function_call",
        "the deprecated function calling is not supported: use `tool_choice`",
    ),
    ("audio", "audio output is not supported"),
    ("modalities", "only text output is supported"),
    ("logprobs", "log probabilities are not recorded"),
    ("top_logprobs", "log probabilities are not recorded"),
    ("logit_bias", "logit bias is not supported"),
    ("frequency_penalty", "penalties are not supported"),
    ("presence_penalty", "penalties are not supported"),
    ("prediction", "predicted outputs are not supported"),
    ("reasoning_effort", "reasoning options are not supported"),
    ("service_tier", "service tiers are not supported"),
    (
        "store",
        "Tollgate stores every call as a task; OpenAI's stored completions are not supported",
    ),
    ("web_search_options", "web search is not supported"),
    ("verbosity", "verbosity is not supported"),
    (
        "prompt_cache_key",
        "use X-Tollgate-Source for Tollgate's cache",
    ),
    ("safety_identifier", "safety identifiers are not supported"),
    (
        "stream_options.include_obfuscation",
        "stream obfuscation is not supported",
    ),
];

/// Most `metadata` pairs, and their lengths (OpenAI's limits).
const MAX_METADATA_PAIRS: usize = 16;
const MAX_METADATA_KEY_CHARS: usize = 64;
const MAX_METADATA_VALUE_CHARS: usize = 512;
/// Longest `user`.
const MAX_USER_CHARS: usize = 256;

/// A chat completions request, read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ChatRequest {
    /// The Tollgate model id.
    pub model: String,
    /// `generate_text`, `extract_data` or `chat`.
    pub kind: TaskKind,
    /// The task request (validated by core when submitted).
    pub request: Value,
    /// `stream: true`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The output token cap, to tell `length` from `stop`.
    pub max_tokens: Option<u64>,
}

fn describe(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

pub(super) fn wrong_type(param: &str, expected: &str, got: &Value) -> OpenAiError {
    OpenAiError::invalid(
        param,
        format!("`{param}` must be {expected}, not {}", describe(got)),
    )
}

/// Reads the body; `Err` is the 400 to answer.
pub(crate) fn parse(body: &Value) -> Result<ChatRequest, OpenAiError> {
    let Value::Object(map) = body else {
        return Err(OpenAiError::invalid(
            "",
            format!("the body must be a JSON object, not {}", describe(body)),
        ));
    };
    for (key, value) in map {
        if SUPPORTED.contains(&key.as_str()) {
            continue;
        }
        if let Some((_, why)) = REFUSED.iter().find(|(k, _)| k == key) {
            // A value that asks for nothing is not a request for the feature.
            let benign = matches!(value, Value::Null)
                || (matches!(key.as_str(), "logprobs" | "store") && value == &json!(false))
                || (matches!(key.as_str(), "frequency_penalty" | "presence_penalty")
                    && value.as_f64() == Some(0.0));
            if benign {
                continue;
            }
            return Err(OpenAiError::unsupported(
                key.as_str(),
                format!("`{key}` is not supported by Tollgate: {why}"),
            ));
        }
        return Err(OpenAiError::unsupported(
            key.as_str(),
            format!("unknown parameter `{key}`"),
        ));
    }
    let get = |k: &str| map.get(k).filter(|v| !v.is_null());

    let model = match get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(other) if !other.is_string() => return Err(wrong_type("model", "a string", other)),
        _ => {
            return Err(OpenAiError::invalid(
                "model",
                "`model` is required: a Tollgate model id (GET /openai/v1/models lists them)",
            ));
        }
    };

    match get("n") {
        None => {}
        Some(n) if n.as_u64() == Some(1) => {}
        Some(n) => {
            return Err(OpenAiError::unsupported(
                "n",
                format!("only n = 1 is supported, got {n}"),
            ));
        }
    }

    let stream = match get("stream") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => return Err(wrong_type("stream", "a boolean", other)),
    };
    let include_usage = match get("stream_options") {
        None => false,
        Some(Value::Object(options)) => {
            if !stream {
                return Err(OpenAiError::invalid(
                    "stream_options",
                    "`stream_options` is only allowed with `stream: true`",
                ));
            }
            let mut include = false;
            for (k, v) in options {
                match (k.as_str(), v) {
                    ("include_usage", Value::Bool(b)) => include = *b,
                    ("include_usage", Value::Null) => {}
                    ("include_usage", other) => {
                        return Err(wrong_type(
                            "stream_options.include_usage",
                            "a boolean",
                            other,
                        ));
                    }
                    ("include_obfuscation", Value::Bool(false) | Value::Null) => {}
                    (other, _) => {
                        return Err(OpenAiError::unsupported(
                            format!("stream_options.{other}"),
                            format!("`stream_options.{other}` is not supported"),
                        ));
                    }
                }
            }
            include
        }
        Some(other) => return Err(wrong_type("stream_options", "an object", other)),
    };

    check_user_and_metadata(get("user"), get("metadata"))?;

    let messages = match get("messages") {
        Some(Value::Array(list)) => list,
        Some(other) => return Err(wrong_type("messages", "an array", other)),
        None => return Err(OpenAiError::invalid("messages", "`messages` is required")),
    };
    let chat = messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(i, m))
        .collect::<Result<Vec<Value>, OpenAiError>>()?;

    let max_tokens = match (get("max_tokens"), get("max_completion_tokens")) {
        (Some(a), Some(b)) if a != b => {
            return Err(OpenAiError::invalid(
                "max_completion_tokens",
                "`max_tokens` and `max_completion_tokens` differ: send one",
            ));
        }
        (Some(v), _) => Some(("max_tokens", v)),
        (None, Some(v)) => Some(("max_completion_tokens", v)),
        (None, None) => None,
    };
    let max_tokens = match max_tokens {
        None => None,
        Some((param, v)) => match v.as_u64() {
            Some(n) => Some(n),
            None => return Err(wrong_type(param, "a positive integer", v)),
        },
    };

    let mut request = Map::new();
    request.insert("messages".into(), Value::Array(chat));
    if let Some(n) = max_tokens {
        request.insert("max_output_tokens".into(), json!(n));
    }
    for key in ["temperature", "top_p", "seed"] {
        if let Some(v) = get(key) {
            request.insert(key.into(), v.clone());
        }
    }
    match get("stop") {
        None => {}
        Some(Value::String(s)) => {
            request.insert("stop".into(), json!([s]));
        }
        Some(v @ Value::Array(_)) => {
            request.insert("stop".into(), v.clone());
        }
        Some(other) => return Err(wrong_type("stop", "a string or an array of strings", other)),
    }

    let kind = if chat::is_chat(&get, messages)? {
        chat::check_format(get("response_format"))?;
        chat::insert_tool_params(&get, &mut request);
        TaskKind::Chat
    } else {
        match get("response_format") {
            None => TaskKind::GenerateText,
            Some(Value::Object(format)) => response_format(format, &mut request)?,
            Some(other) => return Err(wrong_type("response_format", "an object", other)),
        }
    };

    Ok(ChatRequest {
        model,
        kind,
        request: Value::Object(request),
        stream,
        include_usage,
        max_tokens,
    })
}

/// `user` and `metadata` are accepted (OpenAI's shapes) and kept out of the task: they
/// neither reach the provider nor change the cache key.
fn check_user_and_metadata(
    user: Option<&Value>,
    metadata: Option<&Value>,
) -> Result<(), OpenAiError> {
    match user {
        None => {}
        Some(Value::String(u)) if u.chars().count() <= MAX_USER_CHARS => {}
        Some(Value::String(_)) => {
            return Err(OpenAiError::invalid(
                "user",
                format!("`user` must be at most {MAX_USER_CHARS} characters"),
            ));
        }
        Some(other) => return Err(wrong_type("user", "a string", other)),
    }
    match metadata {
        None => Ok(()),
        Some(Value::Object(pairs)) => {
            if pairs.len() > MAX_METADATA_PAIRS {
                return Err(OpenAiError::invalid(
                    "metadata",
                    format!("`metadata` holds at most {MAX_METADATA_PAIRS} pairs"),
                ));
            }
            for (k, v) in pairs {
                let param = format!("metadata.{k}");
                if k.chars().count() > MAX_METADATA_KEY_CHARS {
                    return Err(OpenAiError::invalid(
                        param,
                        format!("metadata keys are at most {MAX_METADATA_KEY_CHARS} characters"),
                    ));
                }
                match v {
                    Value::String(s) if s.chars().count() <= MAX_METADATA_VALUE_CHARS => {}
                    Value::String(_) => {
                        return Err(OpenAiError::invalid(
                            param,
                            format!(
                                "metadata values are at most {MAX_METADATA_VALUE_CHARS} characters"
                            ),
                        ));
                    }
                    other => return Err(wrong_type(&param, "a string", other)),
                }
            }
            Ok(())
        }
        Some(other) => Err(wrong_type("metadata", "an object of strings", other)),
    }
}

/// One message → `{"role", "content"}` with text content; an assistant's `tool_calls`
/// and a tool result's `tool_call_id` kept as given (core checks them).
fn message(i: usize, m: &Value) -> Result<Value, OpenAiError> {
    let at = format!("messages[{i}]");
    let Value::Object(map) = m else {
        return Err(wrong_type(&at, "an object", m));
    };
    let role = match map.get("role") {
        Some(Value::String(r)) => r.as_str(),
        Some(other) => return Err(wrong_type(&format!("{at}.role"), "a string", other)),
        None => {
            return Err(OpenAiError::invalid(
                format!("{at}.role"),
                "a message needs a `role`",
            ));
        }
    };
    let role = match role {
        "system" | "user" | "assistant" | "tool" => role,
        // OpenAI's newer name for system instructions.
        "developer" => "system",
        "function" => {
            return Err(OpenAiError::unsupported(
                format!("{at}.role"),
                "`function` messages (deprecated function calling) are not supported: use \
                 `tool` messages",
            ));
        }
        other => {
            return Err(OpenAiError::invalid(
                format!("{at}.role"),
                format!("unknown role `{other}`: use system, developer, user, assistant or tool"),
            ));
        }
    };
    let own: &[&str] = match role {
        "assistant" => &["role", "content", "tool_calls"],
        "tool" => &["role", "content", "tool_call_id"],
        _ => &["role", "content"],
    };
    let calls = map.get("tool_calls").filter(|c| !c.is_null());
    for key in map.keys() {
        match key.as_str() {
            k if own.contains(&k) => {}
            "tool_calls" | "function_call" | "audio" | "name" | "refusal"
                if map.get(key).is_some_and(Value::is_null) => {}
            other => {
                return Err(OpenAiError::unsupported(
                    format!("{at}.{other}"),
                    format!("`{other}` in messages is not supported by Tollgate"),
                ));
            }
        }
    }
    let content = match map.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let pat = format!("{at}.content[{j}]");
                let kind = part.get("type").and_then(Value::as_str);
                match (kind, part.get("text")) {
                    (Some("text"), Some(Value::String(t))) => {
                        if let Some(extra) = part
                            .as_object()
                            .and_then(|o| o.keys().find(|k| *k != "type" && *k != "text"))
                        {
                            return Err(OpenAiError::unsupported(
                                format!("{pat}.{extra}"),
                                format!("`{extra}` in a content part is not supported"),
                            ));
                        }
                        text.push_str(t);
                    }
                    (Some("text"), other) => {
                        return Err(wrong_type(
                            &format!("{pat}.text"),
                            "a string",
                            other.unwrap_or(&Value::Null),
                        ));
                    }
                    (Some(other), _) => {
                        return Err(OpenAiError::unsupported(
                            pat,
                            format!("`{other}` content parts are not supported: only text is"),
                        ));
                    }
                    (None, _) => {
                        return Err(OpenAiError::invalid(pat, "a content part needs a `type`"));
                    }
                }
            }
            text
        }
        // An assistant message that only calls tools has no content.
        None | Some(Value::Null) if role == "assistant" && calls.is_some() => {
            return Ok(json!({ "role": role, "content": null, "tool_calls": calls }));
        }
        Some(other) => {
            return Err(wrong_type(
                &format!("{at}.content"),
                "a string or an array of text parts",
                other,
            ));
        }
        None => {
            return Err(OpenAiError::invalid(
                format!("{at}.content"),
                "a message needs `content`",
            ));
        }
    };
    Ok(match (role, calls) {
        ("tool", _) => chat::tool_message(map, content),
        ("assistant", Some(calls)) => {
            json!({ "role": role, "content": content, "tool_calls": calls })
        }
        _ => json!({ "role": role, "content": content }),
    })
}

/// `text` → `generate_text`; `json_object` → `extract_data` with the schema
/// `{"type": "object"}`; `json_schema` → `extract_data` with its schema (its
/// `description` becomes the instructions).
fn response_format(
    format: &Map<String, Value>,
    request: &mut Map<String, Value>,
) -> Result<TaskKind, OpenAiError> {
    let ty = match format.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(other) => return Err(wrong_type("response_format.type", "a string", other)),
        None => {
            return Err(OpenAiError::invalid(
                "response_format.type",
                "`response_format` needs a `type`",
            ));
        }
    };
    let only = |allowed: &[&str]| -> Result<(), OpenAiError> {
        match format.keys().find(|k| !allowed.contains(&k.as_str())) {
            Some(k) => Err(OpenAiError::unsupported(
                format!("response_format.{k}"),
                format!("unknown parameter `response_format.{k}`"),
            )),
            None => Ok(()),
        }
    };
    match ty {
        "text" => {
            only(&["type"])?;
            Ok(TaskKind::GenerateText)
        }
        "json_object" => {
            only(&["type"])?;
            request.insert("schema".into(), json!({"type": "object"}));
            Ok(TaskKind::ExtractData)
        }
        "json_schema" => {
            only(&["type", "json_schema"])?;
            let spec = match format.get("json_schema") {
                Some(Value::Object(spec)) => spec,
                Some(other) => {
                    return Err(wrong_type(
                        "response_format.json_schema",
                        "an object",
                        other,
                    ));
                }
                None => {
                    return Err(OpenAiError::invalid(
                        "response_format.json_schema",
                        "`json_schema` is required with type json_schema",
                    ));
                }
            };
            for k in spec.keys() {
                if !matches!(k.as_str(), "name" | "schema" | "strict" | "description") {
                    return Err(OpenAiError::unsupported(
                        format!("response_format.json_schema.{k}"),
                        format!("unknown parameter `response_format.json_schema.{k}`"),
                    ));
                }
            }
            match spec.get("name") {
                Some(Value::String(n))
                    if !n.is_empty()
                        && n.len() <= 64
                        && n.chars()
                            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') => {}
                _ => {
                    return Err(OpenAiError::invalid(
                        "response_format.json_schema.name",
                        "`name` is required: 1 to 64 letters, digits, `_` or `-`",
                    ));
                }
            }
            match spec.get("strict") {
                None | Some(Value::Null | Value::Bool(_)) => {}
                Some(other) => {
                    return Err(wrong_type(
                        "response_format.json_schema.strict",
                        "a boolean",
                        other,
                    ));
                }
            }
            let schema = spec.get("schema").cloned().unwrap_or(json!({}));
            request.insert("schema".into(), schema);
            match spec.get("description") {
                None | Some(Value::Null) => {}
                Some(Value::String(d)) => {
                    request.insert("instructions".into(), json!(d));
                }
                Some(other) => {
                    return Err(wrong_type(
                        "response_format.json_schema.description",
                        "a string",
                        other,
                    ));
                }
            }
            Ok(TaskKind::ExtractData)
        }
        other => Err(OpenAiError::invalid(
            "response_format.type",
            format!("unknown response_format type `{other}`: use text, json_object or json_schema"),
        )),
    }
}

#[cfg(test)]
mod tests;
