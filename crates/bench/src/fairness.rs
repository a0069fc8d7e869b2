//! `fairness` (docs/conformance.md#fair-share): how long a small scope waits behind another scope's backlog.
//!
//! Same run, same engine (W workers, instant provider):
//! 1. *No backlog*: scope B submits 200 tasks (one batch call) into an empty queue.
//! 2. *Behind a backlog*: scope A's 20,000 tasks are queued, the workers start on them,
//!    and once they are well into it (5 % done) B submits the same 200 again.
//!
//! Each B task's submit → start is its own `claimed_at − created_at` (the store's
//! clock). Reported: p50/p99 of both, and the time the workers would have needed to
//! reach B's tasks oldest-first (A's remaining backlog at their measured rate).
//! Target: B's p99 behind the backlog ≤ 2 × its p99 with no backlog.

use super::measure::{Phase, per_s};
use super::report::ScenarioReport;
use super::{Ctx, Scenario, bench_app, secs, submit_all, unscoped, wait_for};
use std::time::{Duration, Instant};
use tollgate_core::{ScopeId, Task, TaskId, TaskStatus};
use tollgate_engine::Tollgate;

/// The small scope's tasks.
const NEWCOMER_TASKS: u64 = 200;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let backlog = sizes.tasks;
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let (a, b) = (ScopeId::new("backlog-a")?, ScopeId::new("newcomer-b")?);

    // 1. No backlog.
    ctx.progress
        .stage(format!("no backlog: scope B submits {NEWCOMER_TASKS}"));
    let engine = tollgate.start().await?;
    let alone = newcomers(ctx, &tollgate, &b, "alone").await?;
    engine.shutdown(Duration::from_secs(30)).await;

    // 2. Behind A's backlog.
    ctx.progress
        .stage(format!("scope A queues a backlog of {backlog}"));
    let submissions = (0..backlog)
        .map(|i| unscoped(&a, &format!("a-{i}"), &format!("backlog {i}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    submit_all(&tollgate, submissions, &ctx.progress).await?;
    let done_before = super::counting::Counts::get(&counting.counts().completed);
    let engine = tollgate.start().await?;
    let warm = (backlog / 20).max(1);
    let counts = counting.counts().clone();
    let started = Instant::now();
    wait_for(
        &ctx.progress,
        "the backlog under way",
        warm,
        Duration::from_secs(600),
        || super::counting::Counts::get(&counts.completed) - done_before,
    )
    .await?;
    let rate = per_s(
        super::counting::Counts::get(&counts.completed) - done_before,
        started.elapsed(),
    );
    let left =
        backlog.saturating_sub(super::counting::Counts::get(&counts.completed) - done_before);
    ctx.progress.stage(format!(
        "behind the backlog: scope B submits {NEWCOMER_TASKS}"
    ));
    let behind = newcomers(ctx, &tollgate, &b, "behind").await?;
    engine.shutdown(Duration::from_secs(30)).await;

    let (alone_p, behind_p) = (
        alone
            .percentiles()
            .ok_or_else(|| anyhow::anyhow!("no samples"))?,
        behind
            .percentiles()
            .ok_or_else(|| anyhow::anyhow!("no samples"))?,
    );
    let ratio = behind_p.p99_ms / alone_p.p99_ms.max(0.001);
    let fifo_wait_s = left as f64 / rate.max(0.001);
    let mut report = ctx.report(Scenario::Fairness);
    report
        .param("backlog", backlog)
        .param("newcomer_tasks", NEWCOMER_TASKS)
        .param("workers", sizes.workers)
        .row("scope B, no backlog (submit → start)", None, Some(alone_p))
        .row(
            &format!("scope B, behind A's backlog of {backlog} (submit → start)"),
            None,
            Some(behind_p),
        )
        .target(
            format!("B's p99 behind the backlog ≤ 2 × no backlog (got {ratio:.2} ×)"),
            ratio <= 2.0,
        )
        .extra("p99_ratio", ratio)
        .extra("backlog_left_when_b_submitted", left)
        .extra("backlog_rate_per_s", rate)
        .extra("fifo_estimated_wait_s", fifo_wait_s)
        .extra("b_alone_elapsed_s", secs(alone.elapsed))
        .extra("b_behind_elapsed_s", secs(behind.elapsed))
        .note(format!(
            "oldest-first, B's tasks would have started after A's remaining {left} tasks: \
             about {fifo_wait_s:.1} s at the measured {rate:.0} tasks/s"
        ));
    report.store_profile(&counting.counts().profile());
    Ok(report)
}

/// Scope B submits its tasks in one batch call and waits until all have ended; each
/// task's submit → start (`claimed_at − created_at`, store clock) is one sample.
async fn newcomers(
    ctx: &Ctx,
    tollgate: &Tollgate,
    scope: &ScopeId,
    tag: &str,
) -> anyhow::Result<Phase> {
    let submissions = (0..NEWCOMER_TASKS)
        .map(|i| {
            unscoped(
                scope,
                &format!("b-{tag}-{i}"),
                &format!("newcomer {tag} {i}"),
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let started = Instant::now();
    let tasks = submit_all(tollgate, submissions, &ctx.progress).await?;
    let ids: Vec<TaskId> = tasks.iter().map(|t| t.id).collect();
    let app = bench_app()?;
    let mut latencies_us = Vec::with_capacity(ids.len());
    let deadline = Instant::now() + Duration::from_secs(600);
    for id in ids {
        let task: Task = loop {
            let t = tollgate
                .wait(&app, id, Duration::from_secs(30))
                .await?
                .ok_or_else(|| anyhow::anyhow!("task {id} vanished"))?;
            if t.status.is_terminal() {
                break t;
            }
            anyhow::ensure!(Instant::now() < deadline, "task {id} never finished");
        };
        anyhow::ensure!(
            task.status == TaskStatus::Succeeded,
            "task {id} ended {:?}",
            task.status
        );
        let claimed = task
            .claimed_at
            .ok_or_else(|| anyhow::anyhow!("task {id} has no claim time"))?;
        let waited_ms = (claimed.0 - task.created_at.0).max(0) as u64;
        latencies_us.push(waited_ms * 1000);
    }
    Ok(Phase {
        ops: NEWCOMER_TASKS,
        elapsed: started.elapsed(),
        latencies_us,
    })
}
