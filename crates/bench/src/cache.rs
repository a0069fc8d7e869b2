//! `cache`: C concurrent clients submit scoped tasks that are all cache hits (docs/conformance.md#create-cache
//! step 4: the same source revision, request and model as a task that succeeded), each
//! under a new effect key, through the facade.
//!
//! Set-up (untimed): one succeeded task per entry, run by the workers with the instant
//! provider. Baseline, same database: an indexed lookup of the newest success plus the
//! insert of the copy, in one transaction ([`Baseline::raw_cache_hit`]).

use super::counting::Counts;
use super::measure::{Op, Phase, run_timed};
use super::report::ScenarioReport;
use super::{Ctx, Scenario, scope_ids, scoped, submit_all, wait_for, wall_clock};
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::ScopeId;

/// Cached entries per scope.
const ENTRIES_PER_SCOPE: usize = 4;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let clients = sizes.clients;
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let scopes = Arc::new(scope_ids("cache", sizes.scopes)?);
    let entries = sizes.scopes * ENTRIES_PER_SCOPE;

    ctx.progress
        .stage(format!("seeding {entries} cached results"));
    let seeds = (0..entries)
        .map(|k| {
            let (scope, source, text) = entry(&scopes, k);
            scoped(scope, &source, &format!("seed-{k}"), &text)
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    submit_all(&tollgate, seeds, &ctx.progress).await?;
    let engine = tollgate.start().await?;
    let counts = counting.counts().clone();
    let seeded = wait_for(
        &ctx.progress,
        "seeding the cache",
        entries as u64,
        Duration::from_secs(300),
        || Counts::get(&counts.completed),
    )
    .await;
    engine.shutdown(Duration::from_secs(30)).await;
    seeded?;
    for k in 0..entries {
        let (scope, _, _) = entry(&scopes, k);
        ctx.baseline()
            .seed_cached("bench", scope.as_str(), &raw_key(k), wall_clock())
            .await?;
    }

    let mut ours = Phase::default();
    let mut theirs = Phase::default();
    for round in 0..sizes.rounds {
        let label = format!("round {}/{}", round + 1, sizes.rounds);
        ctx.progress
            .stage(format!("tollgate {label}: {clients} clients, cache hits"));
        let (tg, sc) = (tollgate.clone(), scopes.clone());
        let op: Op = Arc::new(move |client, seq| {
            let (tg, sc) = (tg.clone(), sc.clone());
            Box::pin(async move {
                let k = pick(entries, clients, client, seq);
                let (scope, source, text) = entry(&sc, k);
                let key = format!("hit-{round}-{client}-{seq}");
                let submitted = tg.submit(scoped(scope, &source, &key, &text)?).await?;
                anyhow::ensure!(
                    submitted.created && submitted.task.cached(),
                    "expected a cache hit"
                );
                Ok(())
            })
        });
        ours.add(run_timed(&ctx.progress, clients, sizes.round_duration(), op).await?);

        ctx.progress.stage(format!(
            "baseline {label}: {clients} clients, raw lookup + insert"
        ));
        let (baseline, sc) = (ctx.baseline().clone(), scopes.clone());
        let op: Op = Arc::new(move |client, seq| {
            let (baseline, sc) = (baseline.clone(), sc.clone());
            Box::pin(async move {
                let k = pick(entries, clients, client, seq);
                let (scope, _, _) = entry(&sc, k);
                let key = format!("raw-hit-{round}-{client}-{seq}");
                let hit = baseline
                    .raw_cache_hit("bench", scope.as_str(), &raw_key(k), &key, wall_clock())
                    .await?;
                anyhow::ensure!(hit, "expected a baseline cache hit");
                Ok(())
            })
        });
        theirs.add(run_timed(&ctx.progress, clients, sizes.round_duration(), op).await?);
    }
    let mut report = ctx.report(Scenario::Cache);
    report
        .param("clients", clients as u64)
        .param("scopes", sizes.scopes as u64)
        .param("entries", entries as u64)
        .param("seconds_per_side", sizes.duration.as_secs_f64())
        .param("rounds", sizes.rounds)
        .tollgate(
            "tollgate (submit, cache hit)",
            ours.per_s(),
            ours.percentiles(),
        )
        .baseline(
            "baseline (raw lookup + insert)",
            theirs.per_s(),
            theirs.percentiles(),
        )
        .ratio_at_least(0.8);
    report.store_profile(&counting.counts().profile());
    Ok(report)
}

/// Entry `k`: its scope, source and request text.
fn entry(scopes: &[ScopeId], k: usize) -> (&ScopeId, String, String) {
    let scope = &scopes[k % scopes.len()];
    (scope, format!("doc-{k}"), format!("cached request {k}"))
}

/// The baseline's cache key of entry `k`.
fn raw_key(k: usize) -> String {
    format!("raw-cache-{k}")
}

/// Which entry a client's `seq`-th hit asks for: clients walk the entries interleaved.
fn pick(entries: usize, clients: usize, client: usize, seq: u64) -> usize {
    ((seq * clients as u64 + client as u64) % entries as u64) as usize
}
