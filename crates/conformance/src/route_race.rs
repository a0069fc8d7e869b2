//! docs/routes.md, "What is charged when": each later attempt reserves before its call
//! with the same exactness across replicas as admission. Workers on several store
//! instances race through tasks of one scope whose attempts walk a route of three
//! deployments at different prices — some answer, some are unavailable (the next attempt
//! follows, on the next deployment), some workers crash mid-attempt (the sweep puts the
//! task back in the queue and its next attempt, on any instance, is charged its own
//! reservation) — while new tasks are admitted. At every observation the scope's settled
//! plus reserved spend is within its limit; at the end every task ended once, nothing is
//! reserved, and what was settled is exactly what the attempts are charged.

use super::Backend;
use super::cost::{cost_budget, priced_task, tokens};
use super::fixtures::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tollgate_core::cost::attempt_reservation;
use tollgate_core::{
    AttemptOutcome, ErrorCode, MaxAttempts, Prices, Task, TaskError, TaskId, TaskStatus, Usage,
    WorkerId,
};
use tollgate_store::{AttemptEnd, Store, StoreError, SweepConfig};

/// The route: three deployments, the second twice and the third three times the first's
/// price (1,000 / 2,000 nano-dollars an input / output token, times the factor).
const DEPLOYMENTS: [(&str, u64); 3] = [("cheap/m1", 1), ("mid/m2", 2), ("dear/m3", 3)];

/// Input and output tokens every call is bounded by.
const INPUT: u64 = 100;
const OUTPUT: u64 = 50;

/// One call's bound at the dearest deployment: 600,000 n$. The limit holds twenty.
const LIMIT: i64 = 20 * 600_000;

/// Tasks admitted (or refused) in the race.
const TASKS: usize = 96;

/// Racing workers (each its own worker id), spread over the store instances.
const WORKERS: usize = 8;

/// Store instances (replicas).
const INSTANCES: usize = 4;

fn prices(factor: u64) -> Prices {
    Prices {
        input: 1_000_000 * factor,
        output: 2_000_000 * factor,
        cached_input: 500_000 * factor,
        cache_write_input: 1_000_000 * factor,
    }
}

/// A small deterministic generator (xorshift); the seed is printed so a failure replays
/// with `TOLLGATE_RACE_SEED`.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x % n
    }
}

/// What the race saw, for the final checks and to prove every path was taken.
#[derive(Default)]
struct Seen {
    /// Applied terminal moves per task (workers' and sweeps').
    ended: BTreeMap<TaskId, usize>,
    admitted: BTreeSet<TaskId>,
    admissions_refused: usize,
    attempts_refused: usize,
    unavailable: usize,
    crashes: usize,
    lost_leases: usize,
    requeued: usize,
    succeeded: usize,
}

fn sweeps_config() -> SweepConfig {
    SweepConfig {
        // Tasks wait in the queue as long as the race lasts.
        queue_timeout: Duration::from_secs(7 * 24 * 3600),
        ..sweep_config()
    }
}

/// One worker's turn with a claimed task: attempts on the route's deployments in order
/// (starting at a random one) until one succeeds, the task runs out of tries, a later
/// attempt does not fit, the worker "crashes" (walks away mid-attempt) or finds its
/// lease lost (every write refused, nothing changed).
async fn work(s: &dyn Store, w: &WorkerId, claimed: &Task, rng: &mut Rng, seen: &Mutex<Seen>) {
    let (id, max_attempts) = (claimed.id, claimed.max_attempts.get());
    let mut index = rng.below(3) as usize;
    // The claim opened its attempt; the first turn moves it to the chosen deployment.
    let mut first = Some(claimed.attempt);
    // Every write names the claim's lease: one the task was requeued from is refused.
    let held = claimed.lease().expect("a claimed task has a lease");
    let end_task = |applied: bool| {
        if applied {
            *seen.lock().unwrap().ended.entry(id).or_default() += 1;
        }
    };
    loop {
        let (name, factor) = DEPLOYMENTS[index];
        let deployment_prices = prices(factor);
        let n = match first.take() {
            Some(n) => s
                .redirect_attempt(id, &held, n, name)
                .await
                .expect("redirect_attempt")
                .then_some(n),
            None => s
                .begin_attempt(id, &held, name)
                .await
                .expect("begin_attempt"),
        };
        let Some(n) = n else {
            // Not ours any more (requeued, claimed by another), or out of tries.
            let t = s
                .fail_task(
                    id,
                    Some(&held),
                    ErrorCode::ProviderError,
                    "no tries left",
                    None,
                )
                .await
                .expect("fail");
            if !t.applied {
                seen.lock().unwrap().lost_leases += 1;
            }
            end_task(t.applied);
            return;
        };
        // A later attempt (and every re-ask) reserves before its call.
        let calls = 1 + u64::from(rng.below(4) == 0);
        for call in 0..calls {
            if n == 1 && call == 0 {
                continue; // the admission reserved the first call, at the dearest price
            }
            let bound = attempt_reservation(INPUT, OUTPUT, Some(deployment_prices));
            match s.reserve_attempt(id, &held, &bound).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    seen.lock().unwrap().lost_leases += 1;
                    return;
                }
                Err(StoreError::Cost(c)) => {
                    assert_eq!(c.code(), ErrorCode::SpendBudget, "{c}");
                    seen.lock().unwrap().attempts_refused += 1;
                    let refused = AttemptEnd {
                        outcome: AttemptOutcome::Refused,
                        usage: Some(Usage::default()),
                        prices: Some(deployment_prices),
                        error: Some(TaskError::new(ErrorCode::SpendBudget, "does not fit")),
                    };
                    s.end_attempt(id, n, &refused).await.expect("end_attempt");
                    let t = s
                        .fail_task(
                            id,
                            Some(&held),
                            ErrorCode::SpendBudget,
                            "does not fit",
                            None,
                        )
                        .await
                        .expect("fail");
                    end_task(t.applied);
                    return;
                }
                Err(e) => panic!("only the budget may refuse an attempt's reservation: {e:?}"),
            }
        }
        let heartbeat = s
            .heartbeat(w, &[(id, held.claim)])
            .await
            .expect("heartbeat");
        if heartbeat.alive.is_empty() {
            seen.lock().unwrap().lost_leases += 1;
            return;
        }
        match rng.below(10) {
            // The call answers: usage within its bound, at this deployment's prices.
            0..=4 => {
                let usage = tokens(rng.below(INPUT * calls + 1), rng.below(OUTPUT * calls + 1));
                let end = AttemptEnd {
                    outcome: AttemptOutcome::Succeeded,
                    usage: Some(usage),
                    prices: Some(deployment_prices),
                    error: None,
                };
                if !s.end_attempt(id, n, &end).await.expect("end_attempt") {
                    seen.lock().unwrap().lost_leases += 1;
                    return;
                }
                let t = s
                    .complete_task(id, &held, spam(), usage)
                    .await
                    .expect("complete");
                if t.applied {
                    seen.lock().unwrap().succeeded += 1;
                } else {
                    seen.lock().unwrap().lost_leases += 1;
                }
                end_task(t.applied);
                return;
            }
            // Unavailable: a timeout (usage unknown: charged its reservation) or a
            // refusal (429/503: charged nothing); the next attempt follows.
            5..=7 => {
                seen.lock().unwrap().unavailable += 1;
                let end = AttemptEnd {
                    outcome: AttemptOutcome::Unavailable,
                    usage: (rng.below(2) == 0).then(Usage::default),
                    prices: Some(deployment_prices),
                    error: Some(TaskError::new(ErrorCode::ProviderError, "HTTP 503")),
                };
                if !s.end_attempt(id, n, &end).await.expect("end_attempt") {
                    seen.lock().unwrap().lost_leases += 1;
                    return;
                }
                if n >= max_attempts {
                    let t = s
                        .fail_task(id, Some(&held), ErrorCode::ProviderError, "HTTP 503", None)
                        .await
                        .expect("fail");
                    end_task(t.applied);
                    return;
                }
                index = (index + 1) % DEPLOYMENTS.len();
            }
            // The worker crashes mid-call: nothing more is written for this task.
            _ => {
                seen.lock().unwrap().crashes += 1;
                return;
            }
        }
    }
}

/// docs/routes.md, "What is charged when": 0 overshoots of a scope's USD limit while
/// attempts with fallbacks and crashes race admissions across store instances, and the
/// settled spend is exactly the sum of the attempts' charges.
pub async fn racing_attempts_with_fallbacks_and_crashes_never_exceed_a_spend_limit(
    b: &dyn Backend,
) {
    let seed = std::env::var("TOLLGATE_RACE_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
                | 1
        });
    eprintln!("racing attempts: TOLLGATE_RACE_SEED={seed}");
    let stores = open_stores(b, INSTANCES).await;
    let limited = cost_budget(Some(LIMIT as u64), None, None);
    let dearest = attempt_reservation(INPUT, OUTPUT, Some(prices(3)));
    let seen = Arc::new(Mutex::new(Seen::default()));
    let next_task = Arc::new(AtomicUsize::new(0));
    // Admissions answered (admitted or refused).
    let answered = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let observations = Arc::new(AtomicU64::new(0));
    let mut racers = Vec::new();
    for i in 0..WORKERS {
        let s = stores[i % INSTANCES].clone();
        let (seen, next_task, stop) = (seen.clone(), next_task.clone(), stop.clone());
        let answered = answered.clone();
        let w = worker(&format!("w{i}"));
        let mut rng = Rng(seed.wrapping_mul(i as u64 + 1) | 1);
        racers.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                // Admissions race the attempts.
                if rng.below(3) == 0 {
                    let k = next_task.fetch_add(1, Ordering::SeqCst);
                    if k < TASKS {
                        let mut new =
                            priced_task("acme", "race", &format!("t{k}"), "doc", limited, dearest);
                        // One task in eight is at most once.
                        let tries = if k % 8 == 0 { 1 } else { 3 };
                        new.max_attempts = MaxAttempts::new(tries).expect("1..=20");
                        match s.create_task(new).await {
                            Ok(c) => {
                                assert!(c.created);
                                seen.lock().unwrap().admitted.insert(c.task.id);
                            }
                            Err(StoreError::Cost(c)) => {
                                assert_eq!(c.code(), ErrorCode::SpendBudget, "{c}");
                                seen.lock().unwrap().admissions_refused += 1;
                            }
                            Err(e) => panic!("only the budget may refuse an admission: {e:?}"),
                        }
                        answered.fetch_add(1, Ordering::SeqCst);
                    }
                }
                let claimed = s.claim_next(&w, 1).await.expect("claim_next");
                for t in claimed {
                    work(&*s, &w, &t, &mut rng, &seen).await;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    // The observer: settled + reserved within the limit at every instant it looks.
    let observer = {
        let (s, stop, observations) = (stores[1].clone(), stop.clone(), observations.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let spent = s
                    .spend(&app("acme"), Some(&scope("race")))
                    .await
                    .expect("spend");
                assert!(
                    spent.settled_nano + spent.reserved_nano <= LIMIT,
                    "settled {} + reserved {} over the limit {LIMIT}",
                    spent.settled_nano,
                    spent.reserved_nano
                );
                observations.fetch_add(1, Ordering::SeqCst);
                tokio::task::yield_now().await;
            }
        })
    };
    // The sweeper: time moves 7 s a round; a task silent for 30 s goes back to the
    // queue with tries left, or fails.
    let config = sweeps_config();
    let mut rounds = 0usize;
    loop {
        rounds += 1;
        // Under 24 h of time, so that every task stays in the spend window.
        assert!(rounds < 10_000, "the race did not end");
        b.clock().advance(secs(7));
        let s = &stores[rounds % INSTANCES];
        let report = sweep_all(&**s, &config).await;
        {
            let mut seen = seen.lock().unwrap();
            seen.requeued += report.requeued.len();
            for id in report.finished {
                *seen.ended.entry(id).or_default() += 1;
            }
        }
        tokio::task::yield_now().await;
        if answered.load(Ordering::SeqCst) < TASKS || !rounds.is_multiple_of(8) {
            continue;
        }
        let admitted: Vec<TaskId> = seen.lock().unwrap().admitted.iter().copied().collect();
        let mut open = 0;
        for id in admitted {
            let t = get(&*stores[0], &app("acme"), id).await;
            open += usize::from(matches!(t.status, TaskStatus::Queued | TaskStatus::Running));
        }
        if open == 0 {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    for r in racers {
        r.await.expect("a worker panicked");
    }
    observer.await.expect("the observer saw an overshoot");

    let s = &*stores[0];
    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let spent = s
        .spend(&app("acme"), Some(&scope("race")))
        .await
        .expect("spend");
    assert_eq!(
        (spent.reserved_nano, spent.reserved_tokens),
        (0, 0),
        "every task ended: nothing stays reserved"
    );
    assert!(spent.settled_nano <= LIMIT);
    let mut charged = 0i64;
    for &id in &seen.admitted {
        let t = get(s, &app("acme"), id).await;
        assert!(t.status.is_terminal(), "{id} is {:?}", t.status);
        assert_eq!(
            seen.ended.get(&id).copied(),
            Some(1),
            "{id} ended exactly once ({:?})",
            t.status
        );
        let attempts = s.task_attempts(&app("acme"), id).await.expect("attempts");
        assert!(
            attempts.len() <= t.max_attempts.get() as usize,
            "{id}: {} attempts, at most {}",
            attempts.len(),
            t.max_attempts.get()
        );
        for (i, a) in attempts.iter().enumerate() {
            assert_eq!(a.n as usize, i + 1, "{id}: attempts numbered in order");
            assert!(
                a.ended_at.is_some() && a.outcome != AttemptOutcome::Running,
                "{id}: attempt {} still open after its task ended",
                a.n
            );
            assert!(
                a.charged.nano_usd <= a.reserved.nano_usd,
                "{id}: attempt {} charged {} over its reservation {}",
                a.n,
                a.charged.nano_usd,
                a.reserved.nano_usd
            );
            charged += a.charged.nano_usd;
        }
        if t.status == TaskStatus::Succeeded {
            assert_eq!(
                attempts.last().map(|a| a.outcome),
                Some(AttemptOutcome::Succeeded),
                "{id}: a succeeded task's last attempt succeeded"
            );
        }
    }
    assert_eq!(
        spent.settled_nano, charged,
        "the settled spend is the sum of the attempts' charges"
    );
    let total_ended: usize = seen.ended.values().sum();
    assert_eq!(total_ended, seen.admitted.len(), "no task ended twice");
    eprintln!(
        "racing attempts: {} admitted, {} admissions refused, {} attempts refused, {} \
         unavailable, {} crashes, {} requeued, {} lost leases, {} succeeded, {} observations, \
         {rounds} sweeps, settled {} of {LIMIT}",
        seen.admitted.len(),
        seen.admissions_refused,
        seen.attempts_refused,
        seen.unavailable,
        seen.crashes,
        seen.requeued,
        seen.lost_leases,
        seen.succeeded,
        observations.load(Ordering::SeqCst),
        spent.settled_nano
    );
    assert!(
        seen.admissions_refused > 0
            && seen.attempts_refused > 0
            && seen.unavailable > 0
            && seen.crashes > 0
            && seen.requeued > 0
            && seen.succeeded > 0
            && observations.load(Ordering::SeqCst) > 0,
        "every path must be taken: admissions and later attempts refused, fallbacks, \
         crashes followed by requeues, successes"
    );
}
