//! The OpenAI-compatible provider against a scripted fake server on 127.0.0.1: request
//! shape, usage, re-asks on invalid output, retries on 429/5xx/timeouts, and cancellation
//! dropping the HTTP call.

mod common;

use common::*;
use serde_json::{Value, json};
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::{ErrorCode, TaskKind, TaskStatus};
use tollgate_engine::config::ProviderConfig;
use tollgate_engine::{Notifier, Submission, Tollgate};

on_both_backends!(slow_answer_is_dropped_within_one_heartbeat_of_a_cancel);

async fn engine_for(fake: &FakeOpenAi) -> (TestDb, Tollgate) {
    let db = TestDb::sqlite("openai");
    let mut config = fake_config(fake);
    // One attempt per task: these tests count the provider client's own requests
    // (its retries); later attempts are tests/tries.rs's.
    if let Some(model) = config.models.get_mut("default") {
        model.max_attempts = Some(tollgate_core::MaxAttempts::ONE);
    }
    let engine = db.engine(config).await;
    (db, engine)
}

fn spam() -> Reply {
    Reply::Content(r#"{"label": "spam", "confidence": 0.9}"#.into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classify_sends_a_nested_json_schema_and_records_usage() {
    let fake = FakeOpenAi::start().await;
    fake.script([spam()]);
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let id = engine
        .submit(classify("c", "Win a free cruise!"))
        .await
        .unwrap()
        .task
        .id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    assert_eq!(
        task.output,
        Some(json!({"label": "spam", "confidence": 0.9}))
    );
    let usage = task.usage.unwrap();
    assert_eq!((usage.input_tokens, usage.output_tokens), (10, 5));

    let requests = fake.requests();
    assert_eq!(requests.len(), 1);
    let body = &requests[0].1;
    assert_eq!(body["model"], "fake-model");
    let format = &body["response_format"];
    assert_eq!(format["type"], "json_schema");
    assert_eq!(format["json_schema"]["name"], "classify");
    assert_eq!(format["json_schema"]["strict"], true);
    assert_eq!(
        format["json_schema"]["schema"]["properties"]["label"]["enum"],
        json!(["spam", "ham"])
    );
    assert_eq!(input_of(body), "Win a free cruise!");
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_json_is_asked_again_with_the_error() {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Content("{\"label\": \"spam\"".into()), spam()]);
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let id = engine.submit(classify("m", "x")).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    // Both answers' tokens are counted.
    assert_eq!(task.usage.unwrap().input_tokens, 20);
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let last = requests[1].1["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let text = last["content"].as_str().unwrap();
    assert!(text.contains("not valid JSON"), "{text}");
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_label_not_in_the_list_fails_after_bounded_reasks() {
    let fake = FakeOpenAi::start().await;
    fake.respond(|_| Reply::Content(r#"{"label": "eggs", "confidence": null}"#.into()));
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let id = engine.submit(classify("l", "x")).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.unwrap();
    assert_eq!(error.code, ErrorCode::InvalidModelOutput);
    assert!(error.message.contains("eggs"), "{}", error.message);
    assert!(task.output.is_none(), "an invalid output is never stored");
    // One call plus max_output_retries (2) re-asks, each telling the model what was wrong.
    let requests = fake.requests();
    assert_eq!(requests.len(), 3);
    for (_, body) in &requests[1..] {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        assert!(
            last["content"]
                .as_str()
                .unwrap()
                .contains("`eggs` is not one of the labels")
        );
    }
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_item_id_is_asked_again() {
    let fake = FakeOpenAi::start().await;
    fake.script([
        Reply::Content(r#"{"results": [{"id": "a", "label": "spam"}]}"#.into()),
        Reply::Content(
            r#"{"results": [{"id": "b", "label": "ham"}, {"id": "a", "label": "spam"}]}"#.into(),
        ),
    ]);
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let submission = Submission::application(
        app(),
        scope(),
        key("many"),
        TaskKind::ClassifyMany,
        json!({"items": [{"id": "a", "input": "x"}, {"id": "b", "input": "y"}], "labels": ["spam", "ham"]}),
    );
    let id = engine.submit(submission).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    // Normalized to the items' order.
    assert_eq!(
        task.output,
        Some(json!({"results": [{"id": "a", "label": "spam"}, {"id": "b", "label": "ham"}]}))
    );
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let last = requests[1].1["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .contains("missing results"),
        "{last}"
    );
    let schema = &requests[0].1["response_format"]["json_schema"]["schema"];
    assert_eq!(schema["properties"]["results"]["minItems"], 2);
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_429_is_retried_after_its_retry_after() {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Status(429, Some("1")), spam()]);
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let id = engine.submit(classify("rl", "x")).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let gap = requests[1].0 - requests[0].0;
    assert!(
        gap >= Duration::from_millis(950),
        "retried after {gap:?}, Retry-After was 1 s"
    );
    assert!(gap < Duration::from_secs(3), "{gap:?}");
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_beyond_the_limit_fails_at_once() {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Status(429, Some("3600"))]);
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let id = engine
        .submit(classify("rl-long", "x"))
        .await
        .unwrap()
        .task
        .id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.unwrap();
    assert_eq!(error.code, ErrorCode::ProviderError);
    assert!(
        error.message.contains("max_retry_delay"),
        "{}",
        error.message
    );
    assert_eq!(fake.requests().len(), 1);
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_errors_are_retried_then_fail_with_provider_error() {
    let fake = FakeOpenAi::start().await;
    // First task: one 500, then an answer.
    fake.script([Reply::Status(500, None), spam()]);
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let id = engine.submit(classify("e1", "x")).await.unwrap().task.id;
    assert_eq!(finished(&engine, id).await.status, TaskStatus::Succeeded);
    assert_eq!(fake.requests().len(), 2);

    // Second task: the server keeps failing; 1 + max_retries (2) attempts, then the task
    // fails with a clear code.
    fake.respond(|_| Reply::Status(503, None));
    let id = engine.submit(classify("e2", "y")).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.unwrap();
    assert_eq!(error.code, ErrorCode::ProviderError);
    assert!(error.message.contains("503"), "{}", error.message);
    assert!(error.message.contains("3 attempts"), "{}", error.message);
    assert_eq!(fake.requests().len(), 5);

    // A 400 is the caller's problem: not retried.
    fake.respond(|_| Reply::Status(400, None));
    let id = engine.submit(classify("e3", "z")).await.unwrap().task.id;
    assert_eq!(finished(&engine, id).await.status, TaskStatus::Failed);
    assert_eq!(fake.requests().len(), 6);
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_are_retried() {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Slow(Duration::from_secs(5), "{}".into()), spam()]);
    let mut config = fake_config(&fake);
    if let Some(p) = config.providers.get_mut("fake") {
        p.timeout = Duration::from_millis(300);
    }
    let db = TestDb::sqlite("timeouts");
    let engine = db.engine(config).await;
    let handle = engine.start().await.unwrap();
    let id = engine.submit(classify("t", "x")).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(fake.dropped().len(), 1, "the timed-out call was abandoned");
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_object_extract_schema_is_wrapped_and_unwrapped() {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Content(r#"{"value": ["Ada", "Grace"]}"#.into())]);
    let (_db, engine) = engine_for(&fake).await;
    let handle = engine.start().await.unwrap();
    let submission = Submission::application(
        app(),
        scope(),
        key("extract"),
        TaskKind::ExtractData,
        json!({"input": "Ada and Grace", "schema": {"type": "array", "items": {"type": "string"}}}),
    );
    let id = engine.submit(submission).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    assert_eq!(task.output, Some(json!(["Ada", "Grace"])));
    let body = &fake.requests()[0].1;
    let schema: &Value = &body["response_format"]["json_schema"]["schema"];
    assert_eq!(schema["type"], "object");
    assert_eq!(schema["properties"]["value"]["type"], "array");
    handle.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test]
async fn a_missing_api_key_variable_is_a_configuration_error_naming_the_key() {
    let mut config = tollgate_engine::EngineConfig::default();
    let mut provider = ProviderConfig::openai("http://127.0.0.1:9/v1");
    provider.api_key_env = Some("TOLLGATE_TEST_SURELY_UNSET_KEY".into());
    config.providers.insert("openai".into(), provider);
    let db = TestDb::sqlite("apikey");
    let err = Tollgate::new(db.store().await, config).unwrap_err();
    assert!(
        err.to_string().contains("providers.openai.api_key_env"),
        "{err}"
    );
    assert!(
        err.to_string().contains("TOLLGATE_TEST_SURELY_UNSET_KEY"),
        "{err}"
    );
}

/// A cancel from another replica (whose notifications this worker never hears) reaches
/// the worker through its next heartbeat, which drops the HTTP call: the server sees the
/// connection go within one heartbeat interval.
async fn slow_answer_is_dropped_within_one_heartbeat_of_a_cancel(db: TestDb) {
    let fake = FakeOpenAi::start().await;
    fake.respond(|_| Reply::Slow(Duration::from_secs(30), "{}".into()));
    let mut config = fake_config(&fake);
    config.workers.heartbeat_interval = Duration::from_millis(200);
    config.sweeper.liveness_timeout = Duration::from_secs(5);
    let worker_engine = db.engine(config.clone()).await;
    let handle = worker_engine.start().await.unwrap();
    let other = Tollgate::builder(db.store().await, config)
        .notifier(Notifier::local())
        .build()
        .unwrap();
    let id = other.submit(classify("slow", "x")).await.unwrap().task.id;
    fake.until_requests(1).await;
    let canceled_at = Instant::now();
    let task = other.cancel(&app(), id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Canceled);
    let dropped_at = fake
        .until_dropped(Duration::from_secs(5))
        .await
        .expect("the provider call was never dropped");
    let after = dropped_at.saturating_duration_since(canceled_at);
    assert!(
        after <= Duration::from_millis(200 + 400),
        "the call was dropped {after:?} after the cancel; heartbeat interval 200 ms"
    );
    assert_eq!(
        fake.requests().len(),
        1,
        "a canceled task is not asked again"
    );
    let after = worker_engine.get(&app(), id).await.unwrap().unwrap();
    assert_eq!(after.status, TaskStatus::Canceled);
    handle.shutdown(Duration::from_secs(5)).await;
}
