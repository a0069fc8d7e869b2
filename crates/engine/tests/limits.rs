//! The output size limit and CPU-heavy work (issue 11, item 1), on both backends: a
//! request whose smallest valid output cannot fit is refused at submit; an output over
//! the limit fails its task with `output_too_large`, whatever the provider; a large
//! `dev` output is built quickly and off the runtime, so other tasks go on; a canceled
//! task's generation stops.

mod common;

use async_trait::async_trait;
use common::*;
use serde_json::{Map, Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::{ErrorCode, ModelId, TaskId, TaskKind, TaskStatus};
use tollgate_engine::config::ModelConfig;
use tollgate_engine::{
    EngineConfig, EngineError, Provider, ProviderAnswer, ProviderCall, ProviderError, Submission,
    Tollgate,
};

on_both_backends!(
    requests_whose_smallest_output_cannot_fit_are_refused_at_submit,
    a_large_output_under_the_limit_does_not_hold_up_other_tasks,
    outputs_over_the_limit_fail_with_output_too_large,
    canceling_a_task_stops_its_generation,
);

fn extract(effect_key: &str, schema: Value) -> Submission {
    Submission::application(
        app(),
        scope(),
        key(effect_key),
        TaskKind::ExtractData,
        json!({"input": "x", "schema": schema}),
    )
}

async fn refused(engine: &Tollgate, effect_key: &str, schema: Value) -> String {
    let err = engine
        .submit(extract(effect_key, schema.clone()))
        .await
        .expect_err("refused at submit");
    assert_eq!(
        err.code(),
        Some(ErrorCode::InvalidRequest),
        "{schema}: {err}"
    );
    assert!(
        engine
            .get_by_effect_key(&app(), &key(effect_key))
            .await
            .unwrap()
            .is_none(),
        "a refusal writes nothing"
    );
    err.to_string()
}

async fn requests_whose_smallest_output_cannot_fit_are_refused_at_submit(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let message = refused(
        &engine,
        "string",
        json!({"type": "string", "minLength": 2_000_000_000u64}),
    )
    .await;
    assert!(message.contains("minLength"), "{message}");
    assert!(message.contains("max_output_bytes"), "{message}");
    let message = refused(
        &engine,
        "array",
        json!({"type": "array", "minItems": 100_000_000}),
    )
    .await;
    assert!(message.contains("minItems"), "{message}");
    // Each number alone is harmless; arrays of arrays multiply.
    let message = refused(
        &engine,
        "nested",
        json!({"type": "object", "required": ["rows"], "properties": {"rows": {
            "type": "array", "minItems": 2000,
            "items": {"type": "array", "minItems": 2000, "items": {"type": "integer"}}}}}),
    )
    .await;
    assert!(
        message.contains("`minItems` 2000 at /properties/rows × `minItems` 2000"),
        "{message}"
    );
    // The limit is configuration: the same request fits a larger one.
    let mut config = fast_config();
    config.max_output_bytes = 16 << 20;
    let larger = db.engine(config).await;
    larger
        .submit(extract(
            "nested-fits",
            json!({"type": "array", "minItems": 2000,
                   "items": {"type": "array", "minItems": 2000, "items": {"type": "integer"}}}),
        ))
        .await
        .unwrap();
    // Every kind: a classify_many whose results cannot fit a small limit.
    let mut config = fast_config();
    config.max_output_bytes = 200;
    let small = db.engine(config).await;
    let items: Vec<Value> = (0..20)
        .map(|i| json!({"id": format!("item-{i}"), "input": "x"}))
        .collect();
    let err = small
        .submit(Submission::application(
            app(),
            scope(),
            key("many"),
            TaskKind::ClassifyMany,
            json!({"items": items, "labels": ["a", "b"]}),
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, EngineError::Invalid(e) if e.to_string().contains("request.items")),
        "{err}"
    );
}

/// Waits (bounded by `limit`) for the task to be terminal.
async fn finished_within(engine: &Tollgate, id: TaskId, limit: Duration) -> tollgate_core::Task {
    let task = engine
        .wait(&app(), id, limit)
        .await
        .unwrap()
        .expect("task exists");
    assert!(
        task.status.is_terminal(),
        "task {id} still {:?} after {limit:?}",
        task.status
    );
    task
}

async fn a_large_output_under_the_limit_does_not_hold_up_other_tasks(db: TestDb) {
    let engine = db.engine(fast_config()).await;
    let handle = engine.start().await.unwrap();
    // 1,000,002 bytes of output, just under the 1 MiB default (quadratic padding took
    // minutes for this; it pinned a runtime thread meanwhile).
    let big = submit_all(
        &engine,
        (0..2).map(|i| {
            extract(
                &format!("big-{i}"),
                json!({"type": "string", "minLength": 1_000_000}),
            )
        }),
    )
    .await;
    let small: Vec<TaskId> = submit_all(
        &engine,
        (0..6).map(|i| classify(&format!("small-{i}"), "hello")),
    )
    .await;
    let started = Instant::now();
    for id in &small {
        let task = finished_within(&engine, *id, Duration::from_secs(30)).await;
        assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
    }
    for id in &big {
        let task = finished_within(&engine, *id, Duration::from_secs(30)).await;
        assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
        assert_eq!(task.output.unwrap().as_str().map(str::len), Some(1_000_000));
    }
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    handle.shutdown(Duration::from_secs(5)).await;
}

async fn submit_all(engine: &Tollgate, subs: impl Iterator<Item = Submission>) -> Vec<TaskId> {
    let mut ids = Vec::new();
    for s in subs {
        ids.push(engine.submit(s).await.unwrap().task.id);
    }
    ids
}

/// A provider that answers every call with a text of `bytes` bytes.
#[derive(Debug)]
struct Verbose {
    bytes: usize,
}

#[async_trait]
impl Provider for Verbose {
    async fn complete(&self, _call: ProviderCall<'_>) -> Result<ProviderAnswer, ProviderError> {
        Ok(ProviderAnswer {
            output: json!({"text": "y".repeat(self.bytes)}),
            usage: Default::default(),
            billed_before: false,
        })
    }
}

fn with_model(mut config: EngineConfig, id: &str, provider: &str, params: Value) -> EngineConfig {
    let params: Map<String, Value> = params.as_object().cloned().unwrap_or_default();
    config.models.insert(
        id.into(),
        ModelConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            provider: provider.into(),
            model: format!("{id}-model"),
            params,
            prices: None,
            max_output_tokens: None,
            ..ModelConfig::default()
        },
    );
    config
}

async fn outputs_over_the_limit_fail_with_output_too_large(db: TestDb) {
    let mut config = with_model(fast_config(), "verbose", "verbose", json!({}));
    config.max_output_bytes = 10_000;
    let engine = Tollgate::builder(db.store().await, config)
        .provider("verbose", Arc::new(Verbose { bytes: 20_000 }))
        .build()
        .unwrap();
    let handle = engine.start().await.unwrap();
    // Any provider: the worker measures every output before it is stored.
    let text = engine
        .submit(
            Submission::application(
                app(),
                scope(),
                key("verbose"),
                TaskKind::GenerateText,
                json!({"prompt": "say a lot"}),
            )
            .with_model(ModelId::new("verbose").unwrap()),
        )
        .await
        .unwrap();
    // The dev provider: a schema whose floor is small (no `type`, so `0` would do) but
    // whose dev instance is not; the builder stops at the limit.
    let dev = engine
        .submit(extract("dev-big", json!({"minLength": 2_000_000_000u64})))
        .await
        .unwrap();
    for id in [text.task.id, dev.task.id] {
        let task = finished(&engine, id).await;
        assert_eq!(task.status, TaskStatus::Failed, "{task:?}");
        let error = task.error.unwrap();
        assert_eq!(error.code, ErrorCode::OutputTooLarge, "{error:?}");
        assert!(error.message.contains("10000 bytes"), "{error:?}");
        assert!(task.output.is_none());
    }
    handle.shutdown(Duration::from_secs(5)).await;
}

/// Four options per level, each the whole schema again: the validator cuts a reference
/// back to itself at the same place of the value (so the submit-time cost rule accepts
/// it), but the dev builder, which follows `$ref`s sixteen levels deep, works through
/// 4^16 dead ends (until its time limit, minutes away) unless stopped.
fn endless_schema() -> Value {
    json!({"anyOf": [{"$ref": "#"}, {"$ref": "#"}, {"$ref": "#"}, {"$ref": "#"}]})
}

async fn canceling_a_task_stops_its_generation(db: TestDb) {
    // As many endless generations as CPU jobs may run at once: until they stop, no other
    // CPU job can start.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut config = with_model(
        fast_config(),
        "endless",
        "dev",
        json!({"time_limit_ms": 120_000}),
    );
    config.workers.concurrency = cores as u32 + 2;
    let engine = db.engine(config).await;
    let handle = engine.start().await.unwrap();
    let endless = ModelId::new("endless").unwrap();
    let mut ids = Vec::new();
    for i in 0..cores {
        let s = extract(&format!("endless-{i}"), endless_schema()).with_model(endless.clone());
        ids.push(engine.submit(s).await.unwrap().task.id);
    }
    for id in &ids {
        until_status(&engine, *id, TaskStatus::Running).await;
    }
    // Give the generations time to take every CPU slot.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for id in &ids {
        let task = engine.cancel(&app(), *id).await.unwrap().unwrap();
        assert_eq!(task.status, TaskStatus::Canceled);
    }
    // A small extraction needs a CPU slot: it gets one only if the canceled generations
    // stopped (their time limit is two minutes away).
    let started = Instant::now();
    let small = engine
        .submit(extract(
            "after-cancel",
            json!({"type": "object", "required": ["a"], "properties": {"a": {"type": "string"}}}),
        ))
        .await
        .unwrap();
    let task = finished_within(&engine, small.task.id, Duration::from_secs(30)).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{task:?}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let report = handle.shutdown(Duration::from_secs(5)).await;
    assert!(report.drained, "{report:?}");
}
