//! `door`: Tollgate as an OpenAI-compatible gateway. A fake upstream answers chat
//! completions at once ([`FakeUpstream`]); Tollgate's door (`POST
//! /openai/v1/chat/completions`, the product's own server in-process, [`HttpServer`])
//! runs every call as a task whose model is that upstream. The load is in-process too:
//! keep-alive HTTP/1.1 clients sending unique bodies, each with its own
//! `Idempotency-Key`, a scope (`X-Tollgate-Scope`) and the metered budget policy
//! (`X-Tollgate-Budget`: USD and token limits that admit everything, so every call is
//! checked and reserved as a gateway user's would be).
//!
//! Measured, the door and the direct call to the upstream (the same body, the same
//! client settings) taking turns round by round:
//! - **added latency at a fixed rate**: [`RATE`] calls a second, an open loop
//!   ([`run_at_rate`]); added p50 / p99 = the door's minus the direct call's;
//! - **max calls a second** with [`CONNECTIONS`] connections, each sending its next call
//!   when the last one answered;
//!
//! each for one scope (every call in the same scope: the same scope's admissions must not
//! queue on one lock) and for [`SCOPES`] scopes (calls spread round-robin).
//!
//! With `--gateway portkey`, a peer gateway ([`RunningPeer`], a child process over the same
//! upstream) is a fourth side, and the door's figures are also given as ratios to its
//! (issue 32's targets: added p50 ≤ 2×, added p99 ≤ 3×, max calls/s ≥ 0.8× the peer's).

use super::door_peer::RunningPeer;
use super::http::HttpServer;
use super::measure::{Op, Percentiles, Phase, run_timed};
use super::report::ScenarioReport;
use super::upstream::{Call, FakeUpstream, run_at_rate};
use super::{BENCH_METERED, Ctx, HOLD_PROVIDER, HoldProvider, Scenario, engine_config};
use anyhow::Context;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tollgate_engine::Tollgate;
use tollgate_engine::config::{ModelConfig, ModelPrices, ProviderConfig};

/// Calls a second of the latency phases.
const RATE: u32 = 50;
/// Connections of the throughput phases.
const CONNECTIONS: usize = 32;
/// Scopes the calls spread over in the many-scopes mode.
const SCOPES: usize = 64;
/// The upstream's provider name in the engine's configuration.
const UPSTREAM_PROVIDER: &str = "upstream";
/// The door's model id (the upstream's model).
const DOOR_MODEL: &str = "door";
/// How long one call may take before the scenario fails.
const CALL_TIMEOUT: Duration = Duration::from_secs(60);

/// Who answers a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// The door, every call in one scope.
    OneScope,
    /// The door, calls over [`SCOPES`] scopes.
    ManyScopes,
    /// The fake upstream itself.
    Direct,
    /// The peer gateway (`--gateway`) over the fake upstream.
    Peer,
}

/// Added latency ≤ this × the peer's, at the fixed rate (issue 32).
const P50_TARGET: f64 = 2.0;
/// Added p99 ≤ this × the peer's.
const P99_TARGET: f64 = 3.0;
/// Max calls a second ≥ this × the peer's.
const MAX_TARGET: f64 = 0.8;

impl Side {
    const ALL: [Side; 4] = [Side::OneScope, Side::ManyScopes, Side::Direct, Side::Peer];

    fn label(self) -> &'static str {
        match self {
            Side::OneScope => "door, 1 scope",
            Side::ManyScopes => "door, 64 scopes",
            Side::Direct => "upstream direct",
            Side::Peer => "peer gateway",
        }
    }

    fn scopes(self) -> usize {
        match self {
            Side::ManyScopes => SCOPES,
            _ => 1,
        }
    }
}

/// What one side measured: at the fixed rate, and at full speed.
#[derive(Debug, Default)]
struct Measured {
    at_rate: Phase,
    max: Phase,
}

/// The load's view of both servers.
#[derive(Clone)]
struct Target {
    client: reqwest::Client,
    door: String,
    key: String,
    upstream: String,
    /// Makes every run's idempotency keys new.
    run: String,
    /// The peer gateway, when measured.
    peer: Option<Arc<RunningPeer>>,
}

impl Target {
    /// One call of `side`, the `seq`-th of phase `phase`: sent, answered 200 with a chat
    /// completion.
    fn call(&self, side: Side, phase: &str, seq: u64) -> BoxCall {
        let this = self.clone();
        let key = format!("{}-{}-{phase}-{seq}", this.run, side as u8);
        let scope = format!("door-{}", seq % side.scopes() as u64);
        Box::pin(async move {
            let body = json!({
                "model": DOOR_MODEL,
                "messages": [{"role": "user", "content": format!("say ok ({key})")}],
                "max_tokens": 16,
            });
            let request = match side {
                Side::Direct => this
                    .client
                    .post(format!("{}/chat/completions", this.upstream)),
                Side::Peer => match &this.peer {
                    Some(peer) => peer.request(&this.client),
                    None => anyhow::bail!("no peer gateway is running"),
                },
                _ => this
                    .client
                    .post(format!("{}/openai/v1/chat/completions", this.door))
                    .bearer_auth(&this.key)
                    .header("Idempotency-Key", &key)
                    .header("X-Tollgate-Scope", &scope)
                    .header("X-Tollgate-Budget", BENCH_METERED),
            };
            let response = request
                .json(&body)
                .timeout(CALL_TIMEOUT)
                .send()
                .await
                .with_context(|| format!("{}: the call failed", side.label()))?;
            let status = response.status();
            let answer = response.bytes().await?;
            check_completion(status, &answer).with_context(|| side.label())
        })
    }
}

type BoxCall = futures::future::BoxFuture<'static, anyhow::Result<()>>;

/// A call's answer must be 200 with a chat completion.
fn check_completion(status: reqwest::StatusCode, answer: &[u8]) -> anyhow::Result<()> {
    let text = || {
        String::from_utf8_lossy(answer)
            .chars()
            .take(400)
            .collect::<String>()
    };
    anyhow::ensure!(
        status == reqwest::StatusCode::OK,
        "answered {status}: {}",
        text()
    );
    let value: Value = serde_json::from_slice(answer).with_context(text)?;
    anyhow::ensure!(
        value.get("object").and_then(Value::as_str) == Some("chat.completion"),
        "answered no chat completion: {}",
        text()
    );
    Ok(())
}

/// The order of the sides in round `round`: each round starts with the next one. The
/// peer gateway's side only when `peer`.
fn order(round: u32, peer: bool) -> Vec<Side> {
    let mut sides: Vec<Side> = Side::ALL
        .into_iter()
        .filter(|s| peer || *s != Side::Peer)
        .collect();
    let len = sides.len();
    sides.rotate_left(round as usize % len);
    sides
}

pub(super) async fn run(ctx: &Ctx) -> anyhow::Result<ScenarioReport> {
    let upstream = FakeUpstream::start().await?;
    let measured = match RunningPeer::start(&ctx.door_peer, upstream.base_url()).await {
        Ok(peer) => {
            let peer = peer.map(Arc::new);
            let name = peer.as_ref().map(|p| p.name());
            with_upstream(ctx, &upstream, peer)
                .await
                .map(|(sides, profile)| (sides, profile, name))
        }
        Err(e) => Err(e),
    };
    let stopped = upstream.shutdown().await;
    let (sides, profile, peer) = measured?;
    stopped?;
    report(ctx, &sides, &profile, peer)
}

type Profile = Vec<(&'static str, u64, Duration)>;

/// The engine over the upstream, its server, and the rounds.
async fn with_upstream(
    ctx: &Ctx,
    upstream: &FakeUpstream,
    peer: Option<Arc<RunningPeer>>,
) -> anyhow::Result<([Measured; 4], Profile)> {
    let counting = ctx.counting_store();
    let mut config = engine_config(ctx.sizes.peer_workers, &ctx.sizes);
    let mut provider = ProviderConfig::openai(upstream.base_url());
    provider.max_retries = 0;
    config
        .providers
        .insert(UPSTREAM_PROVIDER.to_string(), provider);
    config.models.insert(
        DOOR_MODEL.to_string(),
        ModelConfig {
            provider: UPSTREAM_PROVIDER.to_string(),
            model: "fake-model".to_string(),
            prices: Some(ModelPrices {
                input_per_million: 0.15,
                output_per_million: 0.60,
                cached_input_per_million: None,
                cache_write_input_per_million: None,
            }),
            max_output_tokens: Some(64),
            ..ModelConfig::default()
        },
    );
    let hold = HoldProvider::new();
    hold.release();
    let store: Arc<dyn tollgate_store::Store> = Arc::new(counting.clone());
    let tollgate = Tollgate::builder(store, config)
        .provider(HOLD_PROVIDER, Arc::new(hold))
        .build()?;
    let engine = tollgate.start().await?;
    let measured = match HttpServer::start(&tollgate).await {
        Ok(server) => {
            let measured = rounds(ctx, &server, upstream, peer).await;
            let stopped = server.shutdown().await;
            measured.and_then(|sides| stopped.map(|()| sides))
        }
        Err(e) => Err(e),
    };
    engine.shutdown(Duration::from_secs(30)).await;
    Ok((measured?, counting.counts().profile()))
}

/// Warm-up, then the alternating rounds: the rate phases of the three sides, then their
/// full-speed phases.
async fn rounds(
    ctx: &Ctx,
    server: &HttpServer,
    upstream: &FakeUpstream,
    peer: Option<Arc<RunningPeer>>,
) -> anyhow::Result<[Measured; 4]> {
    let sizes = &ctx.sizes;
    let client = reqwest::Client::builder()
        .http1_only()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(CONNECTIONS * 2)
        .pool_idle_timeout(Duration::from_secs(3600))
        .build()
        .context("cannot build the HTTP client")?;
    let target = Target {
        client,
        door: server.client().base().to_string(),
        key: server.client().key().to_string(),
        upstream: upstream.base_url().to_string(),
        run: uuid::Uuid::new_v4().simple().to_string(),
        peer,
    };
    let with_peer = target.peer.is_some();
    let phase_time = sizes.door_duration / sizes.rounds;
    // Warm-up, not counted: connections opened, statements prepared, scopes' rows made.
    for side in order(0, with_peer) {
        ctx.progress.stage(format!("warm-up: {}", side.label()));
        let op = op(&target, side, "warm");
        run_timed(
            &ctx.progress,
            CONNECTIONS,
            phase_time.min(Duration::from_secs(1)),
            op,
        )
        .await?;
    }
    let mut measured: [Measured; 4] = Default::default();
    for round in 0..sizes.rounds {
        let label = format!("round {}/{}", round + 1, sizes.rounds);
        for side in order(round, with_peer) {
            ctx.progress
                .stage(format!("{label}: {} at {RATE}/s", side.label()));
            let phase = format!("rate{round}");
            let t = target.clone();
            let call: Call = Arc::new(move |seq| t.call(side, &phase, seq));
            let done = run_at_rate(&ctx.progress, RATE, phase_time, call).await?;
            measured[side as usize].at_rate.add(done);
        }
        for side in order(round, with_peer) {
            ctx.progress.stage(format!(
                "{label}: {}, {CONNECTIONS} connections at full speed",
                side.label()
            ));
            let op = op(&target, side, &format!("max{round}"));
            let done = run_timed(&ctx.progress, CONNECTIONS, phase_time, op).await?;
            measured[side as usize].max.add(done);
        }
    }
    Ok(measured)
}

/// A full-speed operation of `side`: connection `client`'s `seq`-th call.
fn op(target: &Target, side: Side, phase: &str) -> Op {
    let (t, phase) = (target.clone(), phase.to_string());
    Arc::new(move |client, seq| t.call(side, &format!("{phase}-c{client}"), seq))
}

/// One scope mode's figures against the direct call.
fn figures(door: &Measured, direct: &Measured) -> anyhow::Result<(Value, Percentiles)> {
    let p = |phase: &Phase, what: &str| {
        phase
            .percentiles()
            .with_context(|| format!("{what} measured no call"))
    };
    let at_rate = p(&door.at_rate, "the door at the fixed rate")?;
    let direct_rate = p(&direct.at_rate, "the direct call at the fixed rate")?;
    let value = json!({
        "added_p50_ms": at_rate.p50_ms - direct_rate.p50_ms,
        "added_p99_ms": at_rate.p99_ms - direct_rate.p99_ms,
        "latency_ms": serde_json::to_value(at_rate)?,
        "max_per_s": door.max.per_s(),
        "max_latency_ms": serde_json::to_value(door.max.percentiles())?,
    });
    Ok((value, at_rate))
}

/// A scope mode's figures (`door`, from [`figures`]) against the peer's (`peer`), with
/// issue 32's targets: each ratio, whether its target is met, and all of them.
fn vs_peer(door: &Value, peer: &Value) -> Value {
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    // An added latency at most the peer's target multiple; a ratio only when the peer
    // added something (a peer no slower than the direct call has no ratio to meet,
    // unless the door added nothing either).
    let latency = |key: &str, target: f64| {
        let (d, p) = (f(door, key), f(peer, key));
        let ratio = (p > 0.0).then(|| d / p);
        let met = ratio.is_some_and(|r| r <= target) || d <= 0.0;
        (ratio, met)
    };
    let (p50, p50_met) = latency("added_p50_ms", P50_TARGET);
    let (p99, p99_met) = latency("added_p99_ms", P99_TARGET);
    let (d_max, p_max) = (f(door, "max_per_s"), f(peer, "max_per_s"));
    let max = (p_max > 0.0).then(|| d_max / p_max);
    let max_met = max.is_some_and(|r| r >= MAX_TARGET);
    json!({
        "added_p50_ratio": p50,
        "added_p50_target_met": p50_met,
        "added_p99_ratio": p99,
        "added_p99_target_met": p99_met,
        "max_ratio": max,
        "max_target_met": max_met,
        "targets_met": p50_met && p99_met && max_met,
    })
}

fn report(
    ctx: &Ctx,
    sides: &[Measured; 4],
    profile: &Profile,
    peer: Option<&'static str>,
) -> anyhow::Result<ScenarioReport> {
    let sizes = &ctx.sizes;
    let direct = &sides[Side::Direct as usize];
    let (one, one_rate) = figures(&sides[Side::OneScope as usize], direct)?;
    let (many, many_rate) = figures(&sides[Side::ManyScopes as usize], direct)?;
    let one_max = sides[Side::OneScope as usize].max.per_s();
    let many_max = sides[Side::ManyScopes as usize].max.per_s();
    let one_vs_many = if many_max > 0.0 {
        one_max / many_max
    } else {
        0.0
    };
    let mut report = ctx.report(Scenario::Door);
    report
        .param("rate_per_s", RATE)
        .param("connections", CONNECTIONS)
        .param("scopes", SCOPES)
        .param("workers", sizes.peer_workers)
        .param("seconds_per_phase", sizes.door_duration.as_secs_f64())
        .param("rounds", sizes.rounds)
        .row(&format!("door, 1 scope, at {RATE}/s"), None, Some(one_rate))
        .row(
            &format!("door, {SCOPES} scopes, at {RATE}/s"),
            None,
            Some(many_rate),
        )
        .row(
            &format!("upstream direct, at {RATE}/s"),
            None,
            direct.at_rate.percentiles(),
        )
        .row(
            &format!("door, 1 scope, {CONNECTIONS} connections"),
            Some(one_max),
            sides[Side::OneScope as usize].max.percentiles(),
        )
        .tollgate(
            &format!("door, {SCOPES} scopes, {CONNECTIONS} connections"),
            many_max,
            sides[Side::ManyScopes as usize].max.percentiles(),
        )
        .baseline(
            &format!("upstream direct, {CONNECTIONS} connections"),
            direct.max.per_s(),
            direct.max.percentiles(),
        )
        .ratio_reported()
        .extra("one_scope", one.clone())
        .extra("many_scopes", many.clone())
        .extra(
            "direct_latency_ms",
            serde_json::to_value(direct.at_rate.percentiles())?,
        )
        .extra("direct_max_per_s", direct.max.per_s())
        .extra("one_scope_vs_many_scopes_max", one_vs_many);
    if let Some(name) = peer {
        let (theirs, peer_rate) = figures(&sides[Side::Peer as usize], direct)?;
        let peer_max = sides[Side::Peer as usize].max.per_s();
        let one_vs = vs_peer(&one, &theirs);
        let many_vs = vs_peer(&many, &theirs);
        let met = one_vs["targets_met"] == true && many_vs["targets_met"] == true;
        report
            .row(&format!("{name}, at {RATE}/s"), None, Some(peer_rate))
            .row(
                &format!("{name}, {CONNECTIONS} connections"),
                Some(peer_max),
                sides[Side::Peer as usize].max.percentiles(),
            )
            .param("peer", name)
            .extra("peer", theirs)
            .extra("one_scope_vs_peer", one_vs.clone())
            .extra("many_scopes_vs_peer", many_vs.clone())
            .target(
                format!(
                    "vs {name}: added p50 ≤ {P50_TARGET}×, p99 ≤ {P99_TARGET}×, max ≥ \
                     {MAX_TARGET}× (1 and {SCOPES} scopes)"
                ),
                met,
            );
        for (mode, v) in [("1 scope", &one_vs), ("64 scopes", &many_vs)] {
            // No ratio (`null`): the peer added nothing over the direct call.
            let r = |k: &str| {
                v[k].as_f64().map_or_else(
                    || format!("n/a ({name} added none)"),
                    |x| format!("{x:.2}×"),
                )
            };
            report.note(format!(
                "{mode} ÷ {name}: added p50 {} (≤ {P50_TARGET}), added p99 {} \
                 (≤ {P99_TARGET}), max {} (≥ {MAX_TARGET})",
                r("added_p50_ratio"),
                r("added_p99_ratio"),
                r("max_ratio"),
            ));
        }
    }
    for (name, v) in [("1 scope", &one), ("64 scopes", &many)] {
        report.note(format!(
            "{name}: added p50 {:.2} ms, p99 {:.2} ms at {RATE}/s; {:.0} calls/s at \
             {CONNECTIONS} connections",
            v["added_p50_ms"].as_f64().unwrap_or(f64::NAN),
            v["added_p99_ms"].as_f64().unwrap_or(f64::NAN),
            v["max_per_s"].as_f64().unwrap_or(f64::NAN),
        ));
    }
    report.note(format!(
        "1 scope ÷ {SCOPES} scopes at full speed: {one_vs_many:.2} (same-scope calls queue \
         on a lock when this falls well below 1)"
    ));
    report.store_profile(profile);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_side_leads_a_round_in_turn() {
        assert_eq!(
            order(0, false),
            [Side::OneScope, Side::ManyScopes, Side::Direct]
        );
        assert_eq!(
            order(1, false),
            [Side::ManyScopes, Side::Direct, Side::OneScope]
        );
        assert_eq!(order(3, false), order(0, false));
        assert_eq!(
            order(3, true),
            [Side::Peer, Side::OneScope, Side::ManyScopes, Side::Direct]
        );
        assert_eq!(order(4, true), order(0, true));
    }

    #[test]
    fn the_door_is_judged_against_the_peers_added_latency_and_max() {
        let fig = |p50: f64, p99: f64, max: f64| json!({"added_p50_ms": p50, "added_p99_ms": p99, "max_per_s": max});
        let peer = fig(3.0, 10.0, 800.0);
        let met = vs_peer(&fig(6.0, 30.0, 640.0), &peer);
        assert_eq!(met["targets_met"], true, "{met}");
        assert_eq!(met["added_p50_ratio"], 2.0);
        let slow = vs_peer(&fig(6.1, 12.0, 900.0), &peer);
        assert_eq!(slow["added_p50_target_met"], false);
        assert_eq!(slow["added_p99_target_met"], true);
        assert_eq!(slow["targets_met"], false);
        let few = vs_peer(&fig(1.0, 1.0, 639.0), &peer);
        assert_eq!(few["max_target_met"], false);
        // A peer that added nothing: met only by a door that added nothing either.
        let instant = fig(-0.1, -0.2, 800.0);
        assert_eq!(
            vs_peer(&fig(0.5, 1.0, 800.0), &instant)["added_p50_target_met"],
            false
        );
        assert_eq!(
            vs_peer(&fig(-0.3, -0.1, 800.0), &instant)["targets_met"],
            true
        );
    }

    #[test]
    fn only_chat_completions_answered_200_count() {
        let ok = reqwest::StatusCode::OK;
        let completion = br#"{"object":"chat.completion","choices":[]}"#;
        assert!(check_completion(ok, completion).is_ok());
        assert!(check_completion(reqwest::StatusCode::TOO_MANY_REQUESTS, completion).is_err());
        assert!(check_completion(ok, br#"{"object":"list"}"#).is_err());
        assert!(check_completion(ok, b"not json").is_err());
    }
}
