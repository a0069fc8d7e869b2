use super::*;
use serde_json::json;
use tollgate_core::{TaskKind, ValidatedRequest};

const O200K: TokenCounter = TokenCounter {
    tokenizer: Tokenizer::O200kBase,
    dialect: ProviderKind::Openai,
    structured_output: StructuredOutput::JsonSchema,
};

const MODES: [StructuredOutput; 4] = [
    StructuredOutput::JsonSchema,
    StructuredOutput::JsonObject,
    StructuredOutput::Tool,
    StructuredOutput::Prompt,
];

fn request(kind: TaskKind, raw: Value) -> TaskRequest {
    ValidatedRequest::new(kind, &raw, 1 << 20)
        .unwrap()
        .request()
        .clone()
}

#[test]
fn the_bound_needs_an_output_bound() {
    let model = ModelRef::new("openai", "gpt-4o-mini");
    let classify = request(
        TaskKind::Classify,
        json!({"input": "Win a cruise", "labels": ["spam", "ham"]}),
    );
    assert_eq!(task_token_bound(O200K, &model, &classify, 2, 1 << 16), None);
    let mut bounded = model.clone();
    bounded.params.insert("max_tokens".into(), json!(20));
    let b = task_token_bound(O200K, &bounded, &classify, 2, 1 << 16).unwrap();
    assert_eq!((b.output_tokens, b.attempts), (20, 3));
    // The request's own bound wins.
    let text = request(
        TaskKind::GenerateText,
        json!({"prompt": "hello there", "max_output_tokens": 7}),
    );
    let b = task_token_bound(TokenCounter::bytes(), &bounded, &text, 0, 1 << 16).unwrap();
    assert_eq!(b.output_tokens, 7);
}

#[test]
fn a_real_tokenizer_counts_fewer_than_bytes_and_both_cover_everything_sent() {
    let model = ModelRef::new("openai", "gpt-4o");
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(50);
    let text = request(
        TaskKind::GenerateText,
        json!({"system": "Be brief.", "prompt": long, "max_output_tokens": 10}),
    );
    let tok = task_token_bound(O200K, &model, &text, 0, 1 << 16).unwrap();
    let bytes = task_token_bound(TokenCounter::bytes(), &model, &text, 0, 1 << 16).unwrap();
    // ~10 tokens per sentence, 50 sentences, plus system prompt and overheads.
    assert!(tok.input_tokens >= 500 && tok.input_tokens < 700, "{tok:?}");
    assert!(bytes.input_tokens > long.len() as u64, "{bytes:?}");
    // The schema of an extraction is counted.
    let schema = json!({"type": "object", "properties": {"name": {"type": "string", "description": "x".repeat(400)}}, "required": ["name"], "additionalProperties": false});
    let extract = request(
        TaskKind::ExtractData,
        json!({"input": "Ada", "schema": schema, "max_output_tokens": 10}),
    );
    let b = task_token_bound(O200K, &model, &extract, 0, 1 << 16).unwrap();
    assert!(b.input_tokens > 400, "{b:?}");
    let tokenizer = |kind, model| {
        TokenCounter::for_provider(kind, StructuredOutput::JsonSchema, model).tokenizer
    };
    assert_eq!(
        tokenizer(ProviderKind::Openai, "gpt-4o-mini"),
        Tokenizer::O200kBase
    );
    assert_eq!(
        tokenizer(ProviderKind::Openai, "llama-3-8b"),
        Tokenizer::Bytes
    );
    assert_eq!(tokenizer(ProviderKind::Dev, "gpt-4o"), Tokenizer::Bytes);
    assert_eq!(tokenizer(ProviderKind::Azure, "gpt-4o"), Tokenizer::Bytes);
    assert_eq!(
        tokenizer(ProviderKind::Anthropic, "claude-sonnet-4-5"),
        Tokenizer::Bytes
    );
}

/// The bound counts the prompt; the OpenAI-compatible body built from it counts the
/// same, re-asks, every kind and every structured-output mode included; Anthropic's
/// body sends no more bytes than its bound counts.
#[test]
fn the_prompt_and_the_body_sent_count_the_same() {
    use crate::provider::anthropic::request_body_as as anthropic_body;
    use crate::provider::openai::request_body_as;
    let mut model = ModelRef::new("openai", "gpt-4o");
    model.params.insert("temperature".into(), json!(0));
    let requests = [
        request(
            TaskKind::Classify,
            json!({"input": "Win a cruise", "labels": ["spam", {"name": "ham", "description": "fine"}], "instructions": "Be strict."}),
        ),
        request(
            TaskKind::ClassifyMany,
            json!({"items": [{"id": "a", "input": "x"}, {"id": "b", "input": "y"}], "labels": ["p", "q"]}),
        ),
        request(
            TaskKind::ExtractData,
            json!({"input": "Ada, 36", "schema": {"type": "array", "items": {"type": "integer"}}}),
        ),
        request(
            TaskKind::ExtractData,
            json!({"messages": [{"role": "user", "content": "u"}], "schema": {"type": "object"}, "instructions": "i"}),
        ),
        request(
            TaskKind::GenerateText,
            json!({"system": "Be brief.", "prompt": "Tell me more.", "temperature": 0.2}),
        ),
        request(
            TaskKind::GenerateText,
            json!({"system": "Be brief.", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}], "max_output_tokens": 5}),
        ),
        request(
            TaskKind::Chat,
            json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather and time in Paris?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_a", "content": "Sunny"},
                {"role": "tool", "tool_call_id": "call_b", "content": "10:00"}],
              "tools": [
                {"type": "function", "function": {"name": "weather", "description": "The weather",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
                {"type": "function", "function": {"name": "time"}}],
              "tool_choice": "required", "parallel_tool_calls": false, "max_output_tokens": 50}),
        ),
    ];
    for r in &requests {
        let schema = r.output_schema();
        for previous_error in [None, Some("label `eggs` is not one of the labels")] {
            let call = ProviderCall {
                model: &model,
                request: r,
                output_schema: &schema,
                previous_error,
                max_output_bytes: 1 << 16,
            };
            for mode in MODES {
                let (body, _) = request_body_as(&call, mode);
                for tokenizer in [Tokenizer::O200kBase, Tokenizer::Bytes] {
                    let counter = TokenCounter {
                        tokenizer,
                        dialect: ProviderKind::Openai,
                        structured_output: mode,
                    };
                    assert_eq!(
                        attempt_input_tokens(counter, &call),
                        body_input_tokens(counter, &body),
                        "{r:?} {previous_error:?} {mode:?}"
                    );
                }
                if mode == StructuredOutput::JsonObject {
                    continue;
                }
                let counter = TokenCounter::for_provider(ProviderKind::Anthropic, mode, "claude");
                let (body, _) = anthropic_body(&call, mode);
                let mut sent = body["system"].as_str().map_or(0, str::len) as u64;
                for m in body["messages"].as_array().unwrap() {
                    sent += content_bytes(&m["content"]);
                }
                for key in ["tools", "tool_choice", "output_config"] {
                    sent += body.get(key).map_or(0, |v| v.to_string().len()) as u64;
                }
                let bound = attempt_input_tokens(counter, &call);
                assert!(bound >= sent, "{r:?} {mode:?}: {bound} < {sent}");
                if body.get("tools").is_some() || body.get("output_config").is_some() {
                    assert!(
                        bound >= sent + ANTHROPIC_FORMAT_OVERHEAD_TOKENS,
                        "{r:?} {mode:?}"
                    );
                }
            }
        }
    }
}

/// The bytes of what a Messages API message says: its text, or its blocks' texts, ids,
/// names and tool inputs.
fn content_bytes(content: &Value) -> u64 {
    match content {
        Value::String(text) => text.len() as u64,
        Value::Array(blocks) => blocks
            .iter()
            .map(|b| {
                let text = |k: &str| b.get(k).and_then(Value::as_str).map_or(0, str::len);
                (text("text") + text("content") + text("id") + text("tool_use_id") + text("name"))
                    as u64
                    + b.get("input").map_or(0, |i| i.to_string().len() as u64)
            })
            .sum(),
        _ => 0,
    }
}

#[test]
fn reask_errors_are_cut() {
    let long = "é".repeat(5_000);
    let cut = reask_error(long);
    assert_eq!(cut.chars().count(), MAX_REASK_ERROR_CHARS);
    assert!(cut.len() as u64 <= 4 * MAX_REASK_ERROR_CHARS as u64);
    assert_eq!(reask_error("short".into()), "short");
}
