//! docs/conformance.md#fair-share fair claims do not depend on how fast claims come. A store instance plans
//! its claims from its recent view of the active queues for a period (`queue_view_ttl`,
//! 50 ms by default) and reads them again after it; the suite's
//! `a_flood_of_new_queues_shares_one_burst` runs at the default, where the machine's
//! speed decides which claims fall inside the period. Here its scenario
//! ([`flood_shares_one_burst`]) runs on two fresh databases of each backend, once with
//! every claim inside the period (an hour) and once with every claim reading the queues
//! (zero): both keep the flood to one burst and alternate after it, and claim the same
//! scopes batch by batch. (Before the fix the view, a read of the least passes, served
//! `live` alone once its flood queues were drained: live 258, flood 29.)
//!
//! PostgreSQL is skipped (with a notice) without `TOLLGATE_TEST_DATABASE_URL`;
//! `TOLLGATE_REQUIRE_POSTGRES=1` fails instead.

use std::sync::Arc;
use std::time::Duration;
use tollgate_conformance::START;
use tollgate_conformance::dispatch::flood_shares_one_burst;
use tollgate_core::ManualClock;
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};

/// Longer than any run of the scenario: every claim plans from the view while it can.
const EVERY_CLAIM_INSIDE: Duration = Duration::from_secs(3600);
/// Every claim reads the queues (and writes its pass moves before it returns).
const EVERY_CLAIM_READS: Duration = Duration::ZERO;

/// The scenario's claims on a fresh SQLite database with this view period.
async fn sqlite_flood(ttl: Duration) -> Vec<Vec<String>> {
    let dir = tempfile::tempdir().expect("temporary folder");
    let clock = ManualClock::new(START);
    let options = SqliteOptions::new(dir.path().join("tollgate.db"))
        .with_clock(Arc::new(clock.clone()))
        .with_queue_view_ttl(ttl);
    let store = SqliteStore::open(options).await.expect("open SQLite");
    let claims = flood_shares_one_burst(&store, &clock).await;
    store.close().await;
    claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_flood_claims_are_the_same_at_any_claim_timing() {
    let inside = sqlite_flood(EVERY_CLAIM_INSIDE).await;
    let reading = sqlite_flood(EVERY_CLAIM_READS).await;
    assert_eq!(
        inside, reading,
        "claims inside the view period and claims reading the queues took different scopes"
    );
}

/// The scenario's claims on a fresh PostgreSQL schema with this view period.
async fn postgres_flood(url: &str, ttl: Duration) -> Vec<Vec<String>> {
    let schema = format!("view_{}", uuid::Uuid::new_v4().simple());
    let clock = ManualClock::new(START);
    let mut options = PostgresOptions::new(url.to_owned())
        .with_clock(Arc::new(clock.clone()))
        .with_schema(schema.clone())
        .with_queue_view_ttl(ttl);
    options.max_connections = 4;
    let store = PostgresStore::open(options).await.expect("open PostgreSQL");
    let claims = flood_shares_one_burst(&store, &clock).await;
    store.close().await;
    let pool = sqlx::PgPool::connect(url).await.expect("connect to drop");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(&pool)
    .await
    .expect("drop the test's schema");
    pool.close().await;
    claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_flood_claims_are_the_same_at_any_claim_timing() {
    let Some(url) = tollgate_conformance::postgres_url(
        "postgres_flood_claims_are_the_same_at_any_claim_timing",
    ) else {
        return;
    };
    let inside = postgres_flood(&url, EVERY_CLAIM_INSIDE).await;
    let reading = postgres_flood(&url, EVERY_CLAIM_READS).await;
    assert_eq!(
        inside, reading,
        "claims inside the view period and claims reading the queues took different scopes"
    );
}
