//! `admission`: C concurrent clients submit scoped tasks (each a new logical step, so
//! each is admitted) over S scopes, through the facade, with a budget that admits
//! everything.
//!
//! Baseline, same database, same clients and spread: the reference design's admission
//! ([`Baseline::reference_admit`]) — one round trip per statement behind ONE
//! database-wide lock. Between rounds its queued tasks are marked finished (untimed), so
//! its count of active tasks stays as small as in a system whose workers keep up; no
//! worker runs during the timed rounds on either side.

use super::measure::{Op, Phase, run_timed};
use super::report::ScenarioReport;
use super::{Ctx, Scenario, bench_budget, scope_ids, scoped, scoped_metered, wall_clock};
use crate::baseline::{Baseline, ReferenceOutcome};
use std::sync::Arc;

/// Sources per scope the submissions cycle through.
const SOURCES_PER_SCOPE: u64 = 16;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let scopes = Arc::new(scope_ids("adm", sizes.scopes)?);
    let clients = sizes.clients;
    let mut ours = Phase::default();
    let mut metered = Phase::default();
    let mut theirs = Phase::default();
    let mut finished_between = 0;
    for round in 0..sizes.rounds {
        let label = format!("round {}/{}", round + 1, sizes.rounds);

        // Without and with docs/conformance.md#cost-limits's USD and token limits (high enough to admit
        // everything), in alternating order so neither side always runs on the bigger
        // table.
        for metered_side in [round % 2 == 1, round % 2 == 0] {
            let phase = tollgate_phase(ctx, &tollgate, &scopes, round, metered_side).await?;
            if metered_side {
                metered.add(phase);
            } else {
                ours.add(phase);
            }
        }

        ctx.progress.stage(format!(
            "baseline {label}: {clients} clients, reference design"
        ));
        let (baseline, sc) = (ctx.baseline().clone(), scopes.clone());
        let budget = bench_budget();
        let op: Op = Arc::new(move |client, seq| {
            let (baseline, sc) = (baseline.clone(), sc.clone());
            Box::pin(async move {
                let (scope, source) = pick(&sc, clients, client, seq);
                let key = format!("ref-{round}-{client}-{seq}");
                let outcome = baseline
                    .reference_admit(
                        "bench",
                        sc[scope].as_str(),
                        &source,
                        &key,
                        &key,
                        &budget,
                        wall_clock(),
                    )
                    .await?;
                anyhow::ensure!(
                    outcome == ReferenceOutcome::Admitted,
                    "the reference design refused"
                );
                Ok(())
            })
        });
        theirs.add(run_timed(&ctx.progress, clients, sizes.round_duration(), op).await?);
        finished_between += finish(ctx.baseline()).await?;
    }
    let cost_ratio = if ours.per_s() > 0.0 {
        metered.per_s() / ours.per_s()
    } else {
        0.0
    };
    let mut report = ctx.report(Scenario::Admission);
    report
        .param("clients", clients as u64)
        .param("scopes", sizes.scopes as u64)
        .param("seconds_per_side", sizes.duration.as_secs_f64())
        .param("rounds", sizes.rounds)
        .tollgate(
            "tollgate (per-scope locks)",
            ours.per_s(),
            ours.percentiles(),
        )
        .baseline(
            "baseline (reference, one global lock)",
            theirs.per_s(),
            theirs.percentiles(),
        )
        .ratio_at_least(3.0)
        .row(
            "tollgate under USD + token limits (docs/conformance.md#cost-limits)",
            Some(metered.per_s()),
            metered.percentiles(),
        )
        .extra("tollgate_cost_limits_per_s", metered.per_s())
        .extra("cost_limits_ratio", cost_ratio)
        .note(format!(
            "with USD and token limits / without, same run: {cost_ratio:.2} (target ≥ 0.9: {})",
            if cost_ratio >= 0.9 { "met" } else { "NOT met" }
        ))
        .extra("tollgate_admitted", ours.ops)
        .extra("baseline_admitted", theirs.ops)
        .note(format!(
            "admitted: tollgate {}, baseline {} ({} baseline tasks marked finished between rounds)",
            ours.ops, theirs.ops, finished_between
        ));
    report.store_profile(&counting.counts().profile());
    Ok(report)
}

/// One timed round of Tollgate admissions, under the plain policy or (`metered`) under
/// the one with USD and token limits.
async fn tollgate_phase(
    ctx: &Ctx,
    tollgate: &tollgate_engine::Tollgate,
    scopes: &Arc<Vec<tollgate_core::ScopeId>>,
    round: u32,
    metered: bool,
) -> anyhow::Result<Phase> {
    let clients = ctx.sizes.clients;
    let label = format!("round {}/{}", round + 1, ctx.sizes.rounds);
    let side = if metered {
        "under USD and token limits"
    } else {
        "admitting"
    };
    ctx.progress
        .stage(format!("tollgate {label}: {clients} clients {side}"));
    let (tg, sc) = (tollgate.clone(), scopes.clone());
    let op: Op = Arc::new(move |client, seq| {
        let (tg, sc) = (tg.clone(), sc.clone());
        Box::pin(async move {
            let (scope, source) = pick(&sc, clients, client, seq);
            let key = format!("adm-{round}-{metered}-{client}-{seq}");
            let submission = if metered {
                scoped_metered(&sc[scope], &source, &key, &key)?
            } else {
                scoped(&sc[scope], &source, &key, &key)?
            };
            let submitted = tg.submit(submission).await?;
            anyhow::ensure!(
                submitted.created && !submitted.task.cached(),
                "expected a new admitted task"
            );
            Ok(())
        })
    });
    run_timed(&ctx.progress, clients, ctx.sizes.round_duration(), op).await
}

/// The scope and source of a client's `seq`-th submission: clients walk the scopes
/// interleaved, so all of them are busy at once; sources cycle within a scope.
fn pick(
    scopes: &[tollgate_core::ScopeId],
    clients: usize,
    client: usize,
    seq: u64,
) -> (usize, String) {
    let slot = seq * clients as u64 + client as u64;
    let scope = (slot % scopes.len() as u64) as usize;
    let source = format!("doc-{}", (slot / scopes.len() as u64) % SOURCES_PER_SCOPE);
    (scope, source)
}

/// Marks the reference design's queued tasks finished (untimed).
async fn finish(baseline: &Baseline) -> anyhow::Result<u64> {
    Ok(baseline.finish_active().await?)
}
