//! `admission-window`: C clients admit into ONE scope whose 24 h window already holds
//! about 1,000 admission records, then into one whose window holds about 1,000,000.
//! docs/conformance.md#constant-admission: one admission must cost the same either way (ratio large / small ≥ 0.8).
//!
//! The records are bulk-loaded with one statement
//! ([`Baseline::seed_admission_window`]), ten steps per source, spread over the last 23
//! hours, with the scope's source sightings and counters brought up to date as
//! admissions would have left them. Half the submissions are about a new source, half
//! about one of the scope's first 100 sources (the same 100 in both scopes, so both
//! grow alike while measured).
//!
//! Order: the small window alone (before the large one exists), then the large one is
//! seeded and the two scopes alternate round by round; the ratio compares the
//! alternating rounds, so noise on the machine hits both.

use super::measure::{Op, Phase, run_timed};
use super::report::ScenarioReport;
use super::{Ctx, Scenario, bench_budget, scoped_metered, wall_clock};
use crate::baseline::WindowSeed;
use std::sync::Arc;
use std::time::Instant;
use tollgate_core::ScopeId;
use tollgate_engine::Tollgate;

/// Seeded records (steps) per source.
const STEPS_PER_SOURCE: u64 = 10;
/// Known sources the submissions return to (the first ones of each scope).
const KNOWN_SOURCES: u64 = 100;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let small = ScopeId::new("window-small")?;
    let large = ScopeId::new("window-large")?;
    let baseline = ctx.baseline();
    let budget = bench_budget();

    ctx.progress.stage(format!(
        "seeding {} admission records (small window)",
        sizes.small_window
    ));
    let seed_small = WindowSeed {
        first: 0,
        count: sizes.small_window,
        steps_per_source: STEPS_PER_SOURCE,
    };
    let started = Instant::now();
    baseline
        .seed_admission_window("bench", small.as_str(), seed_small, &budget, wall_clock())
        .await?;
    let small_seed_s = started.elapsed().as_secs_f64();

    ctx.progress.stage("small window alone");
    let alone = measure(ctx, &tollgate, &small, sizes.small_window, "alone").await?;

    ctx.progress.stage(format!(
        "seeding {} admission records (large window, one statement)",
        sizes.large_window
    ));
    let seed_large = WindowSeed {
        first: 0,
        count: sizes.large_window,
        steps_per_source: STEPS_PER_SOURCE,
    };
    let started = Instant::now();
    baseline
        .seed_admission_window("bench", large.as_str(), seed_large, &budget, wall_clock())
        .await?;
    let large_seed_s = started.elapsed().as_secs_f64();

    let mut small_phase = Phase::default();
    let mut large_phase = Phase::default();
    for round in 0..sizes.rounds {
        let label = format!("round {}/{}", round + 1, sizes.rounds);
        ctx.progress.stage(format!("large window {label}"));
        large_phase.add(
            measure(
                ctx,
                &tollgate,
                &large,
                sizes.large_window,
                &format!("l{round}"),
            )
            .await?,
        );
        ctx.progress.stage(format!("small window {label}"));
        small_phase.add(
            measure(
                ctx,
                &tollgate,
                &small,
                sizes.small_window,
                &format!("s{round}"),
            )
            .await?,
        );
    }
    let small_records = baseline.admission_records("bench", small.as_str()).await?;
    let large_records = baseline.admission_records("bench", large.as_str()).await?;

    let mut report = ctx.report(Scenario::AdmissionWindow);
    report
        .param("clients", sizes.clients as u64)
        .param("small_window", sizes.small_window)
        .param("large_window", sizes.large_window)
        .param("seconds_per_window", sizes.duration.as_secs_f64())
        .param("rounds", sizes.rounds)
        .row(
            "small window, before the large seed",
            Some(alone.per_s()),
            alone.percentiles(),
        )
        .tollgate(
            "large window (tollgate)",
            large_phase.per_s(),
            large_phase.percentiles(),
        )
        .baseline(
            "small window (tollgate)",
            small_phase.per_s(),
            small_phase.percentiles(),
        )
        .ratio_at_least(0.8)
        .extra("small_alone_per_s", alone.per_s())
        .extra(
            "ratio_large_vs_small_before_seed",
            large_phase.per_s() / alone.per_s().max(f64::MIN_POSITIVE),
        )
        .extra("small_window_records_at_end", small_records)
        .extra("large_window_records_at_end", large_records)
        .extra("seed_small_s", small_seed_s)
        .extra("seed_large_s", large_seed_s)
        .note(format!(
            "ratio = large / small window, alternating after the seed (target ≥ 0.8); \
             large / small before the seed = {:.2} (that one also carries what the bulk load \
             did to the whole database)",
            large_phase.per_s() / alone.per_s().max(f64::MIN_POSITIVE)
        ))
        .note(format!(
            "seeded {} records in {large_seed_s:.1} s; at the end the windows held \
             {small_records} and {large_records} records",
            sizes.large_window
        ));
    Ok(report)
}

/// One timed round of admissions into `scope` (its seeded window has `seeded` records).
async fn measure(
    ctx: &Ctx,
    tollgate: &Tollgate,
    scope: &ScopeId,
    seeded: u64,
    tag: &str,
) -> anyhow::Result<Phase> {
    let clients = ctx.sizes.clients;
    let known = (seeded / STEPS_PER_SOURCE).clamp(1, KNOWN_SOURCES);
    let (tg, scope, tag) = (tollgate.clone(), scope.clone(), tag.to_string());
    let op: Op = Arc::new(move |client, seq| {
        let (tg, scope, tag) = (tg.clone(), scope.clone(), tag.clone());
        Box::pin(async move {
            let key = format!("win-{scope}-{tag}-{client}-{seq}");
            let source = if seq % 2 == 0 {
                format!("new-{tag}-{client}-{seq}")
            } else {
                format!("src-{}", (seq / 2 * clients as u64 + client as u64) % known)
            };
            // Under docs/conformance.md#cost-limits's USD and token limits: every admission also reads the
            // scope's spend window, which the seed filled with one reservation per record.
            let submitted = tg
                .submit(scoped_metered(&scope, &source, &key, &key)?)
                .await?;
            anyhow::ensure!(
                submitted.created && !submitted.task.cached(),
                "expected a new admitted task"
            );
            Ok(())
        })
    });
    run_timed(&ctx.progress, clients, ctx.sizes.round_duration(), op).await
}
