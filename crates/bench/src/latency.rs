//! `latency`: one client submits a task and waits for its result, again and again, with
//! the workers running and the instant provider: submit → notification → claim →
//! provider → complete → notification → result.
//!
//! Baseline, same database: the raw SQL lifecycle of one task done back to back by one
//! client (insert, claim, complete; one transaction each) — the floor of any design that
//! keeps the queue in the database, with no hand-over between processes at all.

use super::measure::{Op, Phase, run_timed};
use super::report::ScenarioReport;
use super::{Ctx, Scenario, bench_app, stored_classify, unscoped, wall_clock};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{ScopeId, TaskStatus};

/// How long one task may take before the scenario fails.
const WAIT: Duration = Duration::from_secs(30);

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let engine = tollgate.start().await?;
    let scope = ScopeId::new("latency")?;
    let app = bench_app()?;
    let mut ours = Phase::default();
    let mut theirs = Phase::default();
    let mut failure = None;
    for round in 0..sizes.rounds {
        let label = format!("round {}/{}", round + 1, sizes.rounds);
        ctx.progress
            .stage(format!("tollgate {label}: submit → result"));
        let (tg, scope, app) = (tollgate.clone(), scope.clone(), app.clone());
        let op: Op = Arc::new(move |_, seq| {
            let (tg, scope, app) = (tg.clone(), scope.clone(), app.clone());
            Box::pin(async move {
                let key = format!("lat-{round}-{seq}");
                let submitted = tg.submit(unscoped(&scope, &key, &key)?).await?;
                let done = tg.wait(&app, submitted.task.id, WAIT).await?;
                let status = done.map(|t| t.status);
                anyhow::ensure!(
                    status == Some(TaskStatus::Succeeded),
                    "task ended {status:?} within {WAIT:?}"
                );
                Ok(())
            })
        });
        match run_timed(&ctx.progress, 1, sizes.round_duration(), op).await {
            Ok(phase) => ours.add(phase),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }

        ctx.progress
            .stage(format!("baseline {label}: raw insert, claim, complete"));
        let baseline = ctx.baseline().clone();
        let op: Op = Arc::new(move |_, seq| {
            let baseline = baseline.clone();
            Box::pin(async move {
                let key = format!("raw-lat-{round}-{seq}");
                let id = baseline
                    .raw_insert("bench", &key, &stored_classify(&key), wall_clock())
                    .await?;
                let claimed = baseline.raw_claim("raw-worker", wall_clock()).await?;
                anyhow::ensure!(
                    claimed.as_deref() == Some(id.as_str()),
                    "claimed another task"
                );
                baseline
                    .raw_complete(&id, r#"{"confidence":null,"label":"yes"}"#, wall_clock())
                    .await?;
                Ok(())
            })
        });
        theirs.add(run_timed(&ctx.progress, 1, sizes.round_duration(), op).await?);
    }
    engine.shutdown(Duration::from_secs(30)).await;
    if let Some(e) = failure {
        return Err(e);
    }
    let mut report = ctx.report(Scenario::Latency);
    report
        .param("clients", 1)
        .param("workers", sizes.workers)
        .param("seconds_per_side", sizes.duration.as_secs_f64())
        .param("rounds", sizes.rounds)
        .tollgate(
            "tollgate (submit → result)",
            ours.per_s(),
            ours.percentiles(),
        )
        .baseline(
            "baseline (raw insert, claim, complete)",
            theirs.per_s(),
            theirs.percentiles(),
        )
        .ratio_reported()
        .note("no target: p50/p99 of both reported (rates are one client's, sequential)");
    report.store_profile(&counting.counts().profile());
    Ok(report)
}
