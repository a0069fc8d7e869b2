//! `latency`: one client submits a task and waits for its result, again and again, with
//! the workers running and the instant provider: submit → notification → claim →
//! provider → complete → notification → result. Two Tollgate sides on the same instance:
//! through the facade (`submit`, then `wait`), and over HTTP — one `POST
//! /v1/tasks?wait=30s` per task from a keep-alive HTTP/1.1 client to the product's server
//! started in-process ([`HttpServer`]), the answer checked to be `succeeded`.
//!
//! Baseline, same database: the raw SQL lifecycle of one task done back to back by one
//! client (insert, claim, complete; one transaction each) — the floor of any design that
//! keeps the queue in the database, with no hand-over between processes at all.
//!
//! The three sides take turns round by round, each round starting with the next one.
//! Target (HTTP only): p50 ≤ 2× and p99 ≤ 3× the raw lifecycle's in the same run; the
//! facade's ratios are reported beside it.

use super::http::{HttpServer, created_task};
use super::measure::{Op, Percentiles, Phase, run_timed};
use super::report::ScenarioReport;
use super::{Ctx, Scenario, bench_app, stored_classify, submit_body, unscoped, wall_clock};
use anyhow::Context;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{ScopeId, TaskStatus};
use tollgate_engine::Tollgate;

/// How long one task may take before the scenario fails.
const WAIT: Duration = Duration::from_secs(30);

/// The HTTP side's target: p50 at most this many times the raw lifecycle's p50 …
const HTTP_P50_TARGET: f64 = 2.0;
/// … and p99 at most this many times the raw lifecycle's p99.
const HTTP_P99_TARGET: f64 = 3.0;

/// The three sides of a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The facade: `submit`, then `wait`.
    Facade,
    /// `POST /v1/tasks?wait=` to the in-process server.
    Http,
    /// The raw SQL lifecycle.
    Raw,
}

/// What each side measured, over every round.
#[derive(Debug, Default)]
struct Sides {
    facade: Phase,
    http: Phase,
    raw: Phase,
}

/// A side's p50 and p99 over the raw lifecycle's.
#[derive(Debug, Clone, Copy, PartialEq)]
struct VsRaw {
    p50: f64,
    p99: f64,
}

impl VsRaw {
    fn of(ours: &Percentiles, raw: &Percentiles) -> VsRaw {
        let ratio = |t: f64, b: f64| if b > 0.0 { t / b } else { f64::INFINITY };
        VsRaw {
            p50: ratio(ours.p50_ms, raw.p50_ms),
            p99: ratio(ours.p99_ms, raw.p99_ms),
        }
    }

    /// Whether the HTTP target holds: p50 ≤ 2× and p99 ≤ 3×.
    fn http_target_met(self) -> bool {
        self.p50 <= HTTP_P50_TARGET && self.p99 <= HTTP_P99_TARGET
    }
}

/// The order of the sides in round `round`: each round starts with the next side.
fn order(round: u32) -> [Side; 3] {
    let mut sides = [Side::Facade, Side::Http, Side::Raw];
    let len = sides.len();
    sides.rotate_left(round as usize % len);
    sides
}

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let counting = ctx.counting_store();
    let tollgate = ctx.tollgate(&counting, sizes.workers, None)?;
    let engine = tollgate.start().await?;
    let measured = match HttpServer::start(&tollgate).await {
        Ok(server) => {
            let measured = rounds(ctx, &tollgate, &server).await;
            let stopped = server.shutdown().await;
            measured.and_then(|sides| stopped.map(|()| sides))
        }
        Err(e) => Err(e),
    };
    engine.shutdown(Duration::from_secs(30)).await;
    let sides = measured?;

    let percentiles = |phase: &Phase, side: &str| {
        phase
            .percentiles()
            .with_context(|| format!("the {side} side measured no task"))
    };
    let facade = percentiles(&sides.facade, "facade")?;
    let http = percentiles(&sides.http, "HTTP")?;
    let raw = percentiles(&sides.raw, "raw")?;
    let facade_vs_raw = VsRaw::of(&facade, &raw);
    let http_vs_raw = VsRaw::of(&http, &raw);
    let http_met = http_vs_raw.http_target_met();
    let mut report = ctx.report(Scenario::Latency);
    report
        .param("clients", 1)
        .param("workers", sizes.workers)
        .param("seconds_per_side", sizes.duration.as_secs_f64())
        .param("rounds", sizes.rounds)
        .tollgate(
            "tollgate (submit → result)",
            sides.facade.per_s(),
            Some(facade),
        )
        .row(
            "tollgate over HTTP (POST /v1/tasks?wait=)",
            Some(sides.http.per_s()),
            Some(http),
        )
        .baseline(
            "baseline (raw insert, claim, complete)",
            sides.raw.per_s(),
            Some(raw),
        )
        .ratio_reported()
        .extra("http_per_s", sides.http.per_s())
        .extra("http_latency_ms", serde_json::to_value(http)?)
        .extra("http_p50_vs_raw", http_vs_raw.p50)
        .extra("http_p99_vs_raw", http_vs_raw.p99)
        .extra("http_latency_target_met", http_met)
        .extra("facade_p50_vs_raw", facade_vs_raw.p50)
        .extra("facade_p99_vs_raw", facade_vs_raw.p99)
        .note(format!(
            "over HTTP: p50 {:.2}×, p99 {:.2}× the raw lifecycle (target p50 ≤ {HTTP_P50_TARGET}×, \
             p99 ≤ {HTTP_P99_TARGET}×: {})",
            http_vs_raw.p50,
            http_vs_raw.p99,
            if http_met { "met" } else { "MISSED" }
        ))
        .note(format!(
            "facade: p50 {:.2}×, p99 {:.2}× the raw lifecycle (no target)",
            facade_vs_raw.p50, facade_vs_raw.p99
        ))
        .note(
            "rates are one client's, sequential; the store time below is both tollgate \
             sides' (one instance)",
        );
    report.store_profile(&counting.counts().profile());
    Ok(report)
}

/// The alternating rounds of the three sides.
async fn rounds(ctx: &Ctx, tollgate: &Tollgate, server: &HttpServer) -> anyhow::Result<Sides> {
    let sizes = &ctx.sizes;
    anyhow::ensure!(
        WAIT <= server.client().max_wait(),
        "the server cuts ?wait= to {:?}, shorter than the {WAIT:?} a task may take",
        server.client().max_wait()
    );
    let scope = ScopeId::new("latency")?;
    let app = bench_app()?;
    let client = server.client().clone();
    let mut sides = Sides::default();
    for round in 0..sizes.rounds {
        let label = format!("round {}/{}", round + 1, sizes.rounds);
        for side in order(round) {
            let op: Op = match side {
                Side::Facade => {
                    ctx.progress
                        .stage(format!("tollgate {label}: submit → result"));
                    let (tg, scope, app) = (tollgate.clone(), scope.clone(), app.clone());
                    Arc::new(move |_, seq| {
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
                    })
                }
                Side::Http => {
                    ctx.progress.stage(format!(
                        "tollgate over HTTP {label}: POST /v1/tasks?wait= → result"
                    ));
                    let (client, scope) = (client.clone(), scope.clone());
                    Arc::new(move |_, seq| {
                        let (client, scope) = (client.clone(), scope.clone());
                        Box::pin(async move {
                            let key = format!("http-lat-{round}-{seq}");
                            let body = serde_json::to_vec(&submit_body(&scope, &key, &key))?;
                            let path = format!("/v1/tasks?wait={}s", WAIT.as_secs());
                            let (status, answer) = client
                                .post(&path, body, WAIT + Duration::from_secs(10))
                                .await?;
                            created_task(status, &answer, "succeeded")?;
                            Ok(())
                        })
                    })
                }
                Side::Raw => {
                    ctx.progress
                        .stage(format!("baseline {label}: raw insert, claim, complete"));
                    let baseline = ctx.baseline().clone();
                    Arc::new(move |_, seq| {
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
                                .raw_complete(
                                    &id,
                                    r#"{"confidence":null,"label":"yes"}"#,
                                    wall_clock(),
                                )
                                .await?;
                            Ok(())
                        })
                    })
                }
            };
            let phase = run_timed(&ctx.progress, 1, sizes.round_duration(), op).await?;
            match side {
                Side::Facade => sides.facade.add(phase),
                Side::Http => sides.http.add(phase),
                Side::Raw => sides.raw.add(phase),
            }
        }
    }
    Ok(sides)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(p50_ms: f64, p99_ms: f64) -> Percentiles {
        Percentiles {
            samples: 1,
            mean_ms: p50_ms,
            p50_ms,
            p90_ms: p99_ms,
            p99_ms,
            max_ms: p99_ms,
        }
    }

    #[test]
    fn the_http_target_is_p50_2x_and_p99_3x_the_raw_lifecycle() {
        let raw = at(1.0, 4.0);
        let vs = VsRaw::of(&at(2.0, 12.0), &raw);
        assert_eq!(vs, VsRaw { p50: 2.0, p99: 3.0 });
        assert!(vs.http_target_met());
        assert!(!VsRaw::of(&at(2.1, 4.0), &raw).http_target_met());
        assert!(!VsRaw::of(&at(1.0, 12.1), &raw).http_target_met());
        assert!(!VsRaw::of(&at(1.0, 1.0), &at(0.0, 0.0)).http_target_met());
    }

    #[test]
    fn every_side_leads_a_round_in_turn() {
        assert_eq!(order(0), [Side::Facade, Side::Http, Side::Raw]);
        assert_eq!(order(1), [Side::Http, Side::Raw, Side::Facade]);
        assert_eq!(order(2), [Side::Raw, Side::Facade, Side::Http]);
        assert_eq!(order(3), order(0));
    }
}
