//! docs/conformance.md#cost-reservation in the engine: the token bound of a task — an upper bound of what each
//! attempt sends, and its output-token bound — from which core prices the reservation.
//!
//! **Input bound.** The request is rendered as every dialect sends it
//! ([`Prompt::render`]: system prompt, instructions, labels, the schema, the chat, the
//! structured-output format) and every message is counted with its role and the chat
//! template's overhead ([`MESSAGE_OVERHEAD_TOKENS`] per message, [`REPLY_PRIMING_TOKENS`] for the
//! reply). Where the model family's tokenizer is known (OpenAI models on an `openai`
//! provider: `o200k_base` for gpt-4o/4.1/5 and the o-series, `cl100k_base` for gpt-4 and
//! gpt-3.5; counted with the `tiktoken-rs` crate, whose encodings are compiled in) the
//! messages are counted with it; otherwise by UTF-8 bytes, which no byte-level BPE can
//! exceed (every token covers at least one byte). The structured-output format (with
//! the schema, [`OutputFormat::to_json`](crate::provider::prompt::OutputFormat::to_json))
//! is always counted by its JSON bytes. A re-ask
//! adds one correction message whose error text the worker cuts to
//! [`MAX_REASK_ERROR_CHARS`] characters, bounded by bytes (the per-call bound of
//! provider pacing); admission reserves the first attempt only, and the worker reserves
//! each re-ask, counted exactly as sent ([`attempt_input_tokens`]), before making it.
//!
//! **Output bound.** The request's own `max_output_tokens`, else the model's
//! `max_output_tokens` (sent as `max_tokens`), else a `max_tokens` /
//! `max_completion_tokens` in the model's params. Without one there is no bound.

use crate::config::{EngineConfig, ProviderKind};
use crate::provider::ProviderCall;
use crate::provider::prompt::{self, Prompt};
use serde_json::Value;
use tollgate_core::{ModelRef, Reservation, Route, TaskRequest, TokenBound};

/// Tokens a chat template adds per message (role markers, separators), bounded above.
/// OpenAI documents 3 for its current models (plus the role's own tokens, counted
/// separately); 8 leaves room for other templates.
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 8;

/// Tokens that prime the assistant's reply (`<|start|>assistant<|message|>`), bounded.
pub const REPLY_PRIMING_TOKENS: u64 = 8;

/// The longest error text a re-ask sends back to the model, in characters (the worker
/// cuts longer ones, so the re-ask's bound holds).
pub const MAX_REASK_ERROR_CHARS: usize = 600;

/// The fixed text around a re-ask's error ([`Prompt::render`]), in bytes, bounded.
const REASK_FRAME_BYTES: u64 = 128;

// The bound holds the frame the prompt really sends.
const _: () = assert!(prompt::REASK_FRAME_BYTES as u64 <= REASK_FRAME_BYTES);

/// How a model's input tokens are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenCounter {
    /// OpenAI's `o200k_base` (gpt-4o, gpt-4.1, gpt-5, o1/o3/o4).
    O200kBase,
    /// OpenAI's `cl100k_base` (gpt-4, gpt-3.5).
    Cl100kBase,
    /// UTF-8 bytes: safe for any byte-level BPE.
    Bytes,
}

impl TokenCounter {
    /// The counter of a model: its family's tokenizer on an OpenAI provider where
    /// `tiktoken-rs` knows the model name, else bytes.
    pub fn for_model(provider: Option<ProviderKind>, model: &str) -> TokenCounter {
        use tiktoken_rs::tokenizer::{Tokenizer, get_tokenizer};
        if provider != Some(ProviderKind::Openai) {
            return TokenCounter::Bytes;
        }
        match get_tokenizer(model) {
            Some(Tokenizer::O200kBase) => TokenCounter::O200kBase,
            Some(Tokenizer::Cl100kBase) => TokenCounter::Cl100kBase,
            _ => TokenCounter::Bytes,
        }
    }

    /// The counter of a model of `config`.
    pub fn for_model_ref(config: &EngineConfig, model: &ModelRef) -> TokenCounter {
        let kind = config
            .providers
            .get(&model.provider)
            .map(|p| p.kind)
            .or((model.provider == crate::config::DEV_PROVIDER).then_some(ProviderKind::Dev));
        TokenCounter::for_model(kind, &model.model)
    }

    /// Tokens of `text` (bytes for [`TokenCounter::Bytes`]).
    pub fn count(self, text: &str) -> u64 {
        match self {
            TokenCounter::O200kBase => tiktoken_rs::o200k_base_singleton()
                .encode_ordinary(text)
                .len() as u64,
            TokenCounter::Cl100kBase => tiktoken_rs::cl100k_base_singleton()
                .encode_ordinary(text)
                .len() as u64,
            TokenCounter::Bytes => text.len() as u64,
        }
    }
}

/// The output-token bound of a request of `model` (see the module docs).
pub fn output_bound(model: &ModelRef, request: &TaskRequest) -> Option<u64> {
    let own = match request {
        TaskRequest::GenerateText(r) => r.max_output_tokens,
        TaskRequest::ExtractData(r) => r.max_output_tokens,
        TaskRequest::Classify(_) | TaskRequest::ClassifyMany(_) => None,
    };
    own.map(u64::from).or_else(|| {
        ["max_tokens", "max_completion_tokens"]
            .iter()
            .find_map(|k| model.params.get(*k).and_then(Value::as_u64))
    })
}

/// docs/conformance.md#cost-reservation: the token bound of one task — the pure function both admission (the
/// reservation) and provider pacing (docs/conformance.md#dispatch, [`TokenBound::per_attempt`]) use.
/// `None` when the request has no output-token bound.
pub fn task_token_bound(
    counter: TokenCounter,
    model: &ModelRef,
    request: &TaskRequest,
    max_reasks: u32,
    max_output_bytes: usize,
) -> Option<TokenBound> {
    let output_tokens = output_bound(model, request)?;
    let schema = request.output_schema();
    let call = ProviderCall {
        model,
        request,
        output_schema: &schema,
        previous_error: None,
        max_output_bytes,
    };
    let input = attempt_input_tokens(counter, &call);
    let reask = REASK_FRAME_BYTES + 4 * MAX_REASK_ERROR_CHARS as u64 + MESSAGE_OVERHEAD_TOKENS;
    Some(TokenBound {
        input_tokens: input,
        reask_input_tokens: reask,
        output_tokens,
        attempts: max_reasks.saturating_add(1),
    })
}

/// docs/routes.md: the admission reservation of a task of `route`: its first attempt at
/// the dearest deployment it could go to (each deployment's bound counted with its own
/// tokenizer, output bound and prices; [`tollgate_core::cost::dearest`]).
pub fn route_reservation(
    config: &EngineConfig,
    route: &Route,
    request: &TaskRequest,
    max_reasks: u32,
    max_output_bytes: usize,
) -> Reservation {
    let each: Vec<Reservation> = route
        .deployments
        .iter()
        .map(|d| {
            let model = d.model_ref();
            let counter = TokenCounter::for_model_ref(config, &model);
            let bound = task_token_bound(counter, &model, request, max_reasks, max_output_bytes);
            tollgate_core::cost::reservation(bound.as_ref(), d.prices)
        })
        .collect();
    tollgate_core::cost::dearest(&each).unwrap_or_default()
}

/// docs/budgets.md, "The reservation": the input tokens of one attempt, its prompt
/// rendered as it is sent ([`Prompt::render`]) and counted by [`prompt_input_tokens`].
/// Admission counts the first attempt with it; the worker counts each re-ask (whose
/// error text is known then) with it before reserving the re-ask.
pub fn attempt_input_tokens(counter: TokenCounter, call: &ProviderCall<'_>) -> u64 {
    prompt_input_tokens(counter, &Prompt::render(call))
}

/// docs/conformance.md#cost-reservation, docs/conformance.md#dispatch: the input-token bound of one prompt as it is sent: every message's
/// role and content counted by `counter` plus the template's overhead, the reply's
/// priming, and the structured-output format (with the schema) in bytes. The
/// reservation ([`task_token_bound`]) and the provider pace (per call, re-asks
/// included) both count with it.
pub fn prompt_input_tokens(counter: TokenCounter, prompt: &Prompt) -> u64 {
    let mut input = REPLY_PRIMING_TOKENS;
    for m in &prompt.messages {
        input += message_tokens(counter, m.role_name(), &m.content);
    }
    if let Some(format) = &prompt.format {
        input += format.to_json().to_string().len() as u64;
    }
    input
}

/// [`prompt_input_tokens`] of a chat-completions body as sent (its `messages` and
/// `response_format`), for checking a body a provider was sent against the bound: for
/// a body built from a prompt the two are equal.
pub fn body_input_tokens(counter: TokenCounter, body: &Value) -> u64 {
    let mut input = REPLY_PRIMING_TOKENS;
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        for m in messages {
            let text = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("");
            input += message_tokens(counter, text("role"), text("content"));
        }
    }
    if let Some(format) = body.get("response_format") {
        input += format.to_string().len() as u64;
    }
    input
}

/// One message: its role and content counted, plus the chat template's overhead.
fn message_tokens(counter: TokenCounter, role: &str, content: &str) -> u64 {
    counter.count(role) + counter.count(content) + MESSAGE_OVERHEAD_TOKENS
}

/// Cuts a re-ask's error text to [`MAX_REASK_ERROR_CHARS`] characters.
pub fn reask_error(message: String) -> String {
    if message.chars().count() <= MAX_REASK_ERROR_CHARS {
        message
    } else {
        message.chars().take(MAX_REASK_ERROR_CHARS).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tollgate_core::{TaskKind, ValidatedRequest};

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
        assert_eq!(
            task_token_bound(TokenCounter::O200kBase, &model, &classify, 2, 1 << 16),
            None
        );
        let mut bounded = model.clone();
        bounded.params.insert("max_tokens".into(), json!(20));
        let b = task_token_bound(TokenCounter::O200kBase, &bounded, &classify, 2, 1 << 16).unwrap();
        assert_eq!((b.output_tokens, b.attempts), (20, 3));
        // The request's own bound wins.
        let text = request(
            TaskKind::GenerateText,
            json!({"prompt": "hello there", "max_output_tokens": 7}),
        );
        let b = task_token_bound(TokenCounter::Bytes, &bounded, &text, 0, 1 << 16).unwrap();
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
        let tok = task_token_bound(TokenCounter::O200kBase, &model, &text, 0, 1 << 16).unwrap();
        let bytes = task_token_bound(TokenCounter::Bytes, &model, &text, 0, 1 << 16).unwrap();
        // ~10 tokens per sentence, 50 sentences, plus system prompt and overheads.
        assert!(tok.input_tokens >= 500 && tok.input_tokens < 700, "{tok:?}");
        assert!(bytes.input_tokens > long.len() as u64, "{bytes:?}");
        // The schema of an extraction is counted.
        let schema = json!({"type": "object", "properties": {"name": {"type": "string", "description": "x".repeat(400)}}, "required": ["name"], "additionalProperties": false});
        let extract = request(
            TaskKind::ExtractData,
            json!({"input": "Ada", "schema": schema, "max_output_tokens": 10}),
        );
        let b = task_token_bound(TokenCounter::O200kBase, &model, &extract, 0, 1 << 16).unwrap();
        assert!(b.input_tokens > 400, "{b:?}");
        assert_eq!(
            TokenCounter::for_model(Some(ProviderKind::Openai), "gpt-4o-mini"),
            TokenCounter::O200kBase
        );
        assert_eq!(
            TokenCounter::for_model(Some(ProviderKind::Openai), "llama-3-8b"),
            TokenCounter::Bytes
        );
        assert_eq!(
            TokenCounter::for_model(Some(ProviderKind::Dev), "gpt-4o"),
            TokenCounter::Bytes
        );
    }

    /// The bound counts the prompt; the OpenAI-compatible body built from it counts the
    /// same, re-asks and every kind included.
    #[test]
    fn the_prompt_and_the_body_sent_count_the_same() {
        use crate::provider::openai::request_body;
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
                let (body, _) = request_body(&call);
                for counter in [TokenCounter::O200kBase, TokenCounter::Bytes] {
                    assert_eq!(
                        attempt_input_tokens(counter, &call),
                        body_input_tokens(counter, &body),
                        "{r:?} {previous_error:?}"
                    );
                }
            }
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
}
