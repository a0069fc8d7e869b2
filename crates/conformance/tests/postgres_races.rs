//! Limits exact across PostgreSQL replicas, the long way round: 4 store instances race
//! ≥ 10,000 admissions (and, for cost limits, re-asks) built from the suite's fixtures,
//! then the stored rows alone are audited for every limit at every instant. The suite's
//! `concurrency::*` tests check each limit through the trait, on both backends; these
//! read PostgreSQL's rows directly. Skipped (with a notice) without
//! `TOLLGATE_TEST_DATABASE_URL`; `TOLLGATE_REQUIRE_POSTGRES=1` fails instead.

use sqlx::Row;
use std::sync::Arc;
use std::time::Duration;
use tollgate_conformance::START;
use tollgate_core::{AppId, Budget, ManualClock, NewTask};
use tollgate_store::StoreError;
use tollgate_store::postgres::PostgresStore;
use tollgate_store::prelude::*;

#[path = "../../store/tests/support/pg_schema.rs"]
mod pg_schema;
use pg_schema::{Schema, database_url};

/// A small deterministic generator (xorshift), seeded so a failure can be replayed with
/// `TOLLGATE_RACE_SEED`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One admission attempt: (app, scope, source, input, recompute, effect key).
#[derive(Clone, Debug)]
struct Attempt {
    app: usize,
    scope: usize,
    source: usize,
    input: usize,
    recompute: bool,
    key: String,
}

/// docs/conformance.md#admission-exact "limits are exact under any concurrency and any number of replicas", the long
/// way round: 4 store instances (separate pools, as 4 replicas) race ≥ 10,000 admission
/// attempts (`TOLLGATE_RACE_ATTEMPTS`; 100,000 with `TOLLGATE_LONG_TESTS=1`) over 2 apps
/// × 3 scopes with random small budgets, in phases of 100 at a frozen clock (32 racers);
/// one attempt in ten replays an earlier key. Between phases a random share of the
/// active tasks succeeds, fails or is canceled and the clock moves (10 ms to 25 h). Then the
/// admission records and task rows alone must show that at every instant no limit was
/// exceeded: scope and global concurrency, the token bucket replayed exactly, distinct
/// sources in every 24 h window, and distinct live steps per source.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replicas_never_exceed_a_limit() {
    use std::collections::{BTreeMap, BTreeSet};
    use tollgate_conformance::fixtures::{
        budget, lease, new_scoped_task, recompute, spam, usage, with_input, worker,
    };
    use tollgate_core::Clock;
    use tollgate_core::admission::TOKEN_UNITS;

    let Some(url) = database_url("racing_replicas_never_exceed_a_limit") else {
        return;
    };
    let long = std::env::var("TOLLGATE_LONG_TESTS").is_ok_and(|v| v == "1");
    let attempts = env_number(
        "TOLLGATE_RACE_ATTEMPTS",
        if long { 100_000 } else { 10_000 },
    ) as usize;
    let seed = env_number(
        "TOLLGATE_RACE_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1,
    );
    eprintln!("racing replicas: {attempts} attempts, TOLLGATE_RACE_SEED={seed}");
    let mut rng = Rng(seed);
    let schema = Schema::new(&url, "race");
    let clock = ManualClock::new(START);
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..4 {
        let mut o = schema.options(&clock);
        o.acquire_timeout = Duration::from_secs(60);
        stores.push(Arc::new(PostgresStore::open(o).await.expect("open")));
    }
    const APPS: [&str; 2] = ["acme", "globex"];
    const SCOPES: usize = 3;
    let global = 4 + rng.below(12) as u32;
    // (steps, sources, scope_concurrent, burst, tasks_per_minute) per (app, scope).
    let mut limits = BTreeMap::new();
    for app in 0..APPS.len() {
        for scope in 0..SCOPES {
            limits.insert(
                (app, scope),
                (
                    1 + rng.below(4) as u32,
                    1 + rng.below(5) as u32,
                    1 + rng.below(5) as u32,
                    1 + rng.below(6) as u32,
                    1 + rng.below(30) as u32,
                ),
            );
        }
    }
    let new_task = |a: &Attempt| {
        let (steps, sources, scope_c, burst, rate) = limits[&(a.app, a.scope)];
        let t = with_input(
            new_scoped_task(
                APPS[a.app],
                &format!("scope-{}", a.scope),
                &a.key,
                &format!("doc-{}", a.source),
                budget(steps, sources, scope_c, global, burst, rate),
            ),
            &format!("input-{}", a.input),
        );
        if a.recompute { recompute(t) } else { t }
    };

    let racers = 32usize;
    let per_phase = 100usize;
    let mut made = 0usize;
    let mut phase_times = Vec::new();
    let mut keys: Vec<Attempt> = Vec::new();
    let mut answers: BTreeMap<String, bool> = BTreeMap::new(); // key → created (any time)
    let mut rejections: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut replays = 0usize;
    let mut running = Vec::new();
    while made < attempts {
        phase_times.push(clock.now().0);
        let n = per_phase.min(attempts - made);
        let mut batch = Vec::with_capacity(n);
        for i in 0..n {
            // One attempt in ten replays an earlier key: it must never be admitted again.
            let a = if !keys.is_empty() && rng.below(10) == 0 {
                keys[rng.below(keys.len() as u64) as usize].clone()
            } else {
                Attempt {
                    app: rng.below(2) as usize,
                    scope: rng.below(SCOPES as u64) as usize,
                    source: rng.below(4) as usize,
                    input: rng.below(40) as usize,
                    recompute: rng.below(8) == 0,
                    key: format!("k{}", made + i),
                }
            };
            batch.push(a);
        }
        made += n;
        let batch = Arc::new(batch);
        let mut handles = Vec::new();
        for r in 0..racers {
            let batch = batch.clone();
            let store = stores[r % stores.len()].clone();
            let tasks: Vec<(Attempt, NewTask)> = batch
                .iter()
                .skip(r)
                .step_by(racers)
                .map(|a| (a.clone(), new_task(a)))
                .collect();
            handles.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for (a, t) in tasks {
                    out.push((a, store.create_task(t).await));
                }
                out
            }));
        }
        for h in handles {
            for (a, answer) in h.await.expect("racer") {
                match answer {
                    Ok(c) => {
                        if c.created {
                            assert!(
                                answers.insert(a.key.clone(), true).is_none(),
                                "key {} created twice",
                                a.key
                            );
                            keys.push(a);
                        } else {
                            replays += 1;
                        }
                    }
                    Err(StoreError::Admission(r)) => {
                        *rejections.entry(r.code().as_str()).or_default() += 1
                    }
                    Err(e) => panic!("only admission may refuse a create: {e:?}"),
                }
            }
        }
        // Between phases, at a later instant: finish a random share of the active tasks.
        clock.advance(Duration::from_millis(1));
        let w = worker("finisher");
        let claimed = stores[0].claim_next(&w, 1000).await.expect("claim");
        running.extend(claimed.into_iter().map(|t| (t.id, t.app)));
        let mut still = Vec::new();
        for (i, (id, app)) in running.drain(..).enumerate() {
            let s = &stores[i % stores.len()];
            match rng.below(10) {
                0..=5 => {
                    s.complete_task(id, &lease(&w, 1), spam(), usage())
                        .await
                        .expect("complete");
                }
                6 | 7 => {
                    s.fail_task(
                        id,
                        None,
                        tollgate_core::ErrorCode::ProviderError,
                        "boom",
                        None,
                    )
                    .await
                    .expect("fail");
                }
                8 => {
                    s.request_cancel(&app, id).await.expect("cancel");
                }
                _ => still.push((id, app)), // stays running
            }
        }
        running = still;
        let advance = match rng.below(10) {
            0..=3 => 10 + rng.below(5_000),
            4..=6 => 60_000 + rng.below(12 * 3_600_000),
            _ => 24 * 3_600_000 + rng.below(3_600_000),
        };
        clock.advance(Duration::from_millis(advance));
    }

    // Everything below reads only the rows.
    let pool = sqlx::PgPool::connect(&format!(
        "{url}{}options=-c%20search_path%3D{}",
        if url.contains('?') { '&' } else { '?' },
        schema.name
    ))
    .await
    .expect("pool");
    struct Row2 {
        id: String,
        app: String,
        scope: String,
        key: String,
        admitted: bool,
        status: String,
        created: i64,
        completed: Option<i64>,
        cache_key: Option<String>,
        recompute: bool,
    }
    let tasks: Vec<Row2> = sqlx::query(
        "SELECT id, app, scope, effect_key, admitted, status, created_at, completed_at, \
         cache_key, recompute FROM tasks",
    )
    .fetch_all(&pool)
    .await
    .expect("tasks")
    .into_iter()
    .map(|r| Row2 {
        id: r.get(0),
        app: r.get(1),
        scope: r.get(2),
        key: r.get(3),
        admitted: r.get(4),
        status: r.get(5),
        created: r.get(6),
        completed: r.get(7),
        cache_key: r.get(8),
        recompute: r.get(9),
    })
    .collect();
    let records: Vec<(String, String, String, String, Option<String>, i64)> = sqlx::query_as(
        "SELECT app, scope, source_id, task_id, logical_key, admitted_at FROM admissions",
    )
    .fetch_all(&pool)
    .await
    .expect("admissions");
    pool.close().await;

    // Rows agree with the answers: one row per created key, none for a rejection.
    let stored: BTreeSet<&str> = tasks.iter().map(|t| t.key.as_str()).collect();
    assert_eq!(stored.len(), tasks.len());
    assert_eq!(
        stored,
        answers.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        "a task row exists exactly for each created answer"
    );
    let by_id: BTreeMap<&str, &Row2> = tasks.iter().map(|t| (t.id.as_str(), t)).collect();
    assert_eq!(
        records.len(),
        tasks.iter().filter(|t| t.admitted).count(),
        "one admission record per admitted task, none for cache hits"
    );
    for (app, scope, _, task, logical, at) in &records {
        let t = by_id[task.as_str()];
        assert!(t.admitted && &t.app == app && &t.scope == scope && t.created == *at);
        let original = if t.recompute {
            t.id.clone()
        } else {
            t.cache_key.clone().unwrap()
        };
        match logical {
            Some(k) => assert_eq!(k, &original, "the logical key is the cache key or the id"),
            None => assert!(
                ["failed", "canceled"].contains(&t.status.as_str()),
                "only a failed or canceled task clears its step"
            ),
        }
    }

    let scope_name = |a: usize, s: usize| (APPS[a].to_string(), format!("scope-{s}"));
    let mut checked = 0u64;
    for &at in &phase_times {
        let active_at =
            |t: &&Row2| t.admitted && t.created <= at && t.completed.is_none_or(|c| c > at);
        let global_active = tasks.iter().filter(active_at).count() as u32;
        assert!(
            global_active <= global,
            "global_concurrent {global} exceeded at {at}: {global_active}"
        );
        for (&(a, s), &(steps, sources, scope_c, _, _)) in &limits {
            let (app, scope) = scope_name(a, s);
            let active = tasks
                .iter()
                .filter(active_at)
                .filter(|t| t.app == app && t.scope == scope)
                .count() as u32;
            assert!(
                active <= scope_c,
                "scope_concurrent {scope_c} of {app}/{scope} exceeded at {at}: {active}"
            );
            let window: Vec<_> = records
                .iter()
                .filter(|r| r.0 == app && r.1 == scope && r.5 <= at && r.5 > at - 24 * 3_600_000)
                .collect();
            let distinct: BTreeSet<&str> = window.iter().map(|r| r.2.as_str()).collect();
            assert!(
                distinct.len() as u32 <= sources,
                "sources_per_24_hours {sources} of {app}/{scope} exceeded at {at}: {distinct:?}"
            );
            // A step counts until its task failed or was canceled (strictly before `at`).
            let mut per_source: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
            for r in &window {
                let t = by_id[r.3.as_str()];
                let cleared = ["failed", "canceled"].contains(&t.status.as_str())
                    && t.completed.is_some_and(|c| c < at);
                if !cleared {
                    let k = if t.recompute {
                        t.id.clone()
                    } else {
                        t.cache_key.clone().unwrap()
                    };
                    per_source.entry(r.2.as_str()).or_default().insert(k);
                }
            }
            for (source, ks) in per_source {
                assert!(
                    ks.len() as u32 <= steps,
                    "max_steps_per_source {steps} of {app}/{scope}/{source} exceeded at {at}: {}",
                    ks.len()
                );
            }
            checked += 1;
        }
    }
    // The token bucket, replayed from the records: admissions at each instant never take
    // more tokens than the bucket held.
    for (&(a, s), &(_, _, _, burst, rate)) in &limits {
        let (app, scope) = scope_name(a, s);
        let mut per_instant: BTreeMap<i64, i64> = BTreeMap::new();
        for r in records.iter().filter(|r| r.0 == app && r.1 == scope) {
            *per_instant.entry(r.5).or_default() += 1;
        }
        let capacity = i64::from(burst) * TOKEN_UNITS;
        let mut units = capacity;
        let mut last = START.0;
        for (at, n) in per_instant {
            units = (units + (at - last) * i64::from(rate)).min(capacity);
            last = at;
            assert!(
                n * TOKEN_UNITS <= units,
                "{app}/{scope} admitted {n} at {at} with {} tokens (burst {burst}, {rate}/min)",
                units as f64 / TOKEN_UNITS as f64
            );
            units -= n * TOKEN_UNITS;
        }
    }
    let admitted = records.len();
    eprintln!(
        "racing replicas: {attempts} attempts, {admitted} admitted, {} served from cache, \
         refused {rejections:?}, {replays} replays, {checked} (scope, instant) checks",
        tasks.len() - admitted
    );
    assert!(
        admitted > 0 && !rejections.is_empty(),
        "both outcomes must occur"
    );
    for s in stores {
        drop(s);
    }
}

/// docs/conformance.md#cost-exact "Exact … under any concurrency and any number of replicas", the long way
/// round: 4 store instances race ≥ 10,000 admissions (`TOLLGATE_COST_RACE_ATTEMPTS`)
/// with random token counts and prices under random scope and app USD limits and token
/// buckets, between phases completing, failing and canceling tasks with actual usage at
/// most their reservation and moving the clock (minutes to days). Audited afterwards from
/// the stored rows alone: in no 24 h window of any scope or app does settled plus
/// reserved spend exceed its limit at any instant, and the token bucket replayed from the
/// reservations and refunds never goes below zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_replicas_never_exceed_a_cost_limit() {
    use std::collections::BTreeMap;
    use std::num::{NonZeroU32, NonZeroU64};
    use tollgate_conformance::fixtures::{lease, new_scoped_task, spam, with_input, worker};
    use tollgate_core::admission::TOKEN_UNITS;
    use tollgate_core::cost::{
        CostLimits, TokenBound, TokenRate, attempt_reservation, refund_units, reservation,
    };
    use tollgate_core::{BucketState, Clock, Prices, Reservation, Timestamp, Usage};

    let Some(url) = database_url("racing_replicas_never_exceed_a_cost_limit") else {
        return;
    };
    let attempts = env_number("TOLLGATE_COST_RACE_ATTEMPTS", 10_000) as usize;
    let seed = env_number(
        "TOLLGATE_RACE_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
            | 1,
    );
    eprintln!("racing cost replicas: {attempts} attempts, TOLLGATE_RACE_SEED={seed}");
    let mut rng = Rng(seed);
    let schema = Schema::new(&url, "cost_race");
    let clock = ManualClock::new(START);
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    for _ in 0..4 {
        let mut o = schema.options(&clock);
        o.acquire_timeout = Duration::from_secs(60);
        stores.push(Arc::new(PostgresStore::open(o).await.expect("open")));
    }
    const APPS: [&str; 2] = ["acme", "globex"];
    const SCOPES: usize = 3;
    let prices = [
        Prices {
            input: 150_000,
            output: 600_000,
            cached_input: 75_000,
            cache_write_input: 150_000,
        },
        Prices {
            input: 2_500_000,
            output: 10_000_000,
            cached_input: 1_250_000,
            cache_write_input: 2_500_000,
        },
        Prices {
            input: 1_000,
            output: 3_000,
            cached_input: 1_000,
            cache_write_input: 1_000,
        },
    ];
    // A typical reservation is ~250 tokens, up to ~$0.004: limits that refuse often.
    let app_limits: Vec<u64> = (0..APPS.len())
        .map(|_| 20_000_000 + rng.below(60_000_000))
        .collect();
    let mut limits: BTreeMap<(usize, usize), (u64, u32, u32)> = BTreeMap::new();
    for a in 0..APPS.len() {
        for s in 0..SCOPES {
            limits.insert(
                (a, s),
                (
                    5_000_000 + rng.below(30_000_000),
                    600 + rng.below(30_000) as u32,
                    800 + rng.below(3_000) as u32,
                ),
            );
        }
    }
    let budget_of = |a: usize, s: usize| {
        let (usd, per_minute, burst) = limits[&(a, s)];
        Budget {
            cost: CostLimits {
                scope_nano_per_24_hours: NonZeroU64::new(usd),
                token_rate: Some(TokenRate {
                    tokens_per_minute: NonZeroU32::new(per_minute).unwrap(),
                    token_burst: NonZeroU32::new(burst).unwrap(),
                }),
                app_nano_per_24_hours: NonZeroU64::new(app_limits[a]),
            },
            ..Budget::unlimited()
        }
    };

    let racers = 32usize;
    let per_phase = 100usize;
    let mut made = 0usize;
    let mut rejections: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut admitted = 0usize;
    let mut running: Vec<(tollgate_core::TaskId, AppId, Reservation)> = Vec::new();
    let mut queued: Vec<(tollgate_core::TaskId, AppId)> = Vec::new();
    // docs/budgets.md, "The reservation": each task's first-attempt reservation, and the
    // re-asks granted to it (at which instant, what), racing the admissions.
    let mut first_attempts: BTreeMap<String, Reservation> = BTreeMap::new();
    let mut reasks: BTreeMap<String, Vec<(i64, Reservation)>> = BTreeMap::new();
    let mut reasks_refused = 0usize;
    let w = worker("finisher");
    while made < attempts {
        let n = per_phase.min(attempts - made);
        let mut batch = Vec::with_capacity(n);
        for i in 0..n {
            let (a, s) = (rng.below(2) as usize, rng.below(SCOPES as u64) as usize);
            let bound = TokenBound {
                input_tokens: 10 + rng.below(300),
                reask_input_tokens: rng.below(50),
                output_tokens: 5 + rng.below(150),
                attempts: 1 + rng.below(2) as u32,
            };
            let r = reservation(Some(&bound), Some(prices[rng.below(3) as usize]));
            let key = format!("k{}", made + i);
            let mut t = with_input(
                new_scoped_task(
                    APPS[a],
                    &format!("scope-{s}"),
                    &key,
                    &format!("doc-{}", rng.below(5)),
                    budget_of(a, s),
                ),
                &key,
            );
            if let Some(scoped) = t.scope.as_mut() {
                scoped.reservation = r;
            }
            batch.push(t);
        }
        made += n;
        let batch = Arc::new(batch);
        // Re-asks of the running tasks, racing the admissions: every racer interleaves.
        let mut asks: Vec<Vec<(tollgate_core::TaskId, Reservation)>> = vec![Vec::new(); racers];
        for (id, _, r) in &running {
            for _ in 0..rng.below(3) {
                let attempt =
                    attempt_reservation(10 + rng.below(350), 5 + rng.below(150), r.prices);
                asks[rng.below(racers as u64) as usize].push((*id, attempt));
            }
        }
        let phase_now = clock.now().0;
        let mut handles = Vec::new();
        for (r, my_asks) in asks.into_iter().enumerate() {
            let store = stores[r % stores.len()].clone();
            let mine: Vec<NewTask> = batch.iter().skip(r).step_by(racers).cloned().collect();
            let w = w.clone();
            handles.push(tokio::spawn(async move {
                let mut out = Vec::new();
                let mut granted = Vec::new();
                let mut refused = 0usize;
                let mut my_asks = my_asks.into_iter();
                for t in mine {
                    out.push(store.create_task(t).await);
                    if let Some((id, attempt)) = my_asks.next() {
                        match store.reserve_attempt(id, &lease(&w, 1), &attempt).await {
                            Ok(Some(_)) => granted.push((id, attempt)),
                            Ok(None) => panic!("a running task's re-ask: {id}"),
                            Err(StoreError::Cost(_)) => refused += 1,
                            Err(e) => panic!("only the cost checks may refuse a re-ask: {e:?}"),
                        }
                    }
                }
                for (id, attempt) in my_asks {
                    match store.reserve_attempt(id, &lease(&w, 1), &attempt).await {
                        Ok(Some(_)) => granted.push((id, attempt)),
                        Ok(None) => panic!("a running task's re-ask: {id}"),
                        Err(StoreError::Cost(_)) => refused += 1,
                        Err(e) => panic!("only the cost checks may refuse a re-ask: {e:?}"),
                    }
                }
                (out, granted, refused)
            }));
        }
        let mut answers = Vec::new();
        for h in handles {
            let (out, granted, refused) = h.await.expect("racer");
            for (id, attempt) in granted {
                reasks
                    .entry(id.to_string())
                    .or_default()
                    .push((phase_now, attempt));
            }
            reasks_refused += refused;
            answers.push(out);
        }
        for out in answers {
            for answer in out {
                match answer {
                    Ok(c) => {
                        assert!(c.created, "every key is new");
                        admitted += 1;
                        first_attempts
                            .insert(c.task.id.to_string(), c.task.reservation.expect("reserved"));
                        queued.push((c.task.id, c.task.app.clone()));
                    }
                    Err(StoreError::Cost(r)) => {
                        *rejections.entry(r.code().as_str()).or_default() += 1
                    }
                    Err(e) => panic!("only the cost checks may refuse here: {e:?}"),
                }
            }
        }
        clock.advance(Duration::from_millis(1));
        // Claim some, then end some of the running ones with usage ≤ their reservation.
        let claimed = stores[0].claim_next(&w, 60).await.expect("claim");
        for t in claimed {
            queued.retain(|(id, _)| *id != t.id);
            running.push((t.id, t.app.clone(), t.reservation.expect("reserved")));
        }
        let mut still = Vec::new();
        for (i, (id, app, r)) in running.drain(..).enumerate() {
            let s = &stores[i % stores.len()];
            let share = |rng: &mut Rng, n: u64| n * rng.below(101) / 100;
            let input = share(&mut rng, r.tokens / 2);
            let output = share(&mut rng, r.tokens - r.tokens / 2);
            // Within the token bound, and (input priced at the dearest rate) within cost.
            let used = Usage {
                input_tokens: input.min(r.tokens),
                output_tokens: 0,
                cost_usd: None,
                cached_input_tokens: Some(share(&mut rng, input)),
                cache_write_input_tokens: None,
                estimated: false,
                cost_nano_usd: None,
            };
            let used = if r.prices.is_some_and(|p| {
                p.cost_nano(&Usage {
                    output_tokens: output,
                    ..used
                }) <= r.nano_usd
            }) {
                Usage {
                    output_tokens: output,
                    ..used
                }
            } else {
                used
            };
            match rng.below(10) {
                0..=5 => {
                    s.complete_task(id, &lease(&w, 1), spam(), used)
                        .await
                        .expect("complete");
                }
                6 | 7 => {
                    s.fail_task(
                        id,
                        None,
                        tollgate_core::ErrorCode::ProviderError,
                        "boom",
                        Some(&used),
                    )
                    .await
                    .expect("fail");
                }
                8 => {
                    s.request_cancel(&app, id).await.expect("cancel");
                }
                _ => still.push((id, app, r)),
            }
        }
        running = still;
        // Cancel a few queued ones (they cost nothing).
        for _ in 0..3 {
            if queued.is_empty() {
                break;
            }
            let (id, app) = queued.swap_remove(rng.below(queued.len() as u64) as usize);
            stores[1].request_cancel(&app, id).await.expect("cancel");
        }
        let advance = match rng.below(10) {
            0..=4 => 10 + rng.below(20_000),
            5..=7 => 60_000 + rng.below(6 * 3_600_000),
            _ => 12 * 3_600_000 + rng.below(14 * 3_600_000),
        };
        clock.advance(Duration::from_millis(advance));
    }

    // Everything below reads only the rows.
    let pool = sqlx::PgPool::connect(&format!(
        "{url}{}options=-c%20search_path%3D{}",
        if url.contains('?') { '&' } else { '?' },
        schema.name
    ))
    .await
    .expect("pool");
    struct Row3 {
        id: String,
        app: String,
        scope: String,
        created: i64,
        completed: Option<i64>,
        reservation: Reservation,
        charged_nano: Option<i64>,
        charged_tokens: Option<i64>,
    }
    let rows: Vec<Row3> = sqlx::query(
        "SELECT app, scope, created_at, completed_at, reservation, charged_nano, charged_tokens, \
         id FROM tasks WHERE admitted",
    )
    .fetch_all(&pool)
    .await
    .expect("tasks")
    .into_iter()
    .map(|r| Row3 {
        id: r.get(7),
        app: r.get(0),
        scope: r.get(1),
        created: r.get(2),
        completed: r.get(3),
        reservation: serde_json::from_str(&r.get::<String, _>(4)).expect("reservation"),
        charged_nano: r.get(5),
        charged_tokens: r.get(6),
    })
    .collect();
    pool.close().await;
    assert_eq!(rows.len(), admitted, "one admitted row per admission");
    // The reservation of a task at instant `at`: its first attempt's, plus the re-asks
    // granted by then (the final one is their sum).
    let reserved_at = |t: &Row3, at: i64| -> (u64, i64) {
        let first = first_attempts[&t.id];
        reasks
            .get(&t.id)
            .into_iter()
            .flatten()
            .filter(|(when, _)| *when <= at)
            .fold((first.tokens, first.nano_usd), |(tok, nano), (_, a)| {
                (tok + a.tokens, nano + a.nano_usd)
            })
    };
    for t in &rows {
        assert_eq!(
            reserved_at(t, i64::MAX),
            (t.reservation.tokens, t.reservation.nano_usd),
            "a task's reservation is its first attempt plus its granted re-asks"
        );
    }
    for t in &rows {
        assert_eq!(
            t.completed.is_some(),
            t.charged_nano.is_some(),
            "a task is settled exactly when it ended"
        );
        assert!(t.charged_nano.unwrap_or(0) <= t.reservation.nano_usd);
    }

    // The spend of a set of tasks at instant `at` over the window (at − 24 h, at].
    let spend_at = |at: i64, of: &dyn Fn(&Row3) -> bool| -> i64 {
        rows.iter()
            .filter(|t| of(t) && t.created <= at && t.created > at - 24 * 3_600_000)
            .map(|t| match (t.completed, t.charged_nano) {
                (Some(c), Some(n)) if c <= at => n,
                _ => reserved_at(t, at).1,
            })
            .sum()
    };
    let mut instants: Vec<i64> = rows.iter().map(|t| t.created).collect();
    instants.extend(reasks.values().flatten().map(|(at, _)| *at));
    instants.sort_unstable();
    instants.dedup();
    let mut checked = 0u64;
    for &at in &instants {
        for (a, app) in APPS.iter().enumerate() {
            let total = spend_at(at, &|t: &Row3| t.app == *app);
            assert!(
                total as u64 <= app_limits[a],
                "app {app} over its usd_per_24_hours at {at}: {total} > {}",
                app_limits[a]
            );
            for s in 0..SCOPES {
                let scope = format!("scope-{s}");
                let total = spend_at(at, &|t: &Row3| t.app == *app && t.scope == scope);
                assert!(
                    total as u64 <= limits[&(a, s)].0,
                    "{app}/{scope} over its usd_per_24_hours at {at}: {total} > {}",
                    limits[&(a, s)].0
                );
                checked += 1;
            }
        }
    }
    // The token bucket replayed: reservations taken at admission, unused tokens given
    // back at settlement (capped at the burst), never below zero.
    for (&(a, s), &(_, per_minute, burst)) in &limits {
        let (app, scope) = (APPS[a], format!("scope-{s}"));
        let mut events: BTreeMap<i64, (u64, u64)> = BTreeMap::new(); // at → (taken, refunded)
        for t in rows.iter().filter(|t| t.app == app && t.scope == scope) {
            events.entry(t.created).or_default().0 += first_attempts[&t.id].tokens;
            for (at, a) in reasks.get(&t.id).into_iter().flatten() {
                events.entry(*at).or_default().0 += a.tokens;
            }
            if let (Some(c), Some(used)) = (t.completed, t.charged_tokens) {
                events.entry(c).or_default().1 += t.reservation.tokens.saturating_sub(used as u64);
            }
        }
        let capacity = i64::from(burst) * TOKEN_UNITS;
        let mut bucket: Option<BucketState> = None;
        for (at, (taken, refunded)) in events {
            let now = Timestamp(at);
            if let Some(b) = bucket.as_mut() {
                b.units = refund_units(b.units, refunded, capacity);
            }
            if taken > 0 {
                let b = bucket
                    .unwrap_or_else(|| BucketState::full(burst, now))
                    .refilled(burst, per_minute, now);
                let left = b.units - taken as i64 * TOKEN_UNITS;
                assert!(
                    left >= 0,
                    "{app}/{scope} took {taken} tokens at {at} with {} (burst {burst}, {per_minute}/min)",
                    b.units / TOKEN_UNITS
                );
                bucket = Some(BucketState {
                    units: left,
                    at: b.at,
                });
            }
        }
    }
    let granted: usize = reasks.values().map(Vec::len).sum();
    eprintln!(
        "racing cost replicas: {attempts} attempts, {admitted} admitted, refused {rejections:?}, \
         {granted} re-asks reserved, {reasks_refused} refused, {checked} (scope, instant) checks"
    );
    assert!(
        granted > 0 && reasks_refused > 0,
        "re-asks must race admissions, some granted, some refused"
    );
    assert!(admitted > 0, "some admissions must succeed");
    assert!(
        rejections.contains_key("WORKFLOW_AI_SPEND_BUDGET")
            && rejections.contains_key("WORKFLOW_AI_TOKEN_RATE_LIMIT"),
        "both cost limits must refuse at some point: {rejections:?}"
    );
    let _ = clock.now();
    for s in stores {
        drop(s);
    }
}
