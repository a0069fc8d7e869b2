//! `tollgate demo`: an embedded instance in a temporary folder, walked through the
//! guarantees a user cares about, with a readable report.

use anyhow::{Context, bail};
use serde_json::json;
use std::time::{Duration, Instant};
use tollgate_core::{
    AppId, EffectKey, ModelId, ScopeId, SourceId, SourceRevision, TaskKind, TaskStatus,
};
use tollgate_engine::config::{BudgetPolicy, Limit, ModelConfig};
use tollgate_engine::{EngineConfig, EngineError, Submission, Tollgate};

/// `println!` that ends the demo quietly when its reader goes away (`tollgate demo | head`).
macro_rules! say {
    ($($arg:tt)*) => {
        crate::client::print_line(&format!($($arg)*))
    };
}

fn step(n: u32, title: &str) {
    say!("\n{n}. {title}");
}

fn classify(app: &AppId, key: &str, input: &str, source: &str) -> anyhow::Result<Submission> {
    Ok(Submission::application(
        app.clone(),
        ScopeId::new("customer-42")?,
        EffectKey::new(key)?,
        TaskKind::Classify,
        json!({"input": input, "labels": ["spam", "ham"]}),
    )
    .with_source(SourceId::new(source)?, SourceRevision::new("v1")?))
}

pub async fn demo() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot make a temporary folder")?;
    let db = dir.path().join("tollgate.db");
    let mut config = EngineConfig::default();
    // A tight policy so the rate limit shows: 3 at once, then 6 a minute.
    config.budgets.insert(
        "demo".into(),
        BudgetPolicy {
            weight: Limit::Integer(1),
            max_steps_per_source: Limit::Integer(10),
            sources_per_24_hours: Limit::Integer(100),
            scope_concurrent: Limit::Integer(10),
            burst: Limit::Integer(3),
            tasks_per_minute: Limit::Integer(6),
            usd_per_24_hours: None,
            tokens_per_minute: None,
            token_burst: None,
        },
    );
    let mut slow = ModelConfig {
        requests_per_minute: None,
        tokens_per_minute: None,
        provider: "dev".into(),
        model: "dev-1".into(),
        params: Default::default(),
        prices: None,
        max_output_tokens: None,
        ..ModelConfig::default()
    };
    slow.params.insert("latency_ms".into(), json!(30_000));
    config.models.insert("slow".into(), slow);
    config.default_budget = "demo".into();
    config.workers.heartbeat_interval = Duration::from_millis(200);
    config.sweeper.interval = Duration::from_millis(500);
    let tollgate = Tollgate::open(&format!("sqlite://{}", db.display()), config)
        .await
        .context("cannot open the embedded database")?;
    let engine = tollgate.start().await?;
    let app = AppId::new("demo-app")?;
    say!(
        "Tollgate demo: an embedded instance (SQLite in {}) with the built-in dev provider.",
        dir.path().display()
    );

    step(
        1,
        "A classify task, admitted under the scope's budget and run by a worker",
    );
    let first = tollgate
        .submit(classify(&app, "email-1", "Win a free cruise!", "msg-1")?)
        .await?;
    let done = tollgate
        .wait(&app, first.task.id, Duration::from_secs(10))
        .await?
        .context("the task vanished")?;
    if done.status != TaskStatus::Succeeded {
        bail!("the first task ended {:?}: {:?}", done.status, done.error);
    }
    say!(
        "   task {} -> {} with output {}",
        done.id,
        done.status.as_str(),
        done.output.clone().unwrap_or_default()
    );

    step(
        2,
        "The same request under a new effect key is served from the cache",
    );
    let again = tollgate
        .submit(classify(
            &app,
            "email-1-again",
            "Win a free cruise!",
            "msg-1",
        )?)
        .await?;
    say!(
        "   new task {}: status {}, cached {}, copied from {} - no provider call, no budget spent",
        again.task.id,
        again.task.status.as_str(),
        again.task.cached(),
        again
            .task
            .cached_from
            .map(|i| i.to_string())
            .unwrap_or_default()
    );

    step(
        3,
        "Replaying an effect key returns the same task (exactly-once effects)",
    );
    let replay = tollgate
        .submit(classify(&app, "email-1", "Win a free cruise!", "msg-1")?)
        .await?;
    say!(
        "   replay of `email-1`: created {}, same id {}",
        replay.created,
        replay.task.id == first.task.id
    );

    step(
        4,
        "The scope's token bucket (burst 3, 6 a minute) refuses the next task with a retry time",
    );
    let mut refused = None;
    for i in 2..10 {
        let s = classify(
            &app,
            &format!("email-{i}"),
            &format!("message {i}"),
            &format!("msg-{i}"),
        )?;
        match tollgate.submit(s).await {
            Ok(t) => say!("   email-{i}: admitted ({})", t.task.status.as_str()),
            Err(EngineError::Admission(r)) => {
                say!(
                    "   email-{i}: refused {} - retry after {} ms",
                    r.code(),
                    r.retry_after().map_or(0, |d| d.as_millis())
                );
                refused = Some(r);
                break;
            }
            Err(e) => return Err(e.into()),
        }
    }
    if refused.is_none() {
        bail!("the rate limit never refused a task");
    }

    step(5, "Canceling a running task stops its provider call");
    let slow = Submission::application(
        app.clone(),
        ScopeId::new("customer-42")?,
        EffectKey::new("slow-1")?,
        TaskKind::GenerateText,
        json!({"prompt": "Write a long story."}),
    )
    .with_model(ModelId::new("slow")?);
    let slow = tollgate.submit(slow).await?.task;
    let started = Instant::now();
    while tollgate.get(&app, slow.id).await?.map(|t| t.status) == Some(TaskStatus::Queued)
        && started.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let canceled = tollgate
        .cancel(&app, slow.id)
        .await?
        .context("the slow task vanished")?;
    say!(
        "   task {} -> {} ({})",
        canceled.id,
        canceled.status.as_str(),
        canceled
            .error
            .map(|e| e.code.to_string())
            .unwrap_or_default()
    );

    step(
        6,
        "Deleting the owner's data removes its tasks but keeps the budget accounting",
    );
    let deleted = tollgate
        .delete_owner_data(&app, &ScopeId::new("customer-42")?, None)
        .await?;
    let gone = tollgate.get(&app, first.task.id).await?.is_none();
    say!("   deleted {deleted} tasks of scope customer-42; the first task is gone: {gone}");
    let after = tollgate
        .submit(classify(&app, "email-after", "hello", "msg-after")?)
        .await;
    match after {
        Err(EngineError::Admission(r)) => say!(
            "   a new task right after is still refused ({}): deletion never resets the rate",
            r.code()
        ),
        Ok(_) => say!("   a new task right after was admitted (a token had refilled)"),
        Err(e) => return Err(e.into()),
    }

    let report = engine.shutdown(Duration::from_secs(5)).await;
    say!(
        "\nDone (workers stopped; in-flight finished: {}).",
        report.drained
    );
    Ok(())
}
