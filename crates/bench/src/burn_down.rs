//! `burn-down`: submit N unscoped tasks through the facade's batch call, then start W
//! workers with an instant provider and let them run every one. Rate = N ÷ (first
//! submit → last committed completion).
//!
//! Baseline, same database, same N and W: the raw SQL lifecycle — N inserts (8 at once,
//! like the facade's batch groups), then W loops of a `SKIP LOCKED` claim and a complete,
//! one transaction each.
//!
//! docs/conformance.md#fair-share: Tollgate runs each round twice, with fairness on (the default; the ratio's
//! term) and off (oldest first, priority ignored), so the cost of fair claiming is
//! measured in the same run. Target: fairness on ≥ 90 % of fairness off.

use super::counting::{CountingStore, Counts};
use super::measure::Phase;
use super::report::ScenarioReport;
use super::{
    Ctx, Scenario, scope_ids, stored_classify, submit_all, unscoped, wait_for, wall_clock,
};
use crate::baseline::Baseline;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;
use tollgate_core::ScopeId;
use tollgate_engine::Tollgate;

/// Scopes the submissions spread over: the facade's batch call runs one group per owner,
/// up to 8 at once.
pub(super) const SUBMIT_SCOPES: usize = 8;
/// Concurrent inserters of the baseline (as many as the facade's batch groups).
const BASELINE_INSERTERS: u64 = 8;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let rounds = u64::from(sizes.rounds).min(sizes.tasks).max(1);
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let oldest_first = ctx.counting_store_oldest_first();
    let unfair = ctx.tollgate_with(&oldest_first, sizes.workers, None, false)?;
    let scopes = scope_ids("burn", SUBMIT_SCOPES)?;
    let mut ours = Phase::default();
    let mut ours_unfair = Phase::default();
    let mut theirs = Phase::default();
    let mut submit_time = Duration::ZERO;
    for round in 0..rounds {
        let n = sizes.tasks / rounds + u64::from(round < sizes.tasks % rounds);
        let label = format!("round {}/{rounds}", round + 1);

        // Tollgate, fairness on and off: submit everything, then start the workers.
        // The two sides alternate which goes first, round by round, so neither always
        // runs on the table as the other left it.
        let mut sides = [
            (true, &tollgate, &counting),
            (false, &unfair, &oldest_first),
        ];
        if round % 2 == 1 {
            sides.reverse();
        }
        for (fair, tollgate, counting) in sides {
            let side = if fair { "fair" } else { "oldest-first" };
            let timed = tollgate_burn_down(
                ctx,
                tollgate,
                counting,
                &scopes,
                &format!("{side}-{round}"),
                n,
                &format!("tollgate ({side}, {} workers) {label}", sizes.workers),
            )
            .await?;
            let phase = Phase {
                ops: n,
                elapsed: timed.total,
                latencies_us: Vec::new(),
            };
            if fair {
                submit_time += timed.submit;
                ours.add(phase);
            } else {
                ours_unfair.add(phase);
            }
        }

        // Baseline: the raw lifecycle on the same database.
        ctx.progress
            .stage(format!("baseline {label}: raw insert, claim, complete"));
        theirs.add(raw_lifecycle(ctx.baseline(), round, n, sizes.workers, ctx).await?);
    }
    let mut report = ctx.report(Scenario::BurnDown);
    report
        .param("tasks", sizes.tasks)
        .param("workers", sizes.workers)
        .param("rounds", rounds)
        .tollgate("tollgate (submit_many + workers)", ours.per_s(), None)
        .row(
            "tollgate, fairness off (oldest first)",
            Some(ours_unfair.per_s()),
            None,
        )
        .baseline("baseline (raw SQL lifecycle)", theirs.per_s(), None);
    let fair_vs_unfair = ours.per_s() / ours_unfair.per_s().max(f64::MIN_POSITIVE);
    let target = if ctx.backend == super::BackendKind::Postgres {
        2.0
    } else {
        0.5
    };
    report
        .ratio_at_least(target)
        .extra("fairness_on_vs_off", fair_vs_unfair)
        .extra("tollgate_fairness_off_per_s", ours_unfair.per_s())
        .extra("tollgate_submit_s", super::secs(submit_time))
        .extra("tollgate_elapsed_s", super::secs(ours.elapsed))
        .extra("baseline_elapsed_s", super::secs(theirs.elapsed))
        .note(format!(
            "docs/conformance.md#fair-share: fairness on runs at {:.1} % of fairness off (target ≥ 90 %){}",
            100.0 * fair_vs_unfair,
            if fair_vs_unfair >= 0.9 {
                ""
            } else {
                " — MISSED"
            }
        ))
        .note(format!(
            "tollgate: {:.1} s of {:.1} s submitting ({:.0} submissions/s)",
            submit_time.as_secs_f64(),
            ours.elapsed.as_secs_f64(),
            super::measure::per_s(sizes.tasks, submit_time)
        ));
    report.store_profile(&counting.counts().profile());
    Ok(report)
}

/// What one Tollgate burn-down took.
pub(super) struct Timed {
    /// First submit → last submission answered.
    pub(super) submit: Duration,
    /// Workers started → last committed completion.
    pub(super) process: Duration,
    /// First submit → last committed completion.
    pub(super) total: Duration,
}

/// Submits `n` unscoped tasks (spread over `scopes`, effect keys `burn-<tag>-<i>`) through
/// the facade's batch call, then starts `tollgate`'s workers and waits until all `n`
/// completions are committed; `stage` prefixes the progress line.
pub(super) async fn tollgate_burn_down(
    ctx: &Ctx,
    tollgate: &Tollgate,
    counting: &CountingStore,
    scopes: &[ScopeId],
    tag: &str,
    n: u64,
    stage: &str,
) -> anyhow::Result<Timed> {
    ctx.progress.stage(format!("{stage}: submitting {n}"));
    let submissions = (0..n)
        .map(|i| {
            let scope = &scopes[i as usize % scopes.len()];
            unscoped(
                scope,
                &format!("burn-{tag}-{i}"),
                &format!("burn {tag} {i}"),
            )
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let done_before = Counts::get(&counting.counts().completed);
    let start = Instant::now();
    submit_all(tollgate, submissions, &ctx.progress).await?;
    let submitted = Instant::now();
    ctx.progress.stage(format!("{stage}: burning down"));
    let engine = tollgate.start().await?;
    let counts = counting.counts().clone();
    let waited = wait_for(
        &ctx.progress,
        "tollgate burn-down",
        n,
        timeout_for(n),
        || Counts::get(&counts.completed) - done_before,
    )
    .await;
    let end = counts.last_completion();
    engine.shutdown(Duration::from_secs(30)).await;
    waited?;
    let end = end.ok_or_else(|| anyhow::anyhow!("no completion was recorded"))?;
    Ok(Timed {
        submit: submitted - start,
        process: end.saturating_duration_since(submitted),
        total: end - start,
    })
}

/// Generous: a burn-down that stalls fails rather than hangs.
pub(super) fn timeout_for(n: u64) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(n * 20)
}

/// N raw inserts (8 at once), then `workers` loops claiming and completing until all N
/// are done. Elapsed = first insert → last completion.
async fn raw_lifecycle(
    baseline: &Baseline,
    round: u64,
    n: u64,
    workers: u32,
    ctx: &Ctx,
) -> anyhow::Result<Phase> {
    let start = Instant::now();
    let next = Arc::new(AtomicU64::new(0));
    let mut inserters = JoinSet::new();
    let counter = ctx.progress.counter();
    for _ in 0..BASELINE_INSERTERS {
        let (baseline, next, counter) = (baseline.clone(), next.clone(), counter.clone());
        inserters.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= n {
                    return anyhow::Ok(());
                }
                let request = stored_classify(&format!("burn {round} {i}"));
                baseline
                    .raw_insert(
                        "bench",
                        &format!("raw-burn-{round}-{i}"),
                        &request,
                        wall_clock(),
                    )
                    .await?;
                counter.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(joined) = inserters.join_next().await {
        joined??;
    }
    ctx.progress
        .stage(format!("baseline: {workers} raw workers burning down"));
    let done = Arc::new(AtomicU64::new(0));
    let counter = ctx.progress.counter();
    let mut loops = JoinSet::new();
    for w in 0..workers {
        let (baseline, done, counter) = (baseline.clone(), done.clone(), counter.clone());
        loops.spawn(async move {
            let worker = format!("raw-worker-{w}");
            let output = r#"{"confidence":null,"label":"yes"}"#;
            let mut last = None;
            let deadline = Instant::now() + timeout_for(n);
            while done.load(Ordering::SeqCst) < n {
                anyhow::ensure!(Instant::now() < deadline, "baseline burn-down stalled");
                match baseline.raw_claim(&worker, wall_clock()).await? {
                    Some(id) => {
                        baseline.raw_complete(&id, output, wall_clock()).await?;
                        last = Some(Instant::now());
                        done.fetch_add(1, Ordering::SeqCst);
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                    // Rows locked by other loops are skipped: look again soon.
                    None => tokio::time::sleep(Duration::from_millis(1)).await,
                }
            }
            anyhow::Ok(last)
        });
    }
    let mut end = None;
    while let Some(joined) = loops.join_next().await {
        if let Some(last) = joined?? {
            end = Some(end.map_or(last, |e: Instant| e.max(last)));
        }
    }
    let end = end.ok_or_else(|| anyhow::anyhow!("the baseline completed nothing"))?;
    Ok(Phase {
        ops: n,
        elapsed: end - start,
        latencies_us: Vec::new(),
    })
}
