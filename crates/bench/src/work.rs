//! What the scenarios submit and wait for: apps, scopes, requests and submissions.

use crate::measure::Progress;
use crate::{BENCH_APP, BENCH_METERED};
use anyhow::Context;
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tollgate_core::{
    AppId, Clock, EffectKey, ScopeId, SourceId, SourceRevision, SystemClock, Task, TaskKind,
    Timestamp,
};
use tollgate_engine::{MAX_BATCH, Submission, Tollgate};

/// The JSON value of a duration in seconds.
pub(crate) fn secs(d: Duration) -> serde_json::Value {
    json!(d.as_secs_f64())
}

/// The benchmark app.
pub(crate) fn bench_app() -> anyhow::Result<AppId> {
    Ok(AppId::new(BENCH_APP)?)
}

/// A classify request; `text` makes it unique (or equal, for cache hits).
pub(crate) fn classify(text: &str) -> Value {
    json!({"input": text, "labels": ["yes", "no"]})
}

/// The request as Tollgate stores it (canonical, with its kind), so baseline rows are the
/// same size as Tollgate's.
pub(crate) fn stored_classify(text: &str) -> String {
    json!({"input": text, "kind": "classify", "labels": ["yes", "no"]}).to_string()
}

/// A scoped classify submission of the benchmark app.
pub(crate) fn scoped(
    scope: &ScopeId,
    source: &str,
    key: &str,
    text: &str,
) -> anyhow::Result<Submission> {
    Ok(Submission::application(
        bench_app()?,
        scope.clone(),
        EffectKey::new(key)?,
        TaskKind::Classify,
        classify(text),
    )
    .with_source(SourceId::new(source)?, SourceRevision::new("v1")?))
}

/// [`scoped`] under the [`BENCH_METERED`] policy (docs/conformance.md#cost-limits limits that admit everything).
pub(crate) fn scoped_metered(
    scope: &ScopeId,
    source: &str,
    key: &str,
    text: &str,
) -> anyhow::Result<Submission> {
    Ok(scoped(scope, source, key, text)?
        .with_budget(tollgate_core::BudgetName::new(BENCH_METERED)?))
}

/// An unscoped classify submission of the benchmark app.
pub(crate) fn unscoped(scope: &ScopeId, key: &str, text: &str) -> anyhow::Result<Submission> {
    Ok(Submission::application(
        bench_app()?,
        scope.clone(),
        EffectKey::new(key)?,
        TaskKind::Classify,
        classify(text),
    ))
}

/// The HTTP body (`POST /v1/tasks`, or an item of `POST /v1/tasks/batch`) of
/// [`unscoped`]'s submission: the same kind, scope, effect key and request (the app comes
/// from the API key).
pub(crate) fn submit_body(scope: &ScopeId, key: &str, text: &str) -> Value {
    json!({
        "kind": TaskKind::Classify.as_str(),
        "scope": scope.as_str(),
        "effect_key": key,
        "request": classify(text),
    })
}

/// `count` scope ids named `<prefix>-<i>`.
pub(crate) fn scope_ids(prefix: &str, count: usize) -> anyhow::Result<Vec<ScopeId>> {
    (0..count)
        .map(|i| Ok(ScopeId::new(format!("{prefix}-{i}"))?))
        .collect()
}

/// Submits through the facade's batch call, [`MAX_BATCH`] at a time; every item must be
/// created. Counts them on the progress line.
pub(crate) async fn submit_all(
    tollgate: &Tollgate,
    submissions: Vec<Submission>,
    progress: &Progress,
) -> anyhow::Result<Vec<Task>> {
    let mut tasks = Vec::with_capacity(submissions.len());
    let mut rest = submissions.into_iter().peekable();
    while rest.peek().is_some() {
        let chunk: Vec<Submission> = rest.by_ref().take(MAX_BATCH).collect();
        for answer in tollgate.submit_many(chunk).await? {
            let submitted = answer.context("a benchmark submission was refused")?;
            anyhow::ensure!(
                submitted.created,
                "a benchmark effect key was taken already"
            );
            tasks.push(submitted.task);
        }
        progress.set(tasks.len() as u64);
    }
    Ok(tasks)
}

/// Waits until `current()` reaches `target`, showing it on the progress line; fails
/// after `timeout` (a benchmark that stalls says so rather than hang).
pub(crate) async fn wait_for(
    progress: &Progress,
    what: &str,
    target: u64,
    timeout: Duration,
    current: impl Fn() -> u64,
) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let now = current();
        progress.set(now);
        if now >= target {
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < timeout,
            "{what}: only {now} of {target} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The wall clock, for baseline rows (the stores use it too on SQLite; PostgreSQL reads
/// the same machine's clock).
pub(crate) fn wall_clock() -> Timestamp {
    SystemClock.now()
}
