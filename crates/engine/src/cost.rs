//! docs/conformance.md#cost-reservation in the engine: the token bound of a task — an upper bound of what each
//! attempt sends, and its output-token bound — from which core prices the reservation.
//!
//! **Input bound.** The request is rendered as its provider's dialect sends it
//! ([`TokenCounter::render`], [`Prompt::render_as`] in the provider's structured-output
//! mode: system prompt, instructions, labels, the schema, the chat, the structured-output
//! format) and every message is counted with its role and the chat template's overhead
//! ([`MESSAGE_OVERHEAD_TOKENS`] per message, [`REPLY_PRIMING_TOKENS`] for the reply).
//! Where the model family's tokenizer is known (OpenAI models on an `openai` provider:
//! `o200k_base` for gpt-4o/4.1/5 and the o-series, `cl100k_base` for gpt-4 and gpt-3.5;
//! counted with the `tiktoken-rs` crate, whose encodings are compiled in) the messages
//! are counted with it; otherwise (Azure deployments, Anthropic, any other model) by
//! UTF-8 bytes, which no byte-level BPE can exceed (every token covers at least one
//! byte). The dialect's structured-output fields (`response_format`, a tool definition
//! and `tool_choice`, Anthropic's `output_config`) are always counted by their JSON
//! bytes, plus [`ANTHROPIC_FORMAT_OVERHEAD_TOKENS`] for Anthropic's tool-use system
//! prompt; in `json_object` and `prompt` modes the schema is part of the counted
//! instructions. A `chat`'s tool offer (`tools`, `tool_choice`, `parallel_tool_calls` as
//! its dialect sends them) and its messages' tool calls are counted the same way, by JSON
//! bytes (plus the tool-use system prompt on Anthropic), a tool result's call id by the
//! tokenizer. A re-ask
//! adds one correction message whose error text the worker cuts to
//! [`MAX_REASK_ERROR_CHARS`] characters, bounded by bytes (the per-call bound of
//! provider pacing); admission reserves the first attempt only, and the worker reserves
//! each re-ask, counted exactly as sent ([`attempt_input_tokens`]), before making it.
//!
//! **Output bound.** The request's own `max_output_tokens`, else the model's
//! `max_output_tokens` (sent as `max_tokens`), else a `max_tokens` /
//! `max_completion_tokens` in the model's params. Without one there is no bound.

use crate::config::{EngineConfig, ProviderKind, StructuredOutput};
use crate::provider::pace::DEFAULT_PACE_OUTPUT_TOKENS;
use crate::provider::prompt::{self, OutputFormat, Prompt, PromptMessage, ToolOffer};
use crate::provider::{ProviderCall, anthropic, openai};
use serde_json::Value;
use tollgate_core::{
    EmbedRequest, InvalidInput, ModelRef, Reservation, Route, TaskRequest, TokenBound,
};

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

/// A tokenizer: how text is counted in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokenizer {
    /// OpenAI's `o200k_base` (gpt-4o, gpt-4.1, gpt-5, o1/o3/o4).
    O200kBase,
    /// OpenAI's `cl100k_base` (gpt-4, gpt-3.5).
    Cl100kBase,
    /// UTF-8 bytes: safe for any byte-level BPE.
    Bytes,
}

impl Tokenizer {
    /// Tokens of `text` (bytes for [`Tokenizer::Bytes`]).
    pub fn count(self, text: &str) -> u64 {
        match self {
            Tokenizer::O200kBase => tiktoken_rs::o200k_base_singleton()
                .encode_ordinary(text)
                .len() as u64,
            Tokenizer::Cl100kBase => tiktoken_rs::cl100k_base_singleton()
                .encode_ordinary(text)
                .len() as u64,
            Tokenizer::Bytes => text.len() as u64,
        }
    }
}

/// Tokens Anthropic adds to the input of a call with a forced tool or JSON outputs (its
/// tool-use system prompt; documented from about 260 to 530 depending on the model and
/// `tool_choice`), bounded above.
pub const ANTHROPIC_FORMAT_OVERHEAD_TOKENS: u64 = 1024;

/// How a model's input is counted: its tokenizer, and the dialect and structured-output
/// mode that decide what a call sends around the prompt (a `response_format`, a tool
/// definition, Anthropic's tool-use system prompt, or the schema in the instructions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCounter {
    /// How text is counted.
    pub tokenizer: Tokenizer,
    /// The dialect the prompt is sent in.
    pub dialect: ProviderKind,
    /// How structured output is asked for.
    pub structured_output: StructuredOutput,
}

impl TokenCounter {
    /// Bytes, in the OpenAI-compatible dialect with `json_schema`.
    pub const fn bytes() -> TokenCounter {
        TokenCounter {
            tokenizer: Tokenizer::Bytes,
            dialect: ProviderKind::Openai,
            structured_output: StructuredOutput::JsonSchema,
        }
    }

    /// The counter of `model` on a provider of `kind` asking for structured output as
    /// `mode` says: the model family's tokenizer on an `openai` provider where
    /// `tiktoken-rs` knows the model name, else bytes (an Azure deployment's name and a
    /// Claude model name say nothing certain about the tokenizer).
    pub fn for_provider(kind: ProviderKind, mode: StructuredOutput, model: &str) -> TokenCounter {
        use tiktoken_rs::tokenizer::{Tokenizer as Tiktoken, get_tokenizer};
        let tokenizer = match (kind, get_tokenizer(model)) {
            (ProviderKind::Openai, Some(Tiktoken::O200kBase)) => Tokenizer::O200kBase,
            (ProviderKind::Openai, Some(Tiktoken::Cl100kBase)) => Tokenizer::Cl100kBase,
            _ => Tokenizer::Bytes,
        };
        TokenCounter {
            tokenizer,
            dialect: kind,
            structured_output: mode,
        }
    }

    /// The counter of a model of `config` (a provider it does not know, one added in
    /// code: bytes, OpenAI-compatible, `json_schema`).
    pub fn for_model_ref(config: &EngineConfig, model: &ModelRef) -> TokenCounter {
        match config.providers.get(&model.provider) {
            Some(p) => TokenCounter::for_provider(p.kind, p.structured_output(), &model.model),
            None => match config.provider_kind(&model.provider) {
                Some(kind) => {
                    TokenCounter::for_provider(kind, kind.default_structured_output(), &model.model)
                }
                None => TokenCounter::bytes(),
            },
        }
    }

    /// Tokens of `text`.
    pub fn count(self, text: &str) -> u64 {
        self.tokenizer.count(text)
    }

    /// The prompt of `call` as this counter's dialect and mode send it.
    pub fn render(self, call: &ProviderCall<'_>) -> Prompt {
        Prompt::render_as(call, self.structured_output)
    }

    /// docs/conformance.md#provider-pace: the token bound of one call whose prompt is
    /// `prompt` — its input as counted for the reservation plus its output bound (or
    /// [`DEFAULT_PACE_OUTPUT_TOKENS`] without one), settled later with the usage.
    pub fn pace_estimate(self, call: &ProviderCall<'_>, prompt: &Prompt) -> u64 {
        let output =
            output_bound(call.model, call.request).unwrap_or(u64::from(DEFAULT_PACE_OUTPUT_TOKENS));
        prompt_input_tokens(self, prompt).saturating_add(output)
    }

    /// Input tokens the dialect's structured-output fields add: their JSON bytes, plus
    /// Anthropic's tool-use system prompt.
    fn format_tokens(self, format: &OutputFormat) -> u64 {
        let fields = match self.dialect {
            ProviderKind::Anthropic => anthropic::format_fields(format),
            _ => openai::format_fields(format),
        };
        let bytes: u64 = fields.iter().map(|(_, v)| v.to_string().len() as u64).sum();
        let overhead = match (self.dialect, format) {
            (
                ProviderKind::Anthropic,
                OutputFormat::Tool { .. } | OutputFormat::JsonSchema { .. },
            ) => ANTHROPIC_FORMAT_OVERHEAD_TOKENS,
            _ => 0,
        };
        bytes + overhead
    }

    /// Input tokens a `chat`'s tool offer adds: the dialect's `tools` / `tool_choice` /
    /// `parallel_tool_calls` fields in JSON bytes (OpenAI renders the definitions into
    /// fewer tokens than their JSON has bytes), plus Anthropic's tool-use system prompt.
    fn tool_tokens(self, offer: &ToolOffer) -> u64 {
        let (fields, overhead) = match self.dialect {
            ProviderKind::Anthropic => (
                anthropic::tool_fields(offer),
                ANTHROPIC_FORMAT_OVERHEAD_TOKENS,
            ),
            _ => (openai::tool_fields(offer), 0),
        };
        fields
            .iter()
            .map(|(_, v)| v.to_string().len() as u64)
            .sum::<u64>()
            + overhead
    }
}

/// The output-token bound of a request of `model` (see the module docs).
/// An `embed` request has no output tokens: its bound is 0 (docs/budgets.md).
pub fn output_bound(model: &ModelRef, request: &TaskRequest) -> Option<u64> {
    if let TaskRequest::Embed(_) = request {
        return Some(0);
    }
    let own = request.sampling().and_then(|s| s.max_output_tokens);
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
/// rendered as it is sent ([`TokenCounter::render`]) and counted by [`prompt_input_tokens`].
/// Admission counts the first attempt with it; the worker counts each re-ask (whose
/// error text is known then) with it before reserving the re-ask.
///
/// An `embed` call sends its texts and nothing else: its input is their tokens, summed
/// (docs/budgets.md, "Embeddings").
pub fn attempt_input_tokens(counter: TokenCounter, call: &ProviderCall<'_>) -> u64 {
    if let TaskRequest::Embed(r) = call.request {
        return r.texts().iter().map(|t| counter.count(t)).sum();
    }
    prompt_input_tokens(counter, &counter.render(call))
}

/// docs/conformance.md#cost-reservation, docs/conformance.md#dispatch: the input-token bound of one prompt as it is sent: every message's
/// role and content counted by `counter` plus the template's overhead, the reply's
/// priming, and the structured-output format (with the schema) in bytes. The
/// reservation ([`task_token_bound`]) and the provider pace (per call, re-asks
/// included) both count with it.
pub fn prompt_input_tokens(counter: TokenCounter, prompt: &Prompt) -> u64 {
    let mut input = REPLY_PRIMING_TOKENS;
    for m in &prompt.messages {
        input += message_tokens(counter, m.role_name(), &m.content) + tool_turn_tokens(counter, m);
    }
    if let Some(format) = &prompt.format {
        input += counter.format_tokens(format);
    }
    if let Some(offer) = &prompt.tools {
        input += counter.tool_tokens(offer);
    }
    input
}

/// What a `chat` message carries besides its text: an assistant's tool calls in JSON
/// bytes (their arguments are JSON text), a tool result's call id.
fn tool_turn_tokens(counter: TokenCounter, m: &PromptMessage) -> u64 {
    let calls = if m.tool_calls.is_empty() {
        0
    } else {
        serde_json::json!(m.tool_calls).to_string().len() as u64
    };
    calls + m.tool_call_id.as_deref().map_or(0, |id| counter.count(id))
}

/// [`prompt_input_tokens`] of an OpenAI-compatible chat-completions body as sent (its
/// `messages` with their tool calls and call ids, and `response_format` or `tools` +
/// `tool_choice` + `parallel_tool_calls`), for checking a body a
/// provider was sent against the bound: for a body built from a prompt the two are
/// equal.
pub fn body_input_tokens(counter: TokenCounter, body: &Value) -> u64 {
    let mut input = REPLY_PRIMING_TOKENS;
    if let Some(messages) = body.get("messages").and_then(Value::as_array) {
        for m in messages {
            let text = |k: &str| m.get(k).and_then(Value::as_str).unwrap_or("");
            input += message_tokens(counter, text("role"), text("content"));
            input += m
                .get("tool_calls")
                .map_or(0, |c| c.to_string().len() as u64);
            input += m
                .get("tool_call_id")
                .and_then(Value::as_str)
                .map_or(0, |id| counter.count(id));
        }
    }
    for key in [
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
    ] {
        if let Some(field) = body.get(key) {
            input += field.to_string().len() as u64;
        }
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

/// The most tokens one `embed` item may have where the deployment's tokenizer is known
/// (OpenAI's per-input limit); elsewhere the request's byte limit per item applies
/// (docs/api.md, "Embeddings").
pub const MAX_EMBED_INPUT_TOKENS: u64 = 8192;

/// docs/api.md, "Embeddings": an `embed` request may go to `route` — no deployment is on
/// a provider without an embeddings API (Anthropic), and no item is over
/// [`MAX_EMBED_INPUT_TOKENS`] for a deployment whose tokenizer is known.
pub fn check_embed_route(
    config: &EngineConfig,
    route: &Route,
    request: &EmbedRequest,
) -> Result<(), InvalidInput> {
    for d in &route.deployments {
        if config.provider_kind(&d.provider) == Some(ProviderKind::Anthropic) {
            return Err(InvalidInput::field(
                "model",
                format!(
                    "deployment {} is on an `anthropic` provider, which has no embeddings API",
                    d.name()
                ),
            ));
        }
        let counter = TokenCounter::for_model_ref(config, &d.model_ref());
        if counter.tokenizer == Tokenizer::Bytes {
            continue;
        }
        for (i, text) in request.texts().iter().enumerate() {
            let n = counter.count(text);
            if n > MAX_EMBED_INPUT_TOKENS {
                return Err(InvalidInput::field(
                    format!("request.input[{i}]"),
                    format!(
                        "the text has {n} tokens, over the limit of {MAX_EMBED_INPUT_TOKENS} per item"
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
