//! docs/conformance.md#provider-pace provider pace, in real time against the scripted fake OpenAI-compatible
//! server: several engines on one PostgreSQL database share the provider's pace, so the
//! fake (which answers 429 above N calls per window) never has to refuse a call, and a
//! 429 with `Retry-After` stops every engine until then.
//!
//! The pace window is shortened (`pace_window`) so a "per minute" pace runs in seconds;
//! each test stops by itself within about a minute.

mod common;

use common::*;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tollgate_core::TaskStatus;
use tollgate_engine::config::Limit;
use tollgate_engine::{EngineConfig, Submission, Tollgate};

/// The fake's limit: at most `per_window` calls per `window`, enforced as a token bucket
/// of 5 calls (a provider quantizing its per-minute limit to short periods, as OpenAI
/// documents). It tolerates 200 ms of scheduling jitter (this test shares a loaded
/// machine with three engines and the fake itself) but not a client faster than the
/// limit: 10 % too fast drains it within two seconds.
struct Limiter {
    per_window: f64,
    window: Duration,
    capacity: f64,
    tokens: f64,
    at: Instant,
    refused: usize,
}

impl Limiter {
    fn admit(&mut self, now: Instant) -> bool {
        let refill = now.duration_since(self.at).as_secs_f64() / self.window.as_secs_f64();
        self.tokens = (self.tokens + refill * self.per_window).min(self.capacity);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            self.refused += 1;
            false
        }
    }
}

/// The two tests measure real time: they run one at a time, not beside each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn limited_fake(fake: &FakeOpenAi, per_window: u32, window: Duration) -> Arc<Mutex<Limiter>> {
    let limiter = Arc::new(Mutex::new(Limiter {
        per_window: f64::from(per_window),
        window,
        capacity: 5.0,
        tokens: 5.0,
        at: Instant::now(),
        refused: 0,
    }));
    let l = limiter.clone();
    fake.respond(move |_body: &Value| {
        if l.lock().unwrap().admit(Instant::now()) {
            Reply::Content(r#"{"label": "spam"}"#.into())
        } else {
            Reply::Status(429, Some("1"))
        }
    });
    limiter
}

fn paced_config(fake: &FakeOpenAi, per_window: u32, window: Duration) -> EngineConfig {
    let mut c = fake_config(fake);
    c.workers.concurrency = 8;
    // Tasks wait for their turn while running: a loaded machine must not declare them
    // dead (the fast test liveness timeout is 400 ms).
    c.workers.heartbeat_interval = Duration::from_millis(200);
    c.sweeper.liveness_timeout = Duration::from_secs(10);
    let provider = c.providers.get_mut("fake").expect("fake provider");
    provider.requests_per_minute = Some(Limit::Integer(i64::from(per_window)));
    provider.pace_window = window;
    // A 429 must never fail a paced task, however long its Retry-After.
    provider.max_retry_delay = Duration::from_millis(100);
    c
}

async fn submit_all(engine: &Tollgate, n: usize, tag: &str) -> Vec<tollgate_core::TaskId> {
    let mut ids = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let batch: Vec<Submission> = (i..n.min(i + 500))
            .map(|j| classify(&format!("{tag}-{j}"), &format!("message {j}")))
            .collect();
        i += batch.len();
        for r in engine.submit_many(batch).await.expect("submit_many") {
            ids.push(r.expect("submitted").task.id);
        }
    }
    ids
}

async fn all_finished(engine: &Tollgate, ids: &[tollgate_core::TaskId], limit: Duration) {
    let deadline = Instant::now() + limit;
    for id in ids {
        loop {
            let t = engine.get(&app(), *id).await.expect("get").expect("task");
            if !matches!(t.status, TaskStatus::Queued | TaskStatus::Running) {
                assert_eq!(t.status, TaskStatus::Succeeded, "{:?}", t.error);
                break;
            }
            assert!(
                Instant::now() < deadline,
                "tasks did not finish in {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// docs/conformance.md#provider-pace: with the provider paced at N calls per window, three engines on one
/// PostgreSQL database send 1,000 tasks' calls without a single 429 from a fake that
/// refuses calls above N per window, and use at least 90 % of N.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn engines_sharing_a_pace_never_collect_a_429_and_use_90_percent_of_it() {
    let Some(db) = TestDb::postgres("pace_shared") else {
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    const N: u32 = 25;
    const TASKS: usize = 1_000;
    let window = Duration::from_secs(1);
    let fake = FakeOpenAi::start().await;
    let limiter = limited_fake(&fake, N, window);
    let mut engines = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..3 {
        let engine = db.engine(paced_config(&fake, N, window)).await;
        handles.push(engine.start().await.expect("start"));
        engines.push(engine);
    }
    let ids = submit_all(&engines[0], TASKS, "paced").await;
    all_finished(&engines[0], &ids, Duration::from_secs(90)).await;
    let requests = fake.requests();
    let refused = limiter.lock().unwrap().refused;
    if refused > 0 {
        // Which arrivals came too close: the gaps around each refusal.
        let times: Vec<Instant> = requests.iter().map(|(t, _)| *t).collect();
        let gaps: Vec<u128> = times
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_millis())
            .collect();
        eprintln!("arrival gaps (ms): {gaps:?}");
    }
    assert_eq!(refused, 0, "the paced engines collected {refused} 429s");
    assert_eq!(requests.len(), TASKS, "one call per task");
    let first = requests.first().expect("calls").0;
    let last = requests.last().expect("calls").0;
    let rate = (requests.len() - 1) as f64 / last.duration_since(first).as_secs_f64();
    let pace = f64::from(N) / window.as_secs_f64();
    eprintln!(
        "{} calls, 0 refused, {rate:.2} calls/s of a {pace:.1} calls/s pace ({:.1} %)",
        requests.len(),
        100.0 * rate / pace
    );
    assert!(
        rate >= 0.9 * pace,
        "the engines reached {rate:.1} calls/s of a {pace:.1} calls/s pace"
    );
    assert!(
        rate <= pace * 1.02,
        "faster than the pace: {rate:.1} calls/s"
    );
    for h in handles {
        h.shutdown(Duration::from_secs(5)).await;
    }
}

/// docs/conformance.md#provider-pace: a 429 with `Retry-After` pauses the provider on every replica until then:
/// after the fake answers one 429 with `Retry-After: 2`, no engine calls it again
/// within those 2 s (beyond calls already on the wire when the pause was recorded), and
/// the paced task still succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_429_with_retry_after_pauses_every_engine_until_then() {
    let Some(db) = TestDb::postgres("pace_pause") else {
        return;
    };
    let _alone = ONE_AT_A_TIME.lock().await;
    const N: u32 = 50;
    let window = Duration::from_secs(1);
    let fake = FakeOpenAi::start().await;
    let refused_at: Arc<Mutex<Option<Instant>>> = Arc::new(Mutex::new(None));
    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    {
        let refused_at = refused_at.clone();
        let served = served.clone();
        fake.respond(move |_| {
            let n = served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if n == 40 {
                *refused_at.lock().unwrap() = Some(Instant::now());
                Reply::Status(429, Some("2"))
            } else {
                Reply::Content(r#"{"label": "ham"}"#.into())
            }
        });
    }
    let mut engines = Vec::new();
    let mut handles = Vec::new();
    for _ in 0..3 {
        let engine = db.engine(paced_config(&fake, N, window)).await;
        handles.push(engine.start().await.expect("start"));
        engines.push(engine);
    }
    let ids = submit_all(&engines[0], 150, "pause").await;
    all_finished(&engines[0], &ids, Duration::from_secs(60)).await;
    let at = refused_at.lock().unwrap().expect("the 429 was answered");
    let grace = Duration::from_millis(150);
    let during: Vec<Duration> = fake
        .requests()
        .iter()
        .filter(|(t, _)| *t > at + grace && *t < at + Duration::from_secs(2))
        .map(|(t, _)| t.duration_since(at))
        .collect();
    assert!(
        during.is_empty(),
        "{} calls reached the provider during its 2 s pause, at {:?} after the 429",
        during.len(),
        &during[..during.len().min(5)]
    );
    let after = fake
        .requests()
        .iter()
        .filter(|(t, _)| *t >= at + Duration::from_secs(2))
        .count();
    assert!(after > 0, "calls resumed after the pause");
    assert_eq!(
        fake.requests().len(),
        151,
        "150 tasks, one of them called twice (the 429, then after the pause)"
    );
    for h in handles {
        h.shutdown(Duration::from_secs(5)).await;
    }
}
