//! docs/budgets.md, "The reservation" and "Settlement", end to end through the worker and
//! a scripted OpenAI-compatible server on 127.0.0.1 whose answers carry the usage each
//! test asks for (or none):
//!
//! - admission reserves the first attempt only; a re-ask is reserved when the worker
//!   makes it, its input counted exactly as sent; a re-ask that does not fit ends the
//!   task with `WORKFLOW_AI_SPEND_BUDGET`, its spent attempt settled;
//! - an answer without `usage` is counted at the attempt's bound and flagged
//!   `estimated`;
//! - absurd usage (10^15 prompt tokens) is clamped, recorded as overrun, and the answer
//!   kept.

mod common;

use axum::Json;
use axum::extract::State;
use common::*;
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::{ErrorCode, MAX_REPORTED_TOKENS, SourceId, SourceRevision, TaskStatus};
use tollgate_engine::config::{BudgetPolicy, ModelConfig, ModelPrices, ProviderConfig};
use tollgate_engine::cost::{TokenCounter, body_input_tokens};
use tollgate_engine::{EngineConfig, Submission, Tollgate};
use tollgate_store::SpendWindow;

on_both_backends!(
    a_reask_is_reserved_when_made_and_one_that_does_not_fit_ends_the_task,
    an_answer_without_usage_is_counted_at_its_bound,
    absurd_usage_is_clamped_and_the_answer_kept,
);

/// One scripted answer: the message content and the `usage` object (`None`: no usage).
type Answer = (String, Option<Value>);

#[derive(Default)]
struct Fake {
    answers: Mutex<VecDeque<Answer>>,
    requests: Mutex<Vec<Value>>,
}

async fn chat(State(fake): State<Arc<Fake>>, Json(body): Json<Value>) -> Json<Value> {
    fake.requests.lock().unwrap().push(body);
    let (content, usage) = fake
        .answers
        .lock()
        .unwrap()
        .pop_front()
        .unwrap_or_else(|| (SPAM.into(), Some(usage(10, 5))));
    let mut answer = json!({
        "id": "chatcmpl-fake", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}],
    });
    if let Some(u) = usage {
        answer["usage"] = u;
    }
    Json(answer)
}

const SPAM: &str = r#"{"label": "spam", "confidence": 0.9}"#;
const EGGS: &str = r#"{"label": "eggs", "confidence": 0.9}"#;

fn usage(prompt: u64, completion: u64) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}

async fn start_fake(answers: Vec<Answer>) -> (Arc<Fake>, String) {
    let fake = Arc::new(Fake::default());
    fake.answers.lock().unwrap().extend(answers);
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(chat))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (fake, url)
}

/// Output bound of every attempt.
const MAX_OUTPUT: u64 = 20;
/// $1,000 per million tokens, in and out: one token is 1,000,000 nano-dollars.
const NANO_PER_TOKEN: i64 = 1_000_000;

/// The fake's model at $1,000/M tokens with a 20-token output bound; the `standard`
/// policy limits the scope to `limit_usd`.
fn config(url: &str, limit_usd: f64) -> EngineConfig {
    let mut c = fast_config();
    let mut provider = ProviderConfig::openai(url.to_string());
    provider.max_retries = 0;
    c.providers.insert("fake".into(), provider);
    c.models.insert(
        "default".into(),
        ModelConfig {
            requests_per_minute: None,
            tokens_per_minute: None,
            provider: "fake".into(),
            model: "fake-model".into(),
            params: Default::default(),
            prices: Some(ModelPrices {
                input_per_million: 1_000.0,
                output_per_million: 1_000.0,
                cached_input_per_million: None,
                cache_write_input_per_million: None,
            }),
            max_output_tokens: Some(MAX_OUTPUT as u32),
            ..ModelConfig::default()
        },
    );
    c.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            usd_per_24_hours: Some(limit_usd),
            ..BudgetPolicy::default()
        },
    );
    c
}

fn sourced(key: &str, source: &str) -> Submission {
    classify(key, "Win a free cruise!").with_source(
        SourceId::new(source).unwrap(),
        SourceRevision::new("r1").unwrap(),
    )
}

async fn spend(db: &TestDb) -> SpendWindow {
    db.store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .expect("spend")
}

/// The first attempt's reservation, in tokens, as admission computes it (one attempt
/// only): measured on an engine without workers under a generous limit.
async fn first_attempt_tokens(db: &TestDb, url: &str) -> u64 {
    let engine = db.engine(config(url, 1_000.0)).await;
    let task = engine.submit(sourced("probe", "probe")).await.unwrap().task;
    let r = task
        .reservation
        .expect("a sourced task is admitted with a reservation");
    engine.cancel(&app(), task.id).await.unwrap();
    r.tokens
}

/// Input tokens of a request body as the reservation counts them (the fake model has no
/// known tokenizer: bytes).
fn counted(body: &Value) -> u64 {
    body_input_tokens(TokenCounter::bytes(), body)
}

async fn a_reask_is_reserved_when_made_and_one_that_does_not_fit_ends_the_task(db: TestDb) {
    let (fake, url) = start_fake(vec![
        (EGGS.into(), Some(usage(10, 5))),
        (EGGS.into(), Some(usage(10, 5))),
        (SPAM.into(), Some(usage(12, 5))),
    ])
    .await;
    let first = first_attempt_tokens(&db, &url).await;
    let usd = |tokens: u64| tokens as f64 * NANO_PER_TOKEN as f64 / 1e9;

    // Room for 1.5 first attempts: admitted (three attempts are not reserved up front),
    // but its re-ask (larger than the first attempt) does not fit.
    let engine = db.engine(config(&url, usd(first) * 1.5)).await;
    let task = engine.submit(sourced("tight", "tight")).await.unwrap().task;
    let r = task.reservation.unwrap();
    assert_eq!(r.tokens, first, "admission reserves the first attempt only");
    assert_eq!(r.nano_usd, first as i64 * NANO_PER_TOKEN);
    let handle = engine.start().await.unwrap();
    let done = finished(&engine, task.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.code, ErrorCode::SpendBudget, "{}", error.message);
    assert_eq!(
        fake.requests.lock().unwrap().len(),
        1,
        "the re-ask was never sent"
    );
    assert_eq!(
        done.usage.map(|u| (u.input_tokens, u.output_tokens)),
        Some((10, 5)),
        "the spent attempt is recorded"
    );
    let w = spend(&db).await;
    assert_eq!(w.reserved_nano, 0, "nothing stays reserved");
    assert_eq!(
        w.settled_nano,
        15 * NANO_PER_TOKEN,
        "the spent attempt is settled"
    );

    // Room for three first attempts: the re-ask is reserved (counted exactly as sent)
    // and the task succeeds on it.
    let engine = db.engine(config(&url, usd(first) * 3.0 + 1.0)).await;
    let task = engine.submit(sourced("roomy", "roomy")).await.unwrap().task;
    let handle = engine.start().await.unwrap();
    let done = finished(&engine, task.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    let requests = fake.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 3);
    let reask = counted(&requests[2]) + MAX_OUTPUT;
    assert_eq!(
        counted(&requests[1]) + MAX_OUTPUT,
        first,
        "the first attempt as reserved"
    );
    assert!(reask > first, "a re-ask sends the correction too");
    let stored = engine.get(&app(), task.id).await.unwrap().unwrap();
    assert_eq!(
        stored.reservation.map(|r| r.tokens),
        Some(first + reask),
        "the re-ask is reserved exactly as it was sent"
    );
    let w = spend(&db).await;
    assert_eq!(w.reserved_nano, 0);
    assert_eq!(
        w.settled_nano,
        15 * NANO_PER_TOKEN + (10 + 5 + 12 + 5) * NANO_PER_TOKEN
    );
}

async fn an_answer_without_usage_is_counted_at_its_bound(db: TestDb) {
    let (fake, url) = start_fake(vec![(SPAM.into(), None)]).await;
    let engine = db.engine(config(&url, 1_000.0)).await;
    let task = engine.submit(sourced("free", "free")).await.unwrap().task;
    let reserved = task.reservation.unwrap();
    let handle = engine.start().await.unwrap();
    let done = finished(&engine, task.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    let body = fake.requests.lock().unwrap()[0].clone();
    let usage = done.usage.expect("usage");
    assert!(usage.estimated, "unreported usage is flagged");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (counted(&body), MAX_OUTPUT),
        "counted at the attempt's bound"
    );
    let w = spend(&db).await;
    assert_eq!(w.reserved_nano, 0);
    assert_eq!(
        w.settled_nano, reserved.nano_usd,
        "never less than could have been billed: the attempt's reservation"
    );
    // The flag is visible to users as `usage.estimated`.
    let json = serde_json::to_value(usage).unwrap();
    assert_eq!(json["estimated"], true);
}

async fn absurd_usage_is_clamped_and_the_answer_kept(db: TestDb) {
    let (_fake, url) = start_fake(vec![(SPAM.into(), Some(usage(1_000_000_000_000_000, 5)))]).await;
    let engine: Tollgate = db.engine(config(&url, 1_000_000.0)).await;
    let task = engine
        .submit(sourced("absurd", "absurd"))
        .await
        .unwrap()
        .task;
    let reserved = task.reservation.unwrap();
    let handle = engine.start().await.unwrap();
    let done = finished(&engine, task.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    assert_eq!(
        done.output,
        Some(json!({"label": "spam", "confidence": 0.9})),
        "the answer is kept"
    );
    let usage = done.usage.unwrap();
    assert_eq!(usage.input_tokens, MAX_REPORTED_TOKENS, "clamped");
    let w = spend(&db).await;
    let charged = (MAX_REPORTED_TOKENS as i64 + 5) * NANO_PER_TOKEN;
    assert_eq!(w.reserved_nano, 0);
    assert_eq!(w.settled_nano, charged);
    assert_eq!(
        w.overrun_nano,
        charged - reserved.nano_usd,
        "recorded as overrun"
    );
}
