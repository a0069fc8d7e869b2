//! `steady-state`: does Tollgate stay as fast after a long life as on a fresh database?
//! The burn-down rate of N no-op tasks (the burn-down scenario's own code: `submit_many`,
//! then W workers with the instant provider) on the fresh database, then H more tasks
//! (default 100,000) go through — submitted, run, completed, in burn-downs of at most
//! 10,000 — and the same burn-down of N is measured again. Ratio = after ÷ fresh, target
//! ≥ 0.8.
//!
//! PostgreSQL runs with autovacuum off on every table of the benchmark database
//! (`autovacuum_enabled = false`; the server-wide setting cannot be changed per
//! database), so what keeps the tables lean is only what the service does itself: its
//! keep-lean pass after every sweep (docs/engine.md, "Dead rows"). The report gives the
//! hot tables' dead rows and vacuums before and after the history, and the database's
//! size; on SQLite the file's size and free pages.

use super::burn_down::{SUBMIT_SCOPES, tollgate_burn_down};
use super::report::ScenarioReport;
use super::{Ctx, Scenario, scope_ids};
use crate::baseline::TableHealth;
use serde_json::json;

/// Largest burn-down of the history (its submissions are held in memory at once).
const HISTORY_CHUNK: u64 = 10_000;

/// The target: after the history, at least this share of the fresh rate.
const TARGET: f64 = 0.8;

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let (n, history) = (sizes.tasks, sizes.history);
    ctx.progress.stage("turning autovacuum off");
    let autovacuum_off = ctx.baseline().autovacuum_off().await?;
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let scopes = scope_ids("steady", SUBMIT_SCOPES)?;
    let workers = sizes.workers;

    let fresh = tollgate_burn_down(
        ctx,
        &tollgate,
        &counting,
        &scopes,
        "fresh",
        n,
        &format!("fresh database ({workers} workers)"),
    )
    .await?;
    let before = ctx.baseline().table_health().await?;
    let mut done = 0;
    let mut chunk = 0;
    while done < history {
        let k = HISTORY_CHUNK.min(history - done);
        tollgate_burn_down(
            ctx,
            &tollgate,
            &counting,
            &scopes,
            &format!("history-{chunk}"),
            k,
            &format!("history {done}/{history}"),
        )
        .await?;
        done += k;
        chunk += 1;
    }
    // Let the statistics views catch up with the last transactions (PostgreSQL).
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let aged = ctx.baseline().table_health().await?;
    let after = tollgate_burn_down(
        ctx,
        &tollgate,
        &counting,
        &scopes,
        "after",
        n,
        &format!("after {history} tasks ({workers} workers)"),
    )
    .await?;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let end = ctx.baseline().table_health().await?;

    let rate = |t: &super::burn_down::Timed| super::measure::per_s(n, t.total);
    let mut report = ctx.report(Scenario::SteadyState);
    report
        .param("tasks", n)
        .param("history", history)
        .param("workers", workers)
        .tollgate(
            &format!("burn-down after {} tasks", n + history),
            rate(&after),
            None,
        )
        .baseline("burn-down on the fresh database", rate(&fresh), None)
        .ratio_at_least(TARGET)
        .extra("autovacuum_off_tables", autovacuum_off)
        .extra("fresh_elapsed_s", fresh.total.as_secs_f64())
        .extra("after_elapsed_s", after.total.as_secs_f64())
        .extra("health_after_fresh", health_json(&before))
        .extra("health_after_history", health_json(&aged))
        .extra("health_at_end", health_json(&end));
    if ctx.backend == super::BackendKind::Postgres {
        report.note(format!(
            "autovacuum off on {autovacuum_off} tables ({} autovacuums ran); hot tables' dead \
             rows: {} after the fresh run, {} after the history, {} at the end; the store's \
             own vacuums: {}",
            end.autovacuums,
            before.dead_rows,
            aged.dead_rows,
            end.dead_rows,
            end.vacuums - end.autovacuums
        ));
    } else {
        report.note(format!(
            "database file {:.1} MB after the fresh run, {:.1} MB after the history \
             ({} free pages), {:.1} MB at the end",
            mb(before.bytes),
            mb(aged.bytes),
            aged.free_pages,
            mb(end.bytes)
        ));
    }
    report.store_profile(&counting.counts().profile());
    Ok(report)
}

fn mb(bytes: i64) -> f64 {
    bytes as f64 / 1_048_576.0
}

fn health_json(h: &TableHealth) -> serde_json::Value {
    json!({
        "dead_rows": h.dead_rows,
        "vacuums": h.vacuums,
        "autovacuums": h.autovacuums,
        "bytes": h.bytes,
        "free_pages": h.free_pages,
        "tables": h.tables,
    })
}
