//! `heartbeat`: R running tasks held by W worker pools (W processes' worth) for T
//! seconds, for each R; the database writes the heartbeats cost, counted at the store
//! (every `Store::heartbeat` call is one write transaction). docs/conformance.md#batched-heartbeats: one write per
//! worker per interval, not per task — so writes per interval ≤ W for every R.
//!
//! The tasks are submitted through a separate engine that runs no workers; the W pools
//! (each `ceil(R / W)` executions, provider answers held until the end) claim them by
//! polling, as replicas that did not hear the submission would. Counting starts once all
//! R are running.

use super::counting::Counts;
use super::measure::{Percentiles, per_s};
use super::report::ScenarioReport;
use super::{Ctx, HoldProvider, Scenario, hold_model, submit_all, unscoped, wait_for};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tollgate_core::ScopeId;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let mut running: Vec<u64> = sizes.running.clone();
    running.sort_unstable();
    running.dedup();
    let pools = sizes.heartbeat_workers;
    let interval = sizes.heartbeat_interval;
    let mut report = ctx.report(Scenario::Heartbeat);
    report
        .param("running", json!(running))
        .param("workers", pools)
        .param("hold_s", sizes.hold.as_secs_f64())
        .param("heartbeat_interval_s", interval.as_secs_f64());
    let mut all_met = true;
    let mut per_running = Vec::new();
    for (i, &r) in running.iter().enumerate() {
        let m = hold_and_count(ctx, r).await?;
        let met = m.writes_per_interval <= f64::from(pools);
        all_met &= met;
        let label = format!(
            "R={r}: {:.2} heartbeat writes/interval ({:.2} all writes), {:.0} ids/write",
            m.writes_per_interval,
            m.all_writes as f64 / m.intervals,
            m.ids_per_write
        );
        if i + 1 == running.len() {
            report.tollgate(&label, m.writes_per_s, m.call_latency);
        } else {
            report.row(&label, Some(m.writes_per_s), m.call_latency);
        }
        per_running.push(json!({
            "running": r,
            "workers": pools,
            "writes": m.writes,
            "all_writes": m.all_writes,
            "all_writes_per_interval": m.all_writes as f64 / m.intervals,
            "intervals": m.intervals,
            "writes_per_interval": m.writes_per_interval,
            "writes_per_s": m.writes_per_s,
            "ids_per_write": m.ids_per_write,
            "held_at_end": m.held_at_end,
            "per_task_design_writes_per_s": r as f64 / interval.as_secs_f64(),
            "heartbeat_call_ms": m.call_latency,
            "target_met": met,
        }));
    }
    report
        .target(
            format!("writes per interval ≤ W = {pools} for every R"),
            all_met,
        )
        .extra("per_running", json!(per_running))
        .note(format!(
            "rates are heartbeat writes per second (latency columns: one heartbeat call); \
             one write per task would be R / {:.1} s; all writes = every store call that \
             may write, made by the {pools} pools while holding (heartbeats, sweeps, polls)",
            interval.as_secs_f64()
        ));
    Ok(report)
}

/// What one R measured.
struct Measured {
    writes: u64,
    /// Every write call the engines made meanwhile (heartbeats, sweeps, claim polls).
    all_writes: u64,
    intervals: f64,
    writes_per_interval: f64,
    writes_per_s: f64,
    ids_per_write: f64,
    held_at_end: usize,
    call_latency: Option<Percentiles>,
}

async fn hold_and_count(ctx: &Ctx, r: u64) -> anyhow::Result<Measured> {
    let sizes = &ctx.sizes;
    let pools = sizes.heartbeat_workers;
    let per_pool = r.div_ceil(u64::from(pools)) as u32;
    let hold = Arc::new(HoldProvider::new());
    let counting = ctx.counting_store();
    let counts = counting.counts().clone();
    let submitter = ctx.tollgate(&counting, 1, Some(hold.clone()))?;
    let mut handles = Vec::new();
    for _ in 0..pools {
        let pool = ctx.tollgate(&counting, per_pool, Some(hold.clone()))?;
        handles.push(pool.start().await?);
    }
    let result = async {
        ctx.progress.stage(format!("R={r}: submitting"));
        let scope = ScopeId::new(format!("heartbeat-{r}"))?;
        let model = hold_model()?;
        let submissions = (0..r)
            .map(|i| {
                let key = format!("hb-{r}-{i}");
                Ok(unscoped(&scope, &key, &key)?.with_model(model.clone()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        submit_all(&submitter, submissions, &ctx.progress).await?;
        ctx.progress.stage(format!("R={r}: {pools} pools claiming"));
        wait_for(
            &ctx.progress,
            "claiming the held tasks",
            r,
            Duration::from_secs(600),
            || Counts::get(&counts.claimed),
        )
        .await?;

        ctx.progress.stage(format!(
            "R={r}: holding for {:.0} s, counting heartbeat writes",
            sizes.hold.as_secs_f64()
        ));
        let calls_before = Counts::get(&counts.heartbeat_calls);
        let writes_before = Counts::get(&counts.writes);
        let ids_before = Counts::get(&counts.heartbeat_ids);
        counts.take_heartbeat_latencies();
        let started = Instant::now();
        tokio::time::sleep(sizes.hold).await;
        let elapsed = started.elapsed();
        let writes = Counts::get(&counts.heartbeat_calls) - calls_before;
        let all_writes = Counts::get(&counts.writes) - writes_before;
        let ids = Counts::get(&counts.heartbeat_ids) - ids_before;
        let latencies = counts.take_heartbeat_latencies();
        let held_at_end: usize = handles.iter().map(|h| h.in_flight().len()).sum();
        anyhow::ensure!(
            held_at_end as u64 == r,
            "only {held_at_end} of {r} tasks were still running at the end of the hold"
        );
        let intervals = elapsed.as_secs_f64() / sizes.heartbeat_interval.as_secs_f64();
        Ok(Measured {
            writes,
            all_writes,
            intervals,
            writes_per_interval: writes as f64 / intervals,
            writes_per_s: per_s(writes, elapsed),
            ids_per_write: if writes > 0 {
                ids as f64 / writes as f64
            } else {
                0.0
            },
            held_at_end,
            call_latency: Percentiles::of(&latencies),
        })
    }
    .await;

    // Let every held answer go and let the pools finish the tasks.
    ctx.progress
        .stage(format!("R={r}: finishing the held tasks"));
    hold.release();
    let finished = if result.is_ok() {
        wait_for(
            &ctx.progress,
            "finishing the held tasks",
            r,
            Duration::from_secs(600),
            || Counts::get(&counts.completed),
        )
        .await
    } else {
        Ok(())
    };
    for handle in handles {
        handle.shutdown(Duration::from_secs(30)).await;
    }
    let measured = result?;
    finished?;
    Ok(measured)
}
