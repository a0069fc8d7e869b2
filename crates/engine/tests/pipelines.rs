//! Pipelines end to end on both backends: the invoice example, crashes between and during
//! steps, cancellation, fan-out and join, step retries and admission waits. An in-process
//! scripted provider counts the calls of every step (started, answered, dropped by a
//! crash or a cancel) and can hold a step's calls in flight.

mod common;

use async_trait::async_trait;
use common::*;
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate_core::{
    ErrorCode, PipelineName, Run, RunState, SourceId, SourceRevision, TaskKind, TaskRequest,
    TaskStatus, Usage,
};
use tollgate_engine::config::{BudgetPolicy, Limit, ModelConfig};
use tollgate_engine::{
    EngineConfig, EngineError, PipelineProgress, PipelineStart, Provider, ProviderAnswer,
    ProviderCall, ProviderError, StepStatus, Submission, Tollgate,
};

on_both_backends!(
    the_invoice_pipeline_runs_end_to_end,
    a_driver_killed_between_steps_repeats_no_step,
    an_engine_killed_during_a_step_finishes_the_run_after_restart,
    canceling_a_run_mid_run_cancels_its_in_flight_task,
    a_fan_out_runs_in_parallel_and_joins,
    a_failing_step_is_retried_a_bounded_number_of_times,
    an_admission_rejection_waits_and_retries,
    a_token_rate_refusal_waits_and_retries,
    an_api_only_engine_drives_runs_only_when_configured,
);

// ---------------------------------------------------------------------------------------
// The scripted provider.

#[derive(Debug, Default)]
struct Calls {
    started: HashMap<String, u32>,
    answered: HashMap<String, u32>,
    dropped: HashMap<String, u32>,
    in_flight: HashMap<String, u32>,
    /// Most calls of tags starting with `part-` in flight at once.
    max_parts_in_flight: u32,
    held: HashSet<String>,
    failures_left: HashMap<String, u32>,
}

/// Answers every kind deterministically; the tag of a call names its step (`extract`,
/// `category`, or the text of a `generate_text` prompt before its first `:`).
#[derive(Debug, Default)]
struct Scripted {
    calls: Mutex<Calls>,
    changed: Notify,
}

fn tag_of(request: &TaskRequest) -> String {
    match request {
        TaskRequest::ExtractData(_) => "extract".into(),
        TaskRequest::Classify(_) => "category".into(),
        TaskRequest::ClassifyMany(_) => "classify_many".into(),
        TaskRequest::Chat(_) => "chat".into(),
        TaskRequest::Embed(_) => "embed".into(),
        TaskRequest::GenerateText(r) => r
            .prompt
            .as_deref()
            .unwrap_or_default()
            .split(':')
            .next()
            .unwrap_or_default()
            .to_string(),
    }
}

/// Counts a call in flight; dropped before `done`, the caller abandoned it.
struct InFlight<'a> {
    provider: &'a Scripted,
    tag: String,
    done: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut calls = self.provider.calls.lock().unwrap();
        *calls.in_flight.entry(self.tag.clone()).or_default() -= 1;
        let counter = if self.done {
            &mut calls.answered
        } else {
            &mut calls.dropped
        };
        *counter.entry(self.tag.clone()).or_default() += 1;
        drop(calls);
        self.provider.changed.notify_waiters();
    }
}

#[async_trait]
impl Provider for Scripted {
    async fn complete(&self, call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        let tag = tag_of(call.request);
        {
            let mut calls = self.calls.lock().unwrap();
            *calls.started.entry(tag.clone()).or_default() += 1;
            *calls.in_flight.entry(tag.clone()).or_default() += 1;
            let parts: u32 = calls
                .in_flight
                .iter()
                .filter(|(t, _)| t.starts_with("part-"))
                .map(|(_, n)| *n)
                .sum();
            calls.max_parts_in_flight = calls.max_parts_in_flight.max(parts);
        }
        self.changed.notify_waiters();
        let mut guard = InFlight {
            provider: self,
            tag: tag.clone(),
            done: false,
        };
        loop {
            let notified = self.changed.notified();
            if !self.calls.lock().unwrap().held.contains(&tag) {
                break;
            }
            let _ = tokio::time::timeout(Duration::from_millis(20), notified).await;
        }
        let fail = {
            let mut calls = self.calls.lock().unwrap();
            match calls.failures_left.get_mut(&tag) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    true
                }
                _ => false,
            }
        };
        guard.done = true;
        drop(guard);
        if fail {
            return Err(ProviderError::Failed(format!("scripted failure of {tag}")));
        }
        let output = match call.request {
            TaskRequest::ExtractData(r) => {
                let vendor = r
                    .input
                    .as_deref()
                    .unwrap_or_default()
                    .split("from ")
                    .nth(1)
                    .and_then(|s| s.split(',').next())
                    .unwrap_or("unknown")
                    .to_string();
                json!({"vendor": vendor, "total": 1234.5, "currency": "EUR"})
            }
            TaskRequest::Classify(r) => {
                let label = if r.input.contains("Cloud") {
                    "software"
                } else {
                    "other"
                };
                json!({"label": label, "confidence": 0.9})
            }
            TaskRequest::ClassifyMany(_) => json!({"results": []}),
            TaskRequest::Chat(_) => json!({"content": "<chat>", "finish_reason": "stop"}),
            TaskRequest::Embed(_) => json!({"embeddings": [], "dimensions": 1}),
            TaskRequest::GenerateText(r) => {
                json!({"text": format!("<{}>", r.prompt.as_deref().unwrap_or_default())})
            }
        };
        Ok(ProviderAnswer {
            output,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                cost_usd: None,
                cached_input_tokens: None,
                cache_write_input_tokens: None,
                estimated: false,
                cost_nano_usd: None,
            },
            billed_before: false,
        })
    }
}

impl Scripted {
    fn hold(&self, tag: &str) {
        self.calls.lock().unwrap().held.insert(tag.into());
    }

    fn release(&self, tag: &str) {
        self.calls.lock().unwrap().held.remove(tag);
        self.changed.notify_waiters();
    }

    fn fail_next(&self, tag: &str, n: u32) {
        self.calls
            .lock()
            .unwrap()
            .failures_left
            .insert(tag.into(), n);
    }

    fn started(&self, tag: &str) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .started
            .get(tag)
            .copied()
            .unwrap_or(0)
    }

    fn answered(&self, tag: &str) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .answered
            .get(tag)
            .copied()
            .unwrap_or(0)
    }

    fn dropped(&self, tag: &str) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .dropped
            .get(tag)
            .copied()
            .unwrap_or(0)
    }

    fn in_flight(&self, tag: &str) -> u32 {
        self.calls
            .lock()
            .unwrap()
            .in_flight
            .get(tag)
            .copied()
            .unwrap_or(0)
    }

    /// Waits (bounded) until `n` calls of `tag` are in flight.
    async fn until_in_flight(&self, tag: &str, n: u32) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let notified = self.changed.notified();
            if self.in_flight(tag) >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{n} call(s) of {tag} never in flight (calls: {:?})",
                self.calls.lock().unwrap()
            );
            let _ = tokio::time::timeout(Duration::from_millis(20), notified).await;
        }
    }
}

// ---------------------------------------------------------------------------------------
// Set-up.

/// Fast intervals, the `default` model served by the scripted provider, a one-second
/// driver lease (a dead driver's run is taken over quickly).
fn pipeline_config() -> EngineConfig {
    let mut c = fast_config();
    c.models.insert(
        "default".into(),
        ModelConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            provider: "scripted".into(),
            model: "scripted-model".into(),
            params: Default::default(),
            prices: None,
            max_output_tokens: None,
            ..ModelConfig::default()
        },
    );
    c.pipelines.concurrency = 4;
    c.pipelines.lease = Duration::from_secs(1);
    c.pipelines.poll_interval = Duration::from_millis(100);
    c.pipelines.admission_default_delay = Duration::from_millis(200);
    c.pipelines.error_delay = Duration::from_millis(100);
    c
}

async fn engine(db: &TestDb, config: EngineConfig, provider: &Arc<Scripted>) -> Tollgate {
    Tollgate::builder(db.store().await, config)
        .provider("scripted", provider.clone())
        .build()
        .expect("valid engine configuration")
}

fn invoice_definition() -> Value {
    json!({
        "description": "invoice intake: extract fields, classify the vendor, summarize",
        "steps": [
            {"key": "extract", "kind": "extract_data",
             "request": {
                 "input": {"$from": "/input/text"},
                 "schema": {"type": "object", "required": ["vendor", "total", "currency"],
                            "properties": {"vendor": {"type": "string"},
                                           "total": {"type": "number"},
                                           "currency": {"type": "string"}}}},
             "source": {"id": {"$from": "/input/invoice_id"}, "revision": "v1"}},
            {"key": "category", "kind": "classify", "depends_on": ["extract"],
             "request": {"input": {"$from": "/steps/extract/output/vendor"},
                         "labels": ["software", "travel", "office", "other"]}},
            {"key": "summary", "kind": "generate_text", "depends_on": ["extract", "category"],
             "retries": 2,
             "request": {"prompt": {"$template": "summary: {/steps/extract/output/vendor} ({/steps/category/output/label}) billed {/steps/extract/output/total} {/steps/extract/output/currency}"}}}
        ],
        "output": {
            "vendor": "/steps/extract/output/vendor",
            "total": "/steps/extract/output/total",
            "category": "/steps/category/output/label",
            "summary": "/steps/summary/output/text"
        }
    })
}

fn invoice_input(id: &str) -> Value {
    json!({"invoice_id": id, "text": "Invoice INV-7 from ACME Cloud, 1,234.50 EUR, due 2026-01-31"})
}

fn name(n: &str) -> PipelineName {
    PipelineName::new(n).unwrap()
}

async fn register(engine: &Tollgate, pipeline: &str, definition: &Value) -> String {
    let (stored, _) = engine
        .register_pipeline(&app(), &name(pipeline), definition)
        .await
        .expect("a valid definition");
    stored.version
}

async fn start(engine: &Tollgate, pipeline: &str, input: Value) -> Run {
    engine
        .start_pipeline_run(&app(), None, &name(pipeline), None, scope(), input)
        .await
        .expect("start")
        .expect("registered pipeline")
}

/// Waits (bounded) until the run is terminal.
async fn run_finished(engine: &Tollgate, run: &Run) -> Run {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = engine.get_run(&app(), run.id).await.unwrap().expect("run");
        if now.state.is_terminal() {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "run {} still {:?} after 30 s: {:?}",
            run.id,
            now.state,
            engine.pipeline_run(&now).await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn info(engine: &Tollgate, run: &Run) -> PipelineProgress {
    let run = engine.get_run(&app(), run.id).await.unwrap().expect("run");
    engine
        .pipeline_run(&run)
        .await
        .unwrap()
        .expect("a pipeline run")
}

fn step<'a>(info: &'a PipelineProgress, key: &str) -> &'a tollgate_engine::PipelineStep {
    info.steps
        .iter()
        .find(|s| s.key.as_str() == key)
        .unwrap_or_else(|| panic!("no step {key} in {info:?}"))
}

/// Waits (bounded) until the step has the status.
async fn until_step(engine: &Tollgate, run: &Run, key: &str, status: StepStatus) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = info(engine, run).await;
        if step(&info, key).status == status {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "step {key} never {status:?}: {info:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn invoice_output() -> Value {
    json!({
        "vendor": "ACME Cloud",
        "total": 1234.5,
        "category": "software",
        "summary": "<summary: ACME Cloud (software) billed 1234.5 EUR>"
    })
}

/// A config whose engine runs no tasks (the driver only).
fn driver_only() -> EngineConfig {
    let mut c = pipeline_config();
    c.workers.concurrency = 0;
    c.pipelines.drive_without_workers = true;
    c
}

/// A config whose engine drives no runs (workers only).
fn workers_only() -> EngineConfig {
    let mut c = pipeline_config();
    c.pipelines.concurrency = 0;
    c
}

// ---------------------------------------------------------------------------------------
// Tests.

async fn the_invoice_pipeline_runs_end_to_end(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let engine = engine(&db, pipeline_config(), &provider).await;

    // Registering is idempotent by content: the same definition is the same version.
    let (first, created) = engine
        .register_pipeline(&app(), &name("invoice"), &invoice_definition())
        .await
        .unwrap();
    assert!(created);
    assert_eq!(first.version.len(), 64);
    let (again, created) = engine
        .register_pipeline(&app(), &name("invoice"), &invoice_definition())
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(again.version, first.version);
    let latest = engine
        .get_pipeline(&app(), &name("invoice"), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(latest.version, first.version);

    // An input missing what a step reads is refused before anything runs.
    let refused = engine
        .start_pipeline_run(
            &app(),
            None,
            &name("invoice"),
            None,
            scope(),
            json!({"text": "no id"}),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, EngineError::Invalid(e) if e.to_string().contains("/input/invoice_id")),
        "{refused}"
    );
    // Unknown pipelines and versions are `None`.
    assert!(
        engine
            .start_pipeline_run(&app(), None, &name("nope"), None, scope(), json!({}))
            .await
            .unwrap()
            .is_none()
    );

    let handle = engine.start().await.unwrap();
    let run = start(&engine, "invoice", invoice_input("inv-7")).await;
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    assert_eq!(done.output, Some(invoice_output()));

    let info = info(&engine, &run).await;
    assert_eq!(info.version, first.version);
    let keys: Vec<&str> = info.steps.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["extract", "category", "summary"]);
    for s in &info.steps {
        assert_eq!(s.status, StepStatus::Succeeded, "{s:?}");
        assert_eq!(s.attempts, 1);
        assert!(s.output.is_some());
        let task = engine
            .get(&app(), s.task_id.unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            task.effect_key.as_str(),
            format!("run:{}:{}", run.id, s.key)
        );
    }
    assert_eq!(
        step(&info, "category").output,
        Some(json!({"label": "software", "confidence": 0.9}))
    );
    // The bound step is scoped: admission and the cache apply to it.
    let extract = engine
        .get(&app(), step(&info, "extract").task_id.unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        extract.source.as_ref().map(|s| s.id.as_str().to_string()),
        Some("inv-7".to_string())
    );
    for tag in ["extract", "category", "summary"] {
        assert_eq!(provider.started(tag), 1, "{tag}");
    }

    // A second run of the same invoice is served from the cache for the bound step.
    let second = start(&engine, "invoice", invoice_input("inv-7")).await;
    let done = run_finished(&engine, &second).await;
    assert_eq!(done.output, Some(invoice_output()));
    assert_eq!(
        provider.started("extract"),
        1,
        "the cache served the extraction"
    );

    // Under a start key a run starts once: a retried start answers the same run.
    let start = |key: &str| PipelineStart {
        app: app(),
        subject: None,
        name: name("invoice"),
        version: None,
        scope: scope(),
        input: invoice_input("inv-70"),
        start_key: Some(tollgate_core::EffectKey::new(key).unwrap()),
    };
    let first = engine
        .start_pipeline(start("start-1"))
        .await
        .unwrap()
        .unwrap();
    assert!(first.created);
    let again = engine
        .start_pipeline(start("start-1"))
        .await
        .unwrap()
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.run.id, first.run.id);
    let done = run_finished(&engine, &first.run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    assert_eq!(
        provider.started("summary"),
        3,
        "three runs summarized: the retried start ran nothing"
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

/// The driver (in an API + driver replica) dies right after the first step succeeded,
/// and again after the second; the worker replica lives on. Each new driver takes over
/// once the lease ends and the run finishes with every step's provider call made once.
async fn a_driver_killed_between_steps_repeats_no_step(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let workers = engine(&db, workers_only(), &provider).await;
    let _workers = workers.start().await.unwrap();
    register(&workers, "invoice", &invoice_definition()).await;

    let first = engine(&db, driver_only(), &provider).await;
    let first_handle = first.start().await.unwrap();
    let run = start(&first, "invoice", invoice_input("inv-8")).await;
    until_step(&first, &run, "extract", StepStatus::Succeeded).await;
    first_handle.abandon().await;

    let second = engine(&db, driver_only(), &provider).await;
    let second_handle = second.start().await.unwrap();
    until_step(&second, &run, "category", StepStatus::Succeeded).await;
    second_handle.abandon().await;
    // Nobody drives the run now: it cannot finish.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let now = second.get_run(&app(), run.id).await.unwrap().unwrap();
    assert!(!now.state.is_terminal(), "{now:?}");

    let third = engine(&db, driver_only(), &provider).await;
    let third_handle = third.start().await.unwrap();
    let done = run_finished(&third, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    assert_eq!(done.output, Some(invoice_output()));
    for tag in ["extract", "category", "summary"] {
        assert_eq!(provider.started(tag), 1, "{tag} was called again");
        assert_eq!(provider.answered(tag), 1, "{tag}");
    }
    for s in &info(&third, &run).await.steps {
        assert_eq!(s.attempts, 1, "{s:?}");
    }
    third_handle.shutdown(Duration::from_secs(5)).await;
}

/// A whole engine (driver and workers) dies while the second step's provider call is in
/// flight. The call is lost with the process; the new engine's sweeper puts the step's
/// task back in the queue for its next attempt (docs/routes.md, "Attempts": a crash is
/// not the step's failure, and the task has tries left), so the step needs no attempt of
/// its own, and the run finishes. Finished steps are never called again and every step
/// got exactly one answer.
async fn an_engine_killed_during_a_step_finishes_the_run_after_restart(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let first = engine(&db, pipeline_config(), &provider).await;
    register(&first, "invoice", &invoice_definition()).await;
    provider.hold("category");
    let handle = first.start().await.unwrap();
    let run = start(&first, "invoice", invoice_input("inv-9")).await;
    provider.until_in_flight("category", 1).await;
    handle.abandon().await;
    assert_eq!(
        provider.dropped("category"),
        1,
        "the crash dropped the call"
    );
    provider.release("category");

    let second = engine(&db, pipeline_config(), &provider).await;
    let handle = second.start().await.unwrap();
    let done = run_finished(&second, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    assert_eq!(done.output, Some(invoice_output()));
    for tag in ["extract", "category", "summary"] {
        assert_eq!(provider.answered(tag), 1, "{tag} answered more than once");
    }
    assert_eq!(provider.started("extract"), 1);
    assert_eq!(provider.started("summary"), 1);
    assert_eq!(
        provider.started("category"),
        2,
        "the interrupted call, then one more"
    );
    let info = info(&second, &run).await;
    let category = step(&info, "category");
    assert_eq!(
        category.attempts, 1,
        "the task's next attempt served the step"
    );
    assert_eq!(category.status, StepStatus::Succeeded);
    let task = category.task_id.expect("the step's task");
    let outcomes: Vec<_> = second
        .attempts(&app(), task)
        .await
        .unwrap()
        .iter()
        .map(|a| a.outcome)
        .collect();
    assert_eq!(
        outcomes,
        [
            tollgate_core::AttemptOutcome::Interrupted,
            tollgate_core::AttemptOutcome::Succeeded
        ]
    );
    assert_eq!(step(&info, "extract").attempts, 1);
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn canceling_a_run_mid_run_cancels_its_in_flight_task(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let engine = engine(&db, pipeline_config(), &provider).await;
    register(&engine, "invoice", &invoice_definition()).await;
    provider.hold("category");
    let handle = engine.start().await.unwrap();
    let run = start(&engine, "invoice", invoice_input("inv-10")).await;
    provider.until_in_flight("category", 1).await;
    let category_task = step(&info(&engine, &run).await, "category")
        .task_id
        .unwrap();

    let canceled = engine.cancel_run(&app(), run.id).await.unwrap().unwrap();
    assert_eq!(canceled.run.state, RunState::Canceled);
    assert_eq!(canceled.canceled_tasks, vec![category_task]);
    let task = finished(&engine, category_task).await;
    assert_eq!(task.status, TaskStatus::Canceled);
    // The worker stops the provider call.
    let deadline = Instant::now() + Duration::from_secs(10);
    while provider.dropped("category") == 0 {
        assert!(
            Instant::now() < deadline,
            "the provider call was not stopped"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    provider.release("category");

    // Nothing more happens: no retry of the canceled step, no later step.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let now = engine.get_run(&app(), run.id).await.unwrap().unwrap();
    assert_eq!(now.state, RunState::Canceled);
    let info = info(&engine, &run).await;
    assert_eq!(step(&info, "extract").status, StepStatus::Succeeded);
    assert_eq!(step(&info, "category").status, StepStatus::Canceled);
    assert_eq!(step(&info, "category").attempts, 1);
    assert_eq!(step(&info, "summary").status, StepStatus::Pending);
    assert_eq!(provider.started("category"), 1);
    assert_eq!(provider.started("summary"), 0);
    handle.shutdown(Duration::from_secs(5)).await;
}

fn fan_out_definition() -> Value {
    let part = |k: &str| {
        json!({"key": k, "kind": "generate_text", "depends_on": ["plan"],
               "request": {"prompt": {"$template": format!("{k}: write about {{/steps/plan/output/text}}")}}})
    };
    json!({
        "steps": [
            {"key": "plan", "kind": "generate_text",
             "request": {"prompt": {"$template": "plan: {/input/topic}"}}},
            part("part-a"),
            part("part-b"),
            part("part-c"),
            {"key": "join", "kind": "generate_text", "depends_on": ["part-a", "part-b", "part-c"],
             "request": {"prompt": {"$template": "join: {/steps/part-a/output/text} + {/steps/part-b/output/text} + {/steps/part-c/output/text}"}}}
        ],
        "output": {"joined": "/steps/join/output/text", "plan": "/steps/plan/output/text"}
    })
}

async fn a_fan_out_runs_in_parallel_and_joins(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let engine = engine(&db, pipeline_config(), &provider).await;
    register(&engine, "fan-out", &fan_out_definition()).await;
    // The three parts are held until all three are in flight at once.
    for part in ["part-a", "part-b", "part-c"] {
        provider.hold(part);
    }
    let handle = engine.start().await.unwrap();
    let run = start(&engine, "fan-out", json!({"topic": "tollgates"})).await;
    for part in ["part-a", "part-b", "part-c"] {
        provider.until_in_flight(part, 1).await;
    }
    assert_eq!(provider.calls.lock().unwrap().max_parts_in_flight, 3);
    let midway = info(&engine, &run).await;
    assert_eq!(step(&midway, "join").status, StepStatus::Pending);
    assert_eq!(provider.started("join"), 0, "the join waits for every part");
    // They finish in reverse order; the join still sees all three.
    for part in ["part-c", "part-b", "part-a"] {
        provider.release(part);
        until_step(&engine, &run, part, StepStatus::Succeeded).await;
    }
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    let plan = "<plan: tollgates>";
    let part = |k: &str| format!("<{k}: write about {plan}>");
    assert_eq!(
        done.output,
        Some(json!({
            "plan": plan,
            "joined": format!("<join: {} + {} + {}>", part("part-a"), part("part-b"), part("part-c")),
        }))
    );
    for tag in ["plan", "part-a", "part-b", "part-c", "join"] {
        assert_eq!(provider.started(tag), 1, "{tag}");
    }
    handle.shutdown(Duration::from_secs(5)).await;
}

fn flaky_definition(retries: u32) -> Value {
    json!({
        "steps": [
            {"key": "flaky", "kind": "generate_text", "retries": retries,
             "request": {"prompt": {"$template": "flaky: {/input/x}"}}},
            {"key": "after", "kind": "generate_text", "depends_on": ["flaky"],
             "request": {"prompt": {"$template": "after: {/steps/flaky/output/text}"}}}
        ],
        "output": {"text": "/steps/after/output/text"}
    })
}

async fn a_failing_step_is_retried_a_bounded_number_of_times(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let engine = engine(&db, pipeline_config(), &provider).await;
    let handle = engine.start().await.unwrap();

    // Fails twice, then answers: two retries are enough.
    register(&engine, "recovers", &flaky_definition(2)).await;
    provider.fail_next("flaky", 2);
    let run = start(&engine, "recovers", json!({"x": 1})).await;
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    assert_eq!(provider.started("flaky"), 3);
    let info_ok = info(&engine, &run).await;
    assert_eq!(step(&info_ok, "flaky").attempts, 3);
    assert_eq!(step(&info_ok, "flaky").status, StepStatus::Succeeded);

    // Always fails: 1 + 2 attempts, then the run fails with the step's error; the step
    // after it never runs.
    register(&engine, "gives-up", &flaky_definition(2)).await;
    provider.fail_next("flaky", 100);
    let run = start(&engine, "gives-up", json!({"x": 2})).await;
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.code, ErrorCode::ProviderError);
    assert!(
        error
            .message
            .starts_with("step `flaky` failed after 3 attempt(s): "),
        "{}",
        error.message
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(provider.started("flaky"), 6, "no attempt after the last");
    assert_eq!(provider.started("after"), 1, "only the first run's");
    let info_failed = info(&engine, &run).await;
    assert_eq!(step(&info_failed, "flaky").status, StepStatus::Failed);
    assert_eq!(step(&info_failed, "flaky").attempts, 3);
    assert_eq!(step(&info_failed, "after").status, StepStatus::Pending);
    handle.shutdown(Duration::from_secs(5)).await;
}

/// An application task of the same scope holds the scope's only concurrency slot: the
/// run's bound step is refused by admission, waits and tries again, and goes through
/// once the slot is free. With `admission_retry = false` the run fails instead.
async fn an_admission_rejection_waits_and_retries(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let mut config = pipeline_config();
    config.budgets.insert(
        "tight".into(),
        BudgetPolicy {
            weight: Limit::Integer(1),
            scope_concurrent: Limit::Integer(1),
            ..BudgetPolicy::default()
        },
    );
    config.default_budget = "tight".into();
    let engine = engine(&db, config.clone(), &provider).await;
    register(&engine, "invoice", &invoice_definition()).await;
    provider.hold("blocker");
    let handle = engine.start().await.unwrap();
    let blocker = engine
        .submit(
            Submission::application(
                app(),
                scope(),
                key("blocker"),
                TaskKind::GenerateText,
                json!({"prompt": "blocker: holds the scope's slot"}),
            )
            .with_source(
                SourceId::new("other-doc").unwrap(),
                SourceRevision::new("v1").unwrap(),
            ),
        )
        .await
        .unwrap()
        .task;
    provider.until_in_flight("blocker", 1).await;

    let run = start(&engine, "invoice", invoice_input("inv-11")).await;
    // Several admission attempts (every 200 ms) are refused meanwhile; the run waits.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let now = engine.get_run(&app(), run.id).await.unwrap().unwrap();
    assert!(!now.state.is_terminal(), "{now:?}");
    let waiting = info(&engine, &run).await;
    assert_eq!(step(&waiting, "extract").status, StepStatus::Pending);
    assert_eq!(step(&waiting, "extract").task_id, None);
    assert_eq!(provider.started("extract"), 0);

    provider.release("blocker");
    assert_eq!(
        finished(&engine, blocker.id).await.status,
        TaskStatus::Succeeded
    );
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    assert_eq!(done.output, Some(invoice_output()));
    handle.shutdown(Duration::from_secs(5)).await;

    // Without admission retries the rejection fails the run with its code.
    let mut strict = config;
    strict.pipelines.admission_retry = false;
    let engine = self::engine(&db, strict, &provider).await;
    provider.hold("blocker");
    let handle = engine.start().await.unwrap();
    let blocker = engine
        .submit(
            Submission::application(
                app(),
                scope(),
                key("blocker-2"),
                TaskKind::GenerateText,
                json!({"prompt": "blocker: again"}),
            )
            .with_source(
                SourceId::new("other-doc").unwrap(),
                SourceRevision::new("v2").unwrap(),
            ),
        )
        .await
        .unwrap()
        .task;
    provider.until_in_flight("blocker", 1).await;
    let run = start(&engine, "invoice", invoice_input("inv-12")).await;
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Failed);
    assert_eq!(done.error.unwrap().code, ErrorCode::Capacity);
    provider.release("blocker");
    finished(&engine, blocker.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
}

/// docs/conformance.md#cost-reservation through a pipeline: a step goes through the same reservation as any task.
/// An application task reserves all but 5 tokens of the scope's model-token bucket
/// (60,000 tokens, refilled 500 a second); the run's step is refused with a known retry
/// time, waits, and goes through once the bucket has refilled. A step that can never be
/// admitted (no output bound under a token limit) fails the run with its code instead.
async fn a_token_rate_refusal_waits_and_retries(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let mut config = pipeline_config();
    config.budgets.insert(
        "metered".into(),
        BudgetPolicy {
            tokens_per_minute: Some(Limit::Integer(30_000)),
            token_burst: Some(Limit::Integer(60_000)),
            ..BudgetPolicy::default()
        },
    );
    config.default_budget = "metered".into();
    config.workers.max_output_retries = 0;
    let mut bounded = config.clone();
    if let Some(m) = bounded.models.get_mut("default") {
        m.max_output_tokens = Some(100);
    }
    let engine = engine(&db, bounded, &provider).await;
    register(&engine, "invoice", &invoice_definition()).await;
    provider.hold("blocker");
    let handle = engine.start().await.unwrap();
    // Bytes are the bound here (a provider of unknown family): 8 (reply) + 4 ("user") +
    // the prompt + 8 (message overhead) + 10 (output) = prompt + 30 tokens.
    let prompt = format!("blocker: {}", "x".repeat(60_000 - 30 - 5 - 9));
    let blocker = engine
        .submit(
            Submission::application(
                app(),
                scope(),
                key("blocker"),
                TaskKind::GenerateText,
                json!({"prompt": prompt, "max_output_tokens": 10}),
            )
            .with_source(
                SourceId::new("other-doc").unwrap(),
                SourceRevision::new("v1").unwrap(),
            ),
        )
        .await
        .unwrap()
        .task;
    assert_eq!(blocker.reservation.map(|r| r.tokens), Some(60_000 - 5));
    provider.until_in_flight("blocker", 1).await;
    let run = start(&engine, "invoice", invoice_input("inv-21")).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waiting = info(&engine, &run).await;
    assert_eq!(step(&waiting, "extract").status, StepStatus::Pending);
    assert_eq!(step(&waiting, "extract").task_id, None, "refused, waiting");
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    provider.release("blocker");
    finished(&engine, blocker.id).await;
    handle.shutdown(Duration::from_secs(5)).await;

    // No output bound under the token limit: the step can never be admitted.
    let engine = self::engine(&db, config, &provider).await;
    let handle = engine.start().await.unwrap();
    let run = start(&engine, "invoice", invoice_input("inv-22")).await;
    let done = run_finished(&engine, &run).await;
    assert_eq!(done.state, RunState::Failed);
    assert_eq!(done.error.unwrap().code, ErrorCode::OutputBoundRequired);
    handle.shutdown(Duration::from_secs(5)).await;
}

/// An API-only engine (no workers) drives no runs unless
/// `pipelines.drive_without_workers` is set.
async fn an_api_only_engine_drives_runs_only_when_configured(db: TestDb) {
    let provider = Arc::new(Scripted::default());
    let workers = engine(&db, workers_only(), &provider).await;
    let workers_handle = workers.start().await.unwrap();
    register(&workers, "invoice", &invoice_definition()).await;

    let mut api_config = pipeline_config();
    api_config.workers.concurrency = 0;
    let api = engine(&db, api_config, &provider).await;
    let api_handle = api.start().await.unwrap();
    let run = start(&api, "invoice", invoice_input("inv-api")).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let info_now = info(&api, &run).await;
    assert_eq!(
        step(&info_now, "extract").status,
        StepStatus::Pending,
        "nobody drives the run: {info_now:?}"
    );
    api_handle.shutdown(Duration::from_secs(5)).await;

    let driver = engine(&db, driver_only(), &provider).await;
    let driver_handle = driver.start().await.unwrap();
    let done = run_finished(&driver, &run).await;
    assert_eq!(done.state, RunState::Succeeded, "{:?}", done.error);
    driver_handle.shutdown(Duration::from_secs(5)).await;
    workers_handle.shutdown(Duration::from_secs(5)).await;
}
