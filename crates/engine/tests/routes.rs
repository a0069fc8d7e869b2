//! docs/routes.md end to end, through the worker and scripted OpenAI-compatible servers
//! on 127.0.0.1, on both backends:
//!
//! - a `fallback` route moves on from a deployment that answers 429 or 500, times out or
//!   drops the connection, within one call's time (no long retrying on a dead
//!   deployment), and the failed deployment is cooled down so the next task skips it;
//! - a `weighted` route spreads 1,000 calls by its weights (within ±10 % of 750 for
//!   weight 3 against 1);
//! - a cooldown set by one replica holds on the two others (three engines, one database);
//! - admission reserves the first call at the route's dearest deployment, each
//!   deployment's call is priced at its own prices, and a fallback that does not fit the
//!   budget ends the task `WORKFLOW_AI_SPEND_BUDGET` with its spent call settled.

mod common;

use common::*;
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::{ErrorCode, SourceId, SourceRevision, Strategy, TaskStatus};
use tollgate_engine::config::{
    BudgetPolicy, DeploymentConfig, ModelConfig, ModelPrices, ProviderConfig,
};
use tollgate_engine::{EngineConfig, Submission};

on_both_backends!(
    fallback_moves_on_from_a_failing_deployment_within_one_call,
    weighted_routes_spread_calls_by_weight,
    a_cooldown_holds_on_every_replica,
    admission_reserves_the_dearest_deployment_and_calls_are_priced_where_made,
    a_fallback_that_does_not_fit_the_budget_ends_the_task,
    a_refused_call_costs_nothing_and_a_dropped_one_its_bound,
);

const SPAM: &str = r#"{"label": "spam", "confidence": 0.9}"#;

/// A provider for `base_url` with fast retries (2 of them, 10 ms apart).
fn provider(base_url: &str) -> ProviderConfig {
    let mut p = ProviderConfig::openai(base_url.to_string());
    p.retry_backoff = Duration::from_millis(10);
    p.max_retry_delay = Duration::from_secs(1);
    p.timeout = Duration::from_secs(10);
    p
}

fn deployment(provider: &str, model: &str) -> DeploymentConfig {
    DeploymentConfig {
        provider: provider.into(),
        model: model.into(),
        ..DeploymentConfig::default()
    }
}

/// [`fast_config`] whose `default` model is a route over `deployments` (providers named
/// by the `(name, base_url)` pairs).
fn route_config(
    providers: &[(&str, &str)],
    strategy: Strategy,
    deployments: Vec<DeploymentConfig>,
) -> EngineConfig {
    let mut c = fast_config();
    for (name, url) in providers {
        c.providers.insert((*name).into(), provider(url));
    }
    c.models.insert(
        "default".into(),
        ModelConfig {
            strategy: Some(strategy),
            deployments,
            ..ModelConfig::default()
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

/// An address that accepts connections and closes them at once, without an answer.
async fn dropping_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            drop(socket);
        }
    });
    url
}

/// How a dead deployment fails.
#[derive(Debug, Clone, Copy)]
enum Dead {
    TooManyRequests,
    ServerError,
    Timeout,
    Drop,
}

async fn fallback_moves_on_from_a_failing_deployment_within_one_call(db: TestDb) {
    for dead in [
        Dead::TooManyRequests,
        Dead::ServerError,
        Dead::Timeout,
        Dead::Drop,
    ] {
        let good = FakeOpenAi::start().await;
        good.respond(|_| Reply::Content(SPAM.into()));
        let bad = FakeOpenAi::start().await;
        let bad_url = match dead {
            Dead::TooManyRequests => {
                bad.respond(|_| Reply::Status(429, None));
                bad.base_url.clone()
            }
            Dead::ServerError => {
                bad.respond(|_| Reply::Status(500, None));
                bad.base_url.clone()
            }
            Dead::Timeout => {
                bad.respond(|_| Reply::Slow(Duration::from_secs(30), SPAM.into()));
                bad.base_url.clone()
            }
            Dead::Drop => dropping_endpoint().await,
        };
        // Each case its own deployment names: cooldowns are shared through the store.
        let bad_model = format!("bad-{dead:?}");
        let good_model = format!("good-{dead:?}");
        let config = route_config(
            &[("bad", &bad_url), ("good", &good.base_url)],
            Strategy::Fallback,
            vec![
                // The dead deployment's own limit on one call.
                DeploymentConfig {
                    attempt_timeout: Some(Duration::from_secs(1)),
                    ..deployment("bad", &bad_model)
                },
                deployment("good", &good_model),
            ],
        );
        let engine = db.engine(config).await;
        let handle = engine.start().await.unwrap();
        let started = Instant::now();
        let first = engine
            .submit(classify(&format!("first-{dead:?}"), "Win a free cruise!"))
            .await
            .unwrap()
            .task;
        let done = finished(&engine, first.id).await;
        let took = started.elapsed();
        assert_eq!(
            done.status,
            TaskStatus::Succeeded,
            "{dead:?}: {:?}",
            done.error
        );
        assert_eq!(done.output.unwrap()["label"], "spam");
        // One call's time: the bad deployment's 1 s limit (a timeout) or its two fast
        // retries, then the good call — never the 30 s the dead deployment would take.
        assert!(
            took < Duration::from_secs(5),
            "{dead:?}: the fallback came within one call's time, took {took:?}"
        );
        let good_calls = good.requests();
        assert_eq!(good_calls.len(), 1, "{dead:?}");
        assert_eq!(good_calls[0].1["model"], good_model.as_str());
        let bad_calls = bad.requests().len();

        // The dead deployment cools down: the next task goes straight to the good one.
        let second = engine
            .submit(classify(&format!("second-{dead:?}"), "Win a free cruise!"))
            .await
            .unwrap()
            .task;
        let done = finished(&engine, second.id).await;
        handle.shutdown(Duration::from_secs(5)).await;
        assert_eq!(done.status, TaskStatus::Succeeded, "{dead:?}");
        assert_eq!(good.requests().len(), 2, "{dead:?}");
        assert_eq!(
            bad.requests().len(),
            bad_calls,
            "{dead:?}: a cooling deployment gets no calls"
        );
    }
}

async fn weighted_routes_spread_calls_by_weight(db: TestDb) {
    let light = FakeOpenAi::start().await;
    light.respond(|_| Reply::Content(SPAM.into()));
    let heavy = FakeOpenAi::start().await;
    heavy.respond(|_| Reply::Content(SPAM.into()));
    let mut config = route_config(
        &[("light", &light.base_url), ("heavy", &heavy.base_url)],
        Strategy::Weighted,
        vec![
            DeploymentConfig {
                weight: Some(1),
                ..deployment("light", "m")
            },
            DeploymentConfig {
                weight: Some(3),
                ..deployment("heavy", "m")
            },
        ],
    );
    config.workers.concurrency = 16;
    let engine = db.engine(config).await;
    let handle = engine.start().await.unwrap();
    let mut ids = Vec::new();
    for i in 0..1_000 {
        let task = engine
            .submit(classify(&format!("w{i}"), "Win a free cruise!"))
            .await
            .unwrap()
            .task;
        ids.push(task.id);
    }
    for id in ids {
        let done = finished(&engine, id).await;
        assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    }
    handle.shutdown(Duration::from_secs(5)).await;
    let (l, h) = (light.requests().len(), heavy.requests().len());
    assert_eq!(l + h, 1_000, "one call per task");
    // Expected 750 of 1,000 on the heavy deployment: within ±10 % (the draw's standard
    // deviation is 14 calls, so this never fails by chance; core's `choose` is checked
    // exactly). The light deployment has the rest.
    assert!(
        (675..=825).contains(&h),
        "heavy got {h} of 1,000, light {l}"
    );
}

async fn a_cooldown_holds_on_every_replica(db: TestDb) {
    let good = FakeOpenAi::start().await;
    good.respond(|_| Reply::Content(SPAM.into()));
    let bad = FakeOpenAi::start().await;
    bad.respond(|_| Reply::Status(503, None));
    let config = route_config(
        &[("bad", &bad.base_url), ("good", &good.base_url)],
        Strategy::Fallback,
        vec![deployment("bad", "bad-m"), deployment("good", "good-m")],
    );
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(db.engine(config.clone()).await);
    }
    // Each replica in turn runs one task (only its workers run meanwhile).
    for (i, engine) in replicas.iter().enumerate() {
        let handle = engine.start().await.unwrap();
        let task = engine
            .submit(classify(&format!("replica-{i}"), "Win a free cruise!"))
            .await
            .unwrap()
            .task;
        let done = finished(engine, task.id).await;
        handle.shutdown(Duration::from_secs(5)).await;
        assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
        assert_eq!(
            bad.requests().len(),
            3,
            "replica {i}: one call (and its 2 retries) by the first replica, none after"
        );
    }
    assert_eq!(good.requests().len(), 3);
}

/// $1 per million input tokens and $2 per million output tokens, times `factor`.
fn prices(factor: f64) -> ModelPrices {
    ModelPrices {
        input_per_million: factor,
        output_per_million: 2.0 * factor,
        cached_input_per_million: None,
        cache_write_input_per_million: None,
    }
}

fn priced(provider: &str, model: &str, factor: f64) -> DeploymentConfig {
    DeploymentConfig {
        prices: Some(prices(factor)),
        max_output_tokens: Some(50),
        ..deployment(provider, model)
    }
}

async fn admission_reserves_the_dearest_deployment_and_calls_are_priced_where_made(db: TestDb) {
    let cheap = FakeOpenAi::start().await;
    cheap.respond(|_| Reply::Status(500, None));
    let dear = FakeOpenAi::start().await;
    dear.respond(|_| Reply::Content(SPAM.into()));
    let mut config = route_config(
        &[("cheap", &cheap.base_url), ("dear", &dear.base_url)],
        Strategy::Fallback,
        vec![priced("cheap", "m", 1.0), priced("dear", "m", 10.0)],
    );
    // The dear deployment alone, as a model of its own: the reservation to match.
    config.models.insert(
        "dear-only".into(),
        ModelConfig {
            provider: "dear".into(),
            model: "m".into(),
            prices: Some(prices(10.0)),
            max_output_tokens: Some(50),
            ..ModelConfig::default()
        },
    );
    let engine = db.engine(config).await;
    let alone = engine
        .submit(
            sourced("alone", "alone").with_model(tollgate_core::ModelId::new("dear-only").unwrap()),
        )
        .await
        .unwrap()
        .task;
    let routed = engine
        .submit(sourced("routed", "routed"))
        .await
        .unwrap()
        .task;
    let r = routed.reservation.unwrap();
    assert_eq!(
        r.nano_usd,
        alone.reservation.unwrap().nano_usd,
        "admission reserves the first call at the dearest deployment"
    );
    assert!(r.nano_usd > 0);
    engine.cancel(&app(), alone.id).await.unwrap();

    let handle = engine.start().await.unwrap();
    let done = finished(&engine, routed.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    let usage = done.usage.unwrap();
    // The cheap deployment's failed call is counted at its bound (it may have been
    // billed) at its own prices; the dear one's answer (10 in, 5 out) at the dear ones.
    let cheap_body = &cheap.requests()[0].1;
    let cheap_input = tollgate_engine::cost::body_input_tokens(
        tollgate_engine::cost::TokenCounter::bytes(),
        cheap_body,
    );
    let cheap_nano = cheap_input as i64 * 1_000 + 50 * 2_000;
    let dear_nano = 10 * 10_000 + 5 * 20_000;
    assert_eq!(usage.cost_nano_usd, Some(cheap_nano + dear_nano));
    assert!(usage.estimated, "a failed call's usage is its bound");
    let w = db
        .store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .unwrap();
    assert_eq!(w.reserved_nano, 0, "nothing stays reserved");
    assert_eq!(
        w.settled_nano,
        cheap_nano + dear_nano,
        "settled exactly, each call at its deployment's prices"
    );
}

async fn a_fallback_that_does_not_fit_the_budget_ends_the_task(db: TestDb) {
    let bad = FakeOpenAi::start().await;
    bad.respond(|_| Reply::Status(500, None));
    let good = FakeOpenAi::start().await;
    good.respond(|_| Reply::Content(SPAM.into()));
    let mut config = route_config(
        &[("bad", &bad.base_url), ("good", &good.base_url)],
        Strategy::Fallback,
        vec![priced("bad", "m", 10.0), priced("good", "m", 10.0)],
    );
    // Room for the first call's reservation and a little more, not for a second call.
    let probe = db.engine(config.clone()).await;
    let first = probe.submit(sourced("probe", "probe")).await.unwrap().task;
    let reserved = first.reservation.unwrap().nano_usd;
    probe.cancel(&app(), first.id).await.unwrap();
    config.budgets.insert(
        "standard".into(),
        BudgetPolicy {
            usd_per_24_hours: Some(reserved as f64 * 1.5 / 1e9),
            ..BudgetPolicy::default()
        },
    );
    let engine = db.engine(config).await;
    let task = engine.submit(sourced("tight", "tight")).await.unwrap().task;
    let handle = engine.start().await.unwrap();
    let done = finished(&engine, task.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Failed);
    let error = done.error.unwrap();
    assert_eq!(error.code, ErrorCode::SpendBudget, "{}", error.message);
    assert!(error.message.contains("fallback"), "{}", error.message);
    assert!(good.requests().is_empty(), "the fallback was never sent");
    let usage = done.usage.expect("the spent call is recorded");
    let w = db
        .store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .unwrap();
    assert_eq!(w.reserved_nano, 0, "nothing stays reserved");
    assert_eq!(
        Some(w.settled_nano),
        usage.cost_nano_usd,
        "the failed call is settled at its bound"
    );
    assert!(w.settled_nano <= reserved);
}

/// docs/routes.md, "What is charged when": a call the provider refused outright (429 with
/// no body, after its retries) processed no tokens and is charged nothing; a call whose
/// connection dropped may have been billed and is charged its bound; the answer its
/// usage. The task is settled at the sum.
async fn a_refused_call_costs_nothing_and_a_dropped_one_its_bound(db: TestDb) {
    let refusing = FakeOpenAi::start().await;
    refusing.respond(|_| Reply::Status(429, None));
    let dropping = dropping_endpoint().await;
    let good = FakeOpenAi::start().await;
    good.respond(|_| Reply::Content(SPAM.into()));
    let config = route_config(
        &[
            ("refusing", &refusing.base_url),
            ("dropping", &dropping),
            ("good", &good.base_url),
        ],
        Strategy::Fallback,
        vec![
            priced("refusing", "m", 1.0),
            priced("dropping", "m", 1.0),
            priced("good", "m", 1.0),
        ],
    );
    let engine = db.engine(config).await;
    let task = engine.submit(sourced("k", "doc")).await.unwrap().task;
    let handle = engine.start().await.unwrap();
    let done = finished(&engine, task.id).await;
    handle.shutdown(Duration::from_secs(5)).await;
    assert_eq!(done.status, TaskStatus::Succeeded, "{:?}", done.error);
    assert_eq!(refusing.requests().len(), 3, "the call and its 2 retries");
    let attempts = engine.attempts(&app(), task.id).await.unwrap();
    assert_eq!(
        attempts
            .iter()
            .map(|a| a.deployment.as_str())
            .collect::<Vec<_>>(),
        ["refusing/m", "dropping/m", "good/m"]
    );
    let (refused, dropped, answered) = (&attempts[0], &attempts[1], &attempts[2]);
    assert!(refused.reserved.nano_usd > 0);
    assert_eq!(refused.charged.nano_usd, 0, "a refused call costs nothing");
    assert_eq!(
        refused.usage.map(|u| (u.input_tokens, u.output_tokens)),
        Some((0, 0)),
        "it used no tokens"
    );
    assert!(dropped.charged.nano_usd > 0);
    assert_eq!(
        dropped.charged.nano_usd, dropped.reserved.nano_usd,
        "a dropped call may have been billed: its bound"
    );
    // The good deployment's answer: 10 in, 5 out at $1 / $2 per million.
    assert_eq!(answered.charged.nano_usd, 10 * 1_000 + 5 * 2_000);
    let w = db
        .store()
        .await
        .spend(&app(), Some(&scope()))
        .await
        .unwrap();
    assert_eq!(w.reserved_nano, 0, "nothing stays reserved");
    assert_eq!(
        w.settled_nano,
        dropped.charged.nano_usd + answered.charged.nano_usd,
        "settled at the sum of the attempts' charges"
    );
    assert_eq!(
        done.usage.and_then(|u| u.cost_nano_usd),
        Some(w.settled_nano),
        "the task's usage carries the same sum"
    );
}
