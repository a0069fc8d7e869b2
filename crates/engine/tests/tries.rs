//! docs/routes.md, "Attempts", end to end through the worker and a scripted
//! OpenAI-compatible server on 127.0.0.1: a transient failure (a 5xx after the provider's
//! own retries) is followed by the next attempt up to `max_attempts` (the smaller of the
//! model's and the app's), `max_attempts = 1` fails at once as before, and a worker that
//! crashed mid-call leaves its task to another engine's next attempt, the task charged
//! both attempts.

mod common;

use common::*;
use std::time::Duration;
use tollgate_core::{AttemptOutcome, ErrorCode, MaxAttempts, SourceId, SourceRevision, TaskStatus};
use tollgate_engine::config::{AppConfig, BudgetPolicy, ModelPrices};
use tollgate_engine::{EngineConfig, Submission};

on_both_backends!(
    a_transient_failure_is_followed_by_the_next_attempt,
    one_attempt_fails_on_the_first_transient_failure,
    attempts_run_out_at_the_smaller_limit_and_the_last_error_ends_the_task,
    a_crashed_worker_s_attempt_is_followed_by_another_engine_s_and_both_are_charged,
    a_shutdown_hands_an_interrupted_task_to_the_next_replica_and_both_attempts_are_charged,
    a_shutdown_fails_an_interrupted_task_with_one_attempt_as_before,
);

const SPAM: &str = r#"{"label": "spam", "confidence": 0.9}"#;

/// The fake's `default` model, the provider retrying nothing itself (each 5xx is one
/// transient failure), with `max_attempts` for the model when given.
fn config(fake: &FakeOpenAi, max_attempts: Option<u32>) -> EngineConfig {
    let mut c = fake_config(fake);
    if let Some(p) = c.providers.get_mut("fake") {
        p.max_retries = 0;
    }
    if let Some(m) = c.models.get_mut("default") {
        m.max_attempts = max_attempts.map(|n| MaxAttempts::new(n).unwrap());
    }
    c
}

async fn outcomes(
    engine: &tollgate_engine::Tollgate,
    id: tollgate_core::TaskId,
) -> Vec<AttemptOutcome> {
    engine
        .attempts(&app(), id)
        .await
        .unwrap()
        .iter()
        .map(|a| a.outcome)
        .collect()
}

async fn a_transient_failure_is_followed_by_the_next_attempt(db: TestDb) {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Status(503, None), Reply::Content(SPAM.into())]);
    let engine = db.engine(config(&fake, None)).await;
    let handle = engine.start().await.unwrap();
    let id = engine.submit(classify("k", "Win!")).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    assert_eq!(fake.requests().len(), 2);
    let attempts = engine.attempts(&app(), id).await.unwrap();
    assert_eq!(
        attempts
            .iter()
            .map(|a| (a.n, a.outcome))
            .collect::<Vec<_>>(),
        vec![
            (1, AttemptOutcome::Unavailable),
            (2, AttemptOutcome::Succeeded)
        ]
    );
    assert!(
        attempts
            .iter()
            .all(|a| a.deployment == "fake/fake-model" && a.ended_at.is_some())
    );
    assert_eq!(
        attempts[0].error.as_ref().map(|e| e.code),
        Some(ErrorCode::ProviderError)
    );
    assert!(attempts[1].usage.is_some(), "the succeeded attempt's usage");
    assert_eq!(task.attempt, 1, "both attempts in one claim");
}

async fn one_attempt_fails_on_the_first_transient_failure(db: TestDb) {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Status(503, None), Reply::Content(SPAM.into())]);
    let engine = db.engine(config(&fake, Some(1))).await;
    let handle = engine.start().await.unwrap();
    let id = engine.submit(classify("k", "Win!")).await.unwrap().task.id;
    let task = finished(&engine, id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.error.map(|e| e.code), Some(ErrorCode::ProviderError));
    assert_eq!(fake.requests().len(), 1, "at most once");
    assert_eq!(
        outcomes(&engine, id).await,
        vec![AttemptOutcome::Unavailable]
    );
}

async fn attempts_run_out_at_the_smaller_limit_and_the_last_error_ends_the_task(db: TestDb) {
    let fake = FakeOpenAi::start().await;
    fake.script([
        Reply::Status(503, None),
        Reply::Status(500, None),
        Reply::Content(SPAM.into()),
    ]);
    let mut c = config(&fake, Some(5));
    c.apps.insert(
        "acme".into(),
        AppConfig {
            max_attempts: Some(MaxAttempts::new(2).unwrap()),
            ..AppConfig::default()
        },
    );
    let engine = db.engine(c).await;
    let handle = engine.start().await.unwrap();
    let submitted = engine.submit(classify("k", "Win!")).await.unwrap().task;
    assert_eq!(
        submitted.max_attempts.get(),
        2,
        "the app's limit is the smaller"
    );
    let task = finished(&engine, submitted.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(task.status, TaskStatus::Failed);
    let error = task.error.expect("an error");
    assert_eq!(error.code, ErrorCode::ProviderError);
    assert!(
        error.message.contains("500"),
        "the last error: {}",
        error.message
    );
    assert_eq!(fake.requests().len(), 2);
    assert_eq!(
        outcomes(&engine, submitted.id).await,
        vec![AttemptOutcome::Unavailable, AttemptOutcome::Unavailable]
    );
}

/// $1,000 per million tokens in and out (a token is 1,000,000 nano-dollars), a 20-token
/// output bound, a generous scope limit.
fn priced(fake: &FakeOpenAi) -> EngineConfig {
    let mut c = config(fake, None);
    if let Some(m) = c.models.get_mut("default") {
        m.prices = Some(ModelPrices {
            input_per_million: 1_000.0,
            output_per_million: 1_000.0,
            cached_input_per_million: None,
            cache_write_input_per_million: None,
        });
        m.max_output_tokens = Some(20);
    }
    c.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            usd_per_24_hours: Some(1_000.0),
            ..BudgetPolicy::default()
        },
    );
    c
}

fn sourced(key: &str) -> Submission {
    classify(key, "Win a free cruise!").with_source(
        SourceId::new("doc").unwrap(),
        SourceRevision::new("r1").unwrap(),
    )
}

async fn a_crashed_worker_s_attempt_is_followed_by_another_engine_s_and_both_are_charged(
    db: TestDb,
) {
    let fake = FakeOpenAi::start().await;
    // The first call hangs until its worker is gone; the next is answered.
    fake.script([
        Reply::Slow(Duration::from_secs(30), SPAM.into()),
        Reply::Content(SPAM.into()),
    ]);
    let config = priced(&fake);
    let first = db.engine(config.clone()).await;
    let submitted = first.submit(sourced("k")).await.unwrap().task;
    let reserved = submitted
        .reservation
        .expect("reserved at admission")
        .nano_usd;
    assert!(reserved > 0);
    let crashed = first.start().await.unwrap();
    fake.until_requests(1).await;
    crashed.abandon().await;

    let second = db.engine(config).await;
    let handle = second.start().await.unwrap();
    let task = finished(&second, submitted.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        task.status,
        TaskStatus::Succeeded,
        "{:?}, claimed {} times, attempts {:?}",
        task.error,
        task.attempt,
        second.attempts(&app(), submitted.id).await.unwrap()
    );
    assert_eq!(task.attempt, 2, "claimed again after the crash");
    assert_eq!(fake.requests().len(), 2);
    let attempts = second.attempts(&app(), submitted.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::Interrupted, AttemptOutcome::Succeeded]
    );
    assert_eq!(
        attempts[0].charged.nano_usd, reserved,
        "the interrupted attempt: its reservation"
    );
    assert_eq!(
        attempts[1].reserved.nano_usd, reserved,
        "the next attempt reserved before its call"
    );
    // The fake reports 10 prompt and 5 completion tokens.
    assert_eq!(attempts[1].charged.nano_usd, 15 * 1_000_000);
    let spend = db
        .store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .unwrap();
    assert_eq!(spend.reserved_nano, 0);
    assert_eq!(
        spend.settled_nano,
        reserved + 15 * 1_000_000,
        "charged both attempts"
    );
}

/// docs/routes.md, "Attempts": a graceful shutdown whose deadline interrupts a call is a
/// transient failure. The task goes back to the queue at once (its attempt ended
/// `interrupted`, charged its reservation), and another replica's next attempt succeeds.
async fn a_shutdown_hands_an_interrupted_task_to_the_next_replica_and_both_attempts_are_charged(
    db: TestDb,
) {
    let fake = FakeOpenAi::start().await;
    fake.script([
        Reply::Slow(Duration::from_secs(30), SPAM.into()),
        Reply::Content(SPAM.into()),
    ]);
    let config = priced(&fake);
    let first = db.engine(config.clone()).await;
    let submitted = first.submit(sourced("k")).await.unwrap().task;
    let reserved = submitted.reservation.expect("reserved").nano_usd;
    let handle = first.start().await.unwrap();
    fake.until_requests(1).await;
    let report = handle.shutdown(Duration::from_millis(100)).await;
    assert_eq!(report.interrupted, 1);
    let task = first.get(&app(), submitted.id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Queued, "{:?}", task.error);
    let attempts = first.attempts(&app(), submitted.id).await.unwrap();
    assert_eq!(
        attempts.iter().map(|a| a.outcome).collect::<Vec<_>>(),
        vec![AttemptOutcome::Interrupted]
    );
    assert_eq!(
        attempts[0].charged.nano_usd, reserved,
        "charged its reservation"
    );

    let second = db.engine(config).await;
    let handle = second.start().await.unwrap();
    let task = finished(&second, submitted.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(task.status, TaskStatus::Succeeded, "{:?}", task.error);
    assert_eq!(task.attempt, 2, "claimed again after the shutdown");
    assert_eq!(
        outcomes(&second, submitted.id).await,
        vec![AttemptOutcome::Interrupted, AttemptOutcome::Succeeded]
    );
    let spend = db
        .store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .unwrap();
    assert_eq!(spend.reserved_nano, 0);
    assert_eq!(
        spend.settled_nano,
        reserved + 15 * 1_000_000,
        "charged both attempts"
    );
}

/// With `max_attempts = 1` an interrupted task fails `WORKFLOW_AI_INTERRUPTED` at the
/// shutdown, as before attempts: it is never sent twice.
async fn a_shutdown_fails_an_interrupted_task_with_one_attempt_as_before(db: TestDb) {
    let fake = FakeOpenAi::start().await;
    fake.script([Reply::Slow(Duration::from_secs(30), SPAM.into())]);
    let mut config = priced(&fake);
    if let Some(m) = config.models.get_mut("default") {
        m.max_attempts = Some(MaxAttempts::new(1).unwrap());
    }
    let engine = db.engine(config).await;
    let submitted = engine.submit(sourced("k")).await.unwrap().task;
    let reserved = submitted.reservation.expect("reserved").nano_usd;
    let handle = engine.start().await.unwrap();
    fake.until_requests(1).await;
    let report = handle.shutdown(Duration::from_millis(100)).await;
    assert_eq!(report.interrupted, 1);
    let task = engine.get(&app(), submitted.id).await.unwrap().unwrap();
    assert_eq!(task.status, TaskStatus::Failed);
    assert_eq!(task.error.map(|e| e.code), Some(ErrorCode::Interrupted));
    assert_eq!(
        outcomes(&engine, submitted.id).await,
        vec![AttemptOutcome::Interrupted]
    );
    let spend = db
        .store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .unwrap();
    assert_eq!(
        (spend.reserved_nano, spend.settled_nano),
        (0, reserved),
        "charged its reservation"
    );
    assert_eq!(fake.requests().len(), 1, "at most once");
}
