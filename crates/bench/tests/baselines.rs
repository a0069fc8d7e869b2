//! The baselines `tollgate bench` measures Tollgate against, checked on SQLite (moved here
//! from the store's SQLite tests with the baselines themselves).

use std::sync::Arc;
use tollgate_bench::baseline::{Baseline, ReferenceOutcome};
use tollgate_core::{ManualClock, Timestamp};
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

/// The manual clock's start (the conformance suite's `START`: 2026-01-01T00:00:00Z).
const START: Timestamp = Timestamp(1_767_225_600_000);

fn options(path: &std::path::Path, clock: &ManualClock) -> SqliteOptions {
    SqliteOptions::new(path).with_clock(Arc::new(clock.clone()))
}

/// The benchmark's baselines must be honest competitors: the reference admission enforces
/// its limits, the raw lifecycle moves a task through, the raw cache hit finds the seed.
#[tokio::test]
async fn benchmark_baselines_work() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(START);
    let store = SqliteStore::open(options(&dir.path().join("b.db"), &clock))
        .await
        .unwrap();
    let b = Baseline::sqlite(&store);
    b.prepare().await.unwrap();
    let budget = tollgate_core::Budget::new(100, 100, 2, 100, 100, 60).unwrap();
    let mut outcomes = Vec::new();
    for i in 0..3 {
        outcomes.push(
            b.reference_admit(
                "a",
                "s",
                &format!("src{i}"),
                &format!("lk{i}"),
                &format!("k{i}"),
                &budget,
                START,
            )
            .await
            .unwrap(),
        );
    }
    assert_eq!(
        outcomes,
        vec![
            ReferenceOutcome::Admitted,
            ReferenceOutcome::Admitted,
            ReferenceOutcome::Refused
        ],
        "scope_concurrent = 2"
    );
    let id = b.raw_insert("a", "raw-1", "{}", START).await.unwrap();
    let claimed = b.raw_claim("w", START).await.unwrap();
    assert!(claimed.is_some());
    let claimed = claimed.unwrap();
    b.raw_complete(&claimed, "{}", START).await.unwrap();
    assert!(
        b.raw_complete(&claimed, "{}", START).await.is_err(),
        "completed once"
    );
    let _ = id;
    b.seed_cached("a", "s", "ck", START).await.unwrap();
    assert!(
        b.raw_cache_hit("a", "s", "ck", "copy-1", START)
            .await
            .unwrap()
    );
    assert!(
        !b.raw_cache_hit("a", "s", "missing", "copy-2", START)
            .await
            .unwrap()
    );
}
