//! docs/telemetry.md: the spans the engine makes for one task, on SQLite and PostgreSQL,
//! read from an in-memory exporter: `submit` → `admission`, then the worker's `queue`
//! and `execute`, under which each provider call (`chat <model>`, GenAI attributes,
//! tokens and cost) is followed by its `validate`, a refused output being re-asked, and
//! `settle`. No prompt or output text without the app's `trace_content`; without a
//! tracer a task has no trace position.

mod common;

use async_trait::async_trait;
use common::*;
use opentelemetry::global::BoxedTracer;
use opentelemetry::trace::{SpanId, Status, TracerProvider as _};
use opentelemetry::{KeyValue, Value};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tollgate_core::{ModelId, NewRun, PipelineName, RunState, TaskKind, TaskStatus, Usage};
use tollgate_engine::config::{AppConfig, ModelConfig, ModelPrices};
use tollgate_engine::{
    EngineConfig, Provider, ProviderAnswer, ProviderCall, ProviderError, Submission,
};

on_both_backends!(
    a_reasked_task_is_one_trace_of_submit_queue_calls_validations_and_settle,
    content_goes_into_spans_only_for_apps_that_allow_it,
    without_a_tracer_tasks_carry_no_trace,
    a_pipeline_step_is_the_parent_of_its_task,
    a_runs_tasks_are_children_of_the_run_span,
);

const SECRET: &str = "the secret prompt text";

/// Answers a label outside the offered ones first (refused by validation, re-asked),
/// then a valid one; reports 10 input and 5 output tokens per call.
#[derive(Debug, Default)]
struct WrongThenRight {
    calls: AtomicUsize,
}

#[async_trait]
impl Provider for WrongThenRight {
    async fn complete(&self, _call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        let label = if n.is_multiple_of(2) {
            "nonsense"
        } else {
            "spam"
        };
        Ok(ProviderAnswer {
            output: json!({"label": label, "confidence": null}),
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            billed_before: false,
        })
    }
}

fn config(content_for_acme: bool) -> EngineConfig {
    let mut config = fast_config();
    config.workers.max_output_retries = 2;
    config.models.insert(
        "flaky".into(),
        ModelConfig {
            provider: "flaky".into(),
            model: "flaky-1".into(),
            prices: Some(ModelPrices {
                input_per_million: 1.0,
                output_per_million: 2.0,
                cached_input_per_million: None,
                cache_write_input_per_million: None,
            }),
            max_output_tokens: Some(100),
            ..ModelConfig::default()
        },
    );
    config.apps.insert(
        "acme".into(),
        AppConfig {
            trace_content: content_for_acme,
            ..AppConfig::default()
        },
    );
    config
}

/// An engine recording into an in-memory exporter (spans exported as they end).
async fn traced_engine(
    db: &TestDb,
    config: EngineConfig,
) -> (tollgate_engine::Tollgate, InMemorySpanExporter) {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let tracer = BoxedTracer::new(Box::new(provider.tracer("tollgate")));
    let engine = tollgate_engine::Tollgate::builder(db.store().await, config)
        .provider("flaky", Arc::new(WrongThenRight::default()))
        .tracer(Some(tracer))
        .build()
        .unwrap();
    (engine, exporter)
}

async fn run_one(engine: &tollgate_engine::Tollgate, key: &str) -> tollgate_core::Task {
    let handle = engine.start().await.unwrap();
    let task = engine
        .submit(classify(key, SECRET).with_model(ModelId::new("flaky").unwrap()))
        .await
        .unwrap()
        .task;
    let done = finished(engine, task.id).await;
    handle.shutdown(std::time::Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    done
}

/// The task's spans, once its `settle` span ended.
async fn spans_of(exporter: &InMemorySpanExporter, trace: [u8; 16]) -> Vec<SpanData> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let spans: Vec<SpanData> = exporter
            .get_finished_spans()
            .unwrap()
            .into_iter()
            .filter(|s| s.span_context.trace_id().to_bytes() == trace)
            .collect();
        if spans.iter().any(|s| s.name == "settle") {
            return spans;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no settle span: {spans:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

fn all_named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

fn one<'a>(spans: &'a [SpanData], name: &str) -> &'a SpanData {
    let found = all_named(spans, name);
    assert_eq!(found.len(), 1, "one `{name}`: {spans:#?}");
    found[0]
}

fn value<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv: &&KeyValue| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn parent_is(child: &SpanData, parent: &SpanData) {
    assert_eq!(
        child.parent_span_id,
        parent.span_context.span_id(),
        "`{}` under `{}`",
        child.name,
        parent.name
    );
}

async fn a_reasked_task_is_one_trace_of_submit_queue_calls_validations_and_settle(db: TestDb) {
    let (engine, exporter) = traced_engine(&db, config(false)).await;
    let done = run_one(&engine, "reasked").await;
    let position = done
        .trace_parent
        .expect("the task stores its trace position");
    let spans = spans_of(&exporter, position.trace_id).await;
    let submit = one(&spans, "submit");
    assert_eq!(
        submit.parent_span_id,
        SpanId::INVALID,
        "a new trace: no caller"
    );
    assert_eq!(
        submit.span_context.span_id().to_bytes(),
        position.parent_id,
        "the worker continues from `submit`"
    );
    let admission = one(&spans, "admission");
    parent_is(admission, submit);
    assert_eq!(
        value(admission, "tollgate.admission.decision"),
        Some(&Value::from("created"))
    );
    assert!(value(admission, "tollgate.reservation.usd").is_some());
    let queue = one(&spans, "queue");
    parent_is(queue, submit);
    let execute = one(&spans, "execute");
    parent_is(execute, submit);
    assert!(queue.end_time <= execute.end_time);
    let calls = all_named(&spans, "chat flaky-1");
    assert_eq!(calls.len(), 2, "the first call and its re-ask");
    let mut attempts: Vec<i64> = Vec::new();
    for call in &calls {
        parent_is(call, execute);
        assert_eq!(value(call, "gen_ai.system"), Some(&Value::from("flaky")));
        assert_eq!(
            value(call, "gen_ai.request.model"),
            Some(&Value::from("flaky-1"))
        );
        assert_eq!(
            value(call, "gen_ai.usage.input_tokens"),
            Some(&Value::I64(10))
        );
        assert_eq!(
            value(call, "gen_ai.usage.output_tokens"),
            Some(&Value::I64(5))
        );
        match value(call, "tollgate.cost_usd") {
            Some(Value::F64(cost)) => assert!((cost - 0.00002).abs() < 1e-12, "{cost}"),
            other => panic!("a priced call carries its cost: {other:?}"),
        }
        match value(call, "tollgate.attempt") {
            Some(Value::I64(a)) => attempts.push(*a),
            other => panic!("the call's number: {other:?}"),
        }
    }
    attempts.sort_unstable();
    assert_eq!(attempts, vec![0, 1]);
    let mut validity: Vec<bool> = all_named(&spans, "validate")
        .iter()
        .map(|v| {
            parent_is(v, execute);
            match value(v, "tollgate.output.valid") {
                Some(Value::Bool(b)) => *b,
                other => panic!("validity: {other:?}"),
            }
        })
        .collect();
    validity.sort_unstable();
    assert_eq!(validity, vec![false, true], "refused, then accepted");
    let settle = one(&spans, "settle");
    parent_is(settle, execute);
    assert_eq!(
        value(settle, "tollgate.outcome"),
        Some(&Value::from("succeeded"))
    );
    assert!(!matches!(settle.status, Status::Error { .. }));
    let text = format!("{spans:?}");
    assert!(!text.contains(SECRET), "no prompt text by default");
    assert!(!text.contains("gen_ai.input.messages"));
    assert!(!text.contains("gen_ai.output.messages"));
}

async fn content_goes_into_spans_only_for_apps_that_allow_it(db: TestDb) {
    let (engine, exporter) = traced_engine(&db, config(true)).await;
    let done = run_one(&engine, "content").await;
    let spans = spans_of(&exporter, done.trace_parent.unwrap().trace_id).await;
    for call in all_named(&spans, "chat flaky-1") {
        let input = value(call, "gen_ai.input.messages")
            .expect("the prompt")
            .as_str();
        assert!(input.contains(SECRET), "{input}");
        let output = value(call, "gen_ai.output.messages")
            .expect("the output")
            .as_str();
        assert!(output.contains("label"), "{output}");
    }
}

async fn without_a_tracer_tasks_carry_no_trace(db: TestDb) {
    let engine = tollgate_engine::Tollgate::builder(db.store().await, config(true))
        .provider("flaky", Arc::new(WrongThenRight::default()))
        .build()
        .unwrap();
    assert!(!engine.traces().enabled());
    let done = run_one(&engine, "untraced").await;
    assert_eq!(done.trace_parent, None);
}

async fn a_pipeline_step_is_the_parent_of_its_task(db: TestDb) {
    let mut config = config(false);
    config.pipelines.concurrency = 2;
    config.pipelines.poll_interval = std::time::Duration::from_millis(100);
    let (engine, exporter) = traced_engine(&db, config).await;
    let handle = engine.start().await.unwrap();
    let name = PipelineName::new("two-steps").unwrap();
    let definition = json!({
        "steps": [
            {"key": "first", "kind": "generate_text", "request": {"prompt": "one"}},
            {"key": "second", "kind": "generate_text", "depends_on": ["first"],
             "request": {"prompt": {"$template": "two: {/steps/first/output/text}"}}}
        ],
        "output": {"text": "/steps/second/output/text"}
    });
    engine
        .register_pipeline(&app(), &name, &definition)
        .await
        .unwrap();
    let run = engine
        .start_pipeline_run(&app(), None, &name, None, scope(), json!({}))
        .await
        .unwrap()
        .unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let done = loop {
        let now = engine.get_run(&app(), run.id).await.unwrap().unwrap();
        if now.state.is_terminal() {
            break now;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never ended"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    handle.shutdown(std::time::Duration::from_secs(5)).await;
    let spans = exporter.get_finished_spans().unwrap();
    let steps: Vec<&SpanData> = all_named(&spans, "pipeline step");
    let mut keys: Vec<String> = steps
        .iter()
        .map(|s| {
            value(s, "tollgate.step")
                .expect("the step")
                .as_str()
                .into_owned()
        })
        .collect();
    keys.sort();
    assert_eq!(keys, vec!["first", "second"]);
    for step in steps {
        assert_eq!(
            value(step, "tollgate.run.id"),
            Some(&Value::from(run.id.to_string()))
        );
        let trace = step.span_context.trace_id();
        let submit = spans
            .iter()
            .find(|s| s.name == "submit" && s.span_context.trace_id() == trace)
            .expect("the step's task is submitted in the step's trace");
        parent_is(submit, step);
        assert!(
            spans
                .iter()
                .any(|s| s.name == "settle" && s.span_context.trace_id() == trace),
            "the step's task runs and settles in the same trace"
        );
    }
}

/// docs/telemetry.md, "Runs": a run created with traces on stores its `run` span, and
/// every task submitted for it (by any caller, later) is a child of that span: one trace
/// for the run's tasks.
async fn a_runs_tasks_are_children_of_the_run_span(db: TestDb) {
    let (engine, exporter) = traced_engine(&db, config(false)).await;
    let handle = engine.start().await.unwrap();
    let run = engine
        .create_run(NewRun {
            trace_parent: None,
            app: app(),
            scope: scope(),
            subject: None,
            input: json!({}),
        })
        .await
        .unwrap();
    let position = run.trace_parent.expect("the run keeps its span's position");
    assert_eq!(
        engine
            .get_run(&app(), run.id)
            .await
            .unwrap()
            .unwrap()
            .trace_parent,
        Some(position)
    );
    let mut tasks = Vec::new();
    for k in ["run-a", "run-b"] {
        let task = engine
            .submit(
                Submission::for_run(
                    app(),
                    run.id,
                    key(k),
                    TaskKind::Classify,
                    json!({"input": k, "labels": ["spam", "ham"]}),
                )
                .with_model(ModelId::new("flaky").unwrap()),
            )
            .await
            .unwrap()
            .task;
        tasks.push(finished(&engine, task.id).await);
    }
    // An application task outside any run starts its own trace.
    let alone = engine
        .submit(classify("alone", SECRET).with_model(ModelId::new("flaky").unwrap()))
        .await
        .unwrap()
        .task;
    let alone = finished(&engine, alone.id).await;
    handle.shutdown(std::time::Duration::from_secs(5)).await;
    let spans = spans_of(&exporter, position.trace_id).await;
    let run_span = one(&spans, "run");
    assert_eq!(
        run_span.span_context.span_id().to_bytes(),
        position.parent_id
    );
    assert_eq!(
        value(run_span, "tollgate.run.id"),
        Some(&Value::from(run.id.to_string()))
    );
    let submits = all_named(&spans, "submit");
    assert_eq!(
        submits.len(),
        2,
        "both tasks in the run's trace: {spans:#?}"
    );
    for submit in submits {
        parent_is(submit, run_span);
    }
    for task in &tasks {
        assert_eq!(task.status, TaskStatus::Succeeded);
        assert_eq!(
            task.trace_parent.map(|t| t.trace_id),
            Some(position.trace_id),
            "the task continues the run's trace"
        );
    }
    assert!(alone.trace_parent.is_some());
    assert_ne!(
        alone.trace_parent.map(|t| t.trace_id),
        Some(position.trace_id)
    );
}
