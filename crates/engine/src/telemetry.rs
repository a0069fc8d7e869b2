//! Traces (docs/telemetry.md): one OpenTelemetry trace per task. The engine only speaks
//! the OpenTelemetry API; whoever embeds it (the server, the CLI) builds the exporter and
//! hands a tracer to [`TollgateBuilder::tracer`](crate::TollgateBuilder::tracer).
//!
//! Without a tracer every helper here is a branch on `None`: no span is built, no
//! attribute is formatted, nothing is exported.
//!
//! The tree of a task: the caller's span (its `traceparent`, when given) → the HTTP
//! request → `submit` → `admission`; the task stores `submit`'s position
//! ([`TraceParent`]) so the worker that claims it, on any replica, adds `queue` (from
//! creation to claim) and `execute` beside `admission`, and under `execute` one
//! `chat <model>` span per provider call (GenAI semantic conventions), `validate` per
//! output checked, and `settle` for the recorded end.

use crate::config::EngineConfig;
use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{
    FutureExt as _, SpanBuilder, SpanContext, SpanKind, Status, TraceContextExt, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue, SpanId, TraceFlags, TraceId, Value};
use std::borrow::Cow;
use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tollgate_core::{AppId, ModelRef, Task, Timestamp, TraceParent, Usage};

/// The instrumentation scope name of every span Tollgate makes.
pub const TRACER_NAME: &str = "tollgate";

/// Span attribute names (OpenTelemetry GenAI semantic conventions and Tollgate's own).
pub mod attr {
    /// `gen_ai.operation.name`: `chat` for a provider call.
    pub const GEN_AI_OPERATION: &str = "gen_ai.operation.name";
    /// `gen_ai.system`: the provider's implementation (`openai`, `dev`, …).
    pub const GEN_AI_SYSTEM: &str = "gen_ai.system";
    /// `gen_ai.request.model`: the provider's model name.
    pub const GEN_AI_REQUEST_MODEL: &str = "gen_ai.request.model";
    /// `gen_ai.usage.input_tokens`.
    pub const GEN_AI_INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// `gen_ai.usage.output_tokens`.
    pub const GEN_AI_OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// `gen_ai.input.messages`: the request (only for apps with `trace_content`).
    pub const GEN_AI_INPUT: &str = "gen_ai.input.messages";
    /// `gen_ai.output.messages`: the model's answer (only for apps with `trace_content`).
    pub const GEN_AI_OUTPUT: &str = "gen_ai.output.messages";
    /// What a call (or a task, on `settle`) cost, US dollars, when its prices are known.
    pub const COST_USD: &str = "tollgate.cost_usd";
    /// The task's id.
    pub const TASK_ID: &str = "tollgate.task.id";
    /// The task's app.
    pub const APP: &str = "tollgate.app";
    /// The task's kind.
    pub const KIND: &str = "tollgate.task.kind";
    /// The model id the caller asked for.
    pub const MODEL: &str = "tollgate.model";
    /// Admission's answer: `created`, `cached`, `existing` or the rejection's error code.
    pub const DECISION: &str = "tollgate.admission.decision";
    /// What admission reserved, US dollars.
    pub const RESERVED_USD: &str = "tollgate.reservation.usd";
    /// The provider call's number within the task (0: first call; above: re-asks).
    pub const ATTEMPT: &str = "tollgate.attempt";
    /// Whether the output checked was valid.
    pub const OUTPUT_VALID: &str = "tollgate.output.valid";
    /// The worker that claimed the task.
    pub const WORKER: &str = "tollgate.worker";
    /// How the task ended (`settle`): `succeeded`, `failed`, `aborted`, `interrupted`.
    pub const OUTCOME: &str = "tollgate.outcome";
    /// The error code a failed task ended with.
    pub const ERROR_CODE: &str = "tollgate.error.code";
    /// The pipeline run a step belongs to.
    pub const RUN_ID: &str = "tollgate.run.id";
    /// A pipeline step's key.
    pub const STEP: &str = "tollgate.step";
    /// The HTTP request's id (`x-request-id`).
    pub const REQUEST_ID: &str = "tollgate.request_id";
}

/// The engine's traces: off (no tracer), or a tracer and the apps whose prompt and
/// output text may be recorded (`[apps.<id>] trace_content = true`). Cloning shares it.
#[derive(Clone, Default)]
pub struct Traces {
    tracer: Option<Arc<BoxedTracer>>,
    content_apps: Arc<HashSet<String>>,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces")
            .field("enabled", &self.enabled())
            .field("content_apps", &self.content_apps)
            .finish()
    }
}

impl Traces {
    /// Traces with `tracer` (or off), recording content for the apps the configuration
    /// allows.
    pub fn new(tracer: Option<BoxedTracer>, config: &EngineConfig) -> Traces {
        let content_apps = config
            .apps
            .iter()
            .filter(|(_, app)| app.trace_content)
            .map(|(name, _)| name.clone())
            .collect();
        Traces {
            tracer: tracer.map(Arc::new),
            content_apps: Arc::new(content_apps),
        }
    }

    /// Whether spans are made at all.
    pub fn enabled(&self) -> bool {
        self.tracer.is_some()
    }

    /// Whether `app`'s prompts and outputs may go into spans.
    pub fn records_content(&self, app: &AppId) -> bool {
        self.enabled() && self.content_apps.contains(app.as_str())
    }

    /// Starts a span named `name` under `parent` (a context holding the parent span, or
    /// an empty one for a new trace), of `kind`, at `start` (default: now).
    pub fn start(
        &self,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        parent: &Context,
        start: Option<SystemTime>,
    ) -> TraceSpan {
        let Some(tracer) = &self.tracer else {
            return TraceSpan::off();
        };
        let mut builder = SpanBuilder::from_name(name).with_kind(kind);
        if let Some(start) = start {
            builder = builder.with_start_time(start);
        }
        let span = tracer.build_with_context(builder, parent);
        TraceSpan {
            context: Some(parent.with_span(span)),
        }
    }

    /// Starts `name` as a child of the current span (the HTTP request's, inside the
    /// server; a new trace elsewhere).
    pub(crate) fn start_here(&self, name: &'static str) -> TraceSpan {
        if !self.enabled() {
            return TraceSpan::off();
        }
        self.start(name, SpanKind::Internal, &Context::current(), None)
    }

    /// Starts `name` under a stored trace position (a run's) when there is one, else as
    /// [`start_here`](Self::start_here) does.
    pub(crate) fn start_under(&self, name: &'static str, parent: Option<TraceParent>) -> TraceSpan {
        if !self.enabled() {
            return TraceSpan::off();
        }
        match parent {
            Some(p) => self.start(name, SpanKind::Internal, &remote_context(p), None),
            None => self.start_here(name),
        }
    }

    /// Starts the span of a pipeline run's step submission (a new trace, the parent of
    /// the step's task): the run, the step and its attempt.
    pub(crate) fn pipeline_step(
        &self,
        run: &tollgate_core::Run,
        step: &tollgate_core::StepKey,
        attempt: u32,
    ) -> TraceSpan {
        if !self.enabled() {
            return TraceSpan::off();
        }
        let span = self.start("pipeline step", SpanKind::Internal, &Context::new(), None);
        span.set(attr::RUN_ID, run.id.to_string());
        span.set(attr::APP, run.app.to_string());
        span.set(attr::STEP, step.to_string());
        span.set(attr::ATTEMPT, i64::from(attempt));
        span
    }

    /// Starts `name` as a child of `parent`.
    pub(crate) fn child(&self, parent: &TraceSpan, name: &'static str) -> TraceSpan {
        if !parent.is_recording() {
            return TraceSpan::off();
        }
        self.start(name, SpanKind::Internal, &parent.context(), None)
    }

    /// Starts the HTTP server span of a request: a child of the caller's `traceparent`
    /// when it sent one, a new trace otherwise.
    pub fn server_span(&self, name: String, caller: Option<TraceParent>) -> TraceSpan {
        if !self.enabled() {
            return TraceSpan::off();
        }
        let parent = caller.map(remote_context).unwrap_or_default();
        self.start(name, SpanKind::Server, &parent, None)
    }

    /// Starts the spans a worker adds to a claimed task's trace: `queue` (from its
    /// creation to its claim, ended at once) and `execute` (returned), both children of
    /// the task's stored position. A task submitted with traces off starts a new trace.
    pub(crate) fn execution(&self, task: &Task, worker: &str) -> TraceSpan {
        if !self.enabled() {
            return TraceSpan::off();
        }
        let parent = task.trace_parent.map(remote_context).unwrap_or_default();
        let claimed = task
            .claimed_at
            .map(system_time)
            .unwrap_or_else(SystemTime::now);
        let queue = self.start(
            "queue",
            SpanKind::Internal,
            &parent,
            Some(system_time(task.created_at)),
        );
        queue.set_task(task);
        queue.end_at(claimed);
        let execute = self.start("execute", SpanKind::Internal, &parent, Some(claimed));
        execute.set_task(task);
        execute.set(attr::WORKER, worker.to_string());
        execute
    }

    /// Starts a provider call's span under `parent` (GenAI semantic conventions):
    /// `chat <model>`, with the provider's implementation, the model, and the call's
    /// number; the request text only when the app allows content.
    pub(crate) fn provider_call(
        &self,
        config: &EngineConfig,
        parent: &TraceSpan,
        task: &Task,
        model: &ModelRef,
        attempt: u32,
    ) -> TraceSpan {
        if !self.enabled() {
            return TraceSpan::off();
        }
        let span = self.start(
            format!("chat {}", model.model),
            SpanKind::Client,
            &parent.context(),
            None,
        );
        let system = config
            .providers
            .get(&model.provider)
            .and_then(|p| serde_json::to_value(p.kind).ok())
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_else(|| model.provider.clone());
        span.set(attr::GEN_AI_OPERATION, "chat");
        span.set(attr::GEN_AI_SYSTEM, system);
        span.set(attr::GEN_AI_REQUEST_MODEL, model.model.clone());
        span.set(attr::TASK_ID, task.id.to_string());
        span.set(attr::ATTEMPT, i64::from(attempt));
        if self.records_content(&task.app) {
            span.set(attr::GEN_AI_INPUT, task.request.to_string());
        }
        span
    }
}

impl Traces {
    /// Ends a provider call's span with what it used (tokens, cost) and, for apps that
    /// allow content, the model's output text.
    pub(crate) fn call_answered(
        &self,
        span: TraceSpan,
        task: &Task,
        output: Option<&serde_json::Value>,
        used: impl FnOnce() -> Usage,
    ) {
        if !span.is_recording() {
            return;
        }
        span.set_usage(&used());
        match output {
            Some(output) if self.records_content(&task.app) => {
                span.set(attr::GEN_AI_OUTPUT, output.to_string());
            }
            Some(_) => {}
            None => span.error("the model's output was refused"),
        }
    }
}

/// How a task's execution ended, on its `settle` span.
pub(crate) fn record_settle(span: &TraceSpan, outcome: &'static str, code: &'static str) {
    span.set(attr::OUTCOME, outcome);
    if code != "none" {
        span.set(attr::ERROR_CODE, code);
        span.error(code);
    }
}

/// One span, or nothing when traces are off. Ends when dropped (or at [`end_at`]).
///
/// [`end_at`]: TraceSpan::end_at
#[derive(Debug)]
pub struct TraceSpan {
    context: Option<Context>,
}

impl TraceSpan {
    /// A span that records nothing.
    pub fn off() -> TraceSpan {
        TraceSpan { context: None }
    }

    /// Whether this span records (traces are on).
    pub fn is_recording(&self) -> bool {
        self.context.is_some()
    }

    /// The context holding this span, to start children under (empty when off).
    pub fn context(&self) -> Context {
        self.context.clone().unwrap_or_default()
    }

    /// Sets an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<Value>) {
        if let Some(cx) = &self.context {
            cx.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// Sets an attribute whose value is only worth computing when recording.
    pub fn set_with<V: Into<Value>>(&self, key: &'static str, value: impl FnOnce() -> V) {
        if let Some(cx) = &self.context {
            cx.span().set_attribute(KeyValue::new(key, value()));
        }
    }

    /// Marks the span failed with `message`.
    pub fn error(&self, message: impl Into<Cow<'static, str>>) {
        if let Some(cx) = &self.context {
            cx.span().set_status(Status::error(message));
        }
    }

    /// The task's identity: id, app, kind, model.
    pub fn set_task(&self, task: &Task) {
        if self.context.is_none() {
            return;
        }
        self.set(attr::TASK_ID, task.id.to_string());
        self.set(attr::APP, task.app.to_string());
        self.set(attr::KIND, task.kind.as_str());
        self.set(attr::MODEL, task.model.to_string());
    }

    /// A provider call's (or a task's) usage: tokens, and the cost when priced.
    pub fn set_usage(&self, usage: &Usage) {
        if self.context.is_none() {
            return;
        }
        self.set(attr::GEN_AI_INPUT_TOKENS, usage.input_tokens as i64);
        self.set(attr::GEN_AI_OUTPUT_TOKENS, usage.output_tokens as i64);
        if let Some(cost) = usage.cost_usd {
            self.set(attr::COST_USD, cost);
        }
    }

    /// This span's position as a W3C `traceparent` (what a task stores for its worker).
    pub fn trace_parent(&self) -> Option<TraceParent> {
        let cx = self.context.as_ref()?;
        let span = cx.span();
        let sc = span.span_context();
        sc.is_valid().then(|| TraceParent {
            trace_id: sc.trace_id().to_bytes(),
            parent_id: sc.span_id().to_bytes(),
            flags: sc.trace_flags().to_u8(),
        })
    }

    /// Runs `future` with this span as the current one (spans started from
    /// [`Context::current`] inside it become its children).
    pub async fn in_scope<F: Future>(&self, future: F) -> F::Output {
        match &self.context {
            Some(cx) => future.with_context(cx.clone()).await,
            None => future.await,
        }
    }

    /// Ends the span at `at`.
    pub fn end_at(mut self, at: SystemTime) {
        if let Some(cx) = self.context.take() {
            cx.span().end_with_timestamp(at);
        }
    }
}

impl Drop for TraceSpan {
    fn drop(&mut self) {
        if let Some(cx) = self.context.take() {
            cx.span().end();
        }
    }
}

/// Admission's answer on its span: the decision (`created`, `cached`, `existing`, or
/// the refusal's error code), the task and what it reserved.
pub(crate) fn record_admission(
    span: &TraceSpan,
    answer: &Result<crate::Submitted, crate::EngineError>,
) {
    if !span.is_recording() {
        return;
    }
    match answer {
        Ok(s) => {
            let decision = if !s.created {
                "existing"
            } else if s.task.cached() {
                "cached"
            } else {
                "created"
            };
            span.set(attr::DECISION, decision);
            span.set_task(&s.task);
            if let Some(r) = s.task.reservation {
                span.set(
                    attr::RESERVED_USD,
                    tollgate_core::cost::nano_to_usd(r.nano_usd),
                );
            }
        }
        Err(e) => {
            let code = e.code().map_or("error", |c| c.as_str());
            span.set(attr::DECISION, code);
            span.error(e.to_string());
        }
    }
}

/// The log span of a worker's lines about a task (docs/telemetry.md, "Logs"):
/// `task{trace_id=…}` when the task was submitted with traces on, so every line the
/// execution writes joins its trace; no span (nothing formatted) otherwise.
pub(crate) fn task_log_span(task: &Task) -> tracing::Span {
    log_span(task.trace_parent)
}

fn log_span(position: Option<TraceParent>) -> tracing::Span {
    match position {
        Some(p) => tracing::info_span!("task", trace_id = %p.trace_id_hex()),
        None => tracing::Span::none(),
    }
}

/// The trace id of the current span (the request's, inside the HTTP layer), as 32
/// hexadecimal digits, for log lines; `None` outside a recorded trace.
pub fn current_trace_id() -> Option<String> {
    let cx = Context::current();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// A context whose (remote) parent is `parent`.
fn remote_context(parent: TraceParent) -> Context {
    Context::new().with_remote_span_context(SpanContext::new(
        TraceId::from_bytes(parent.trace_id),
        SpanId::from_bytes(parent.parent_id),
        TraceFlags::new(parent.flags),
        true,
        TraceState::default(),
    ))
}

fn system_time(at: Timestamp) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(at.0).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// A log writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log buffer").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// docs/telemetry.md, "Logs": a traced task's log lines carry its trace id; an
    /// untraced task's carry none (and no span is made for it).
    #[test]
    fn a_tasks_log_lines_carry_its_trace_id() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let traced = TraceParent {
            trace_id: [0xab; 16],
            parent_id: [1; 8],
            flags: 1,
        };
        tracing::subscriber::with_default(subscriber, || {
            log_span(Some(traced)).in_scope(|| tracing::info!(task = "t1", "task failed"));
            let none = log_span(None);
            assert!(none.is_none());
            none.in_scope(|| tracing::info!(task = "t2", "task failed"));
        });
        let out = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(
            lines[0].contains(&format!("task{{trace_id={}}}", "ab".repeat(16)))
                && lines[0].contains("t1"),
            "{out}"
        );
        assert!(
            !lines[1].contains("trace_id") && lines[1].contains("t2"),
            "{out}"
        );
    }
}
