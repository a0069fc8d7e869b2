//! The conformance suite on PostgreSQL. Every test gets its own fresh schema in the
//! database named by `TOLLGATE_TEST_DATABASE_URL`, so tests run in parallel. Without the
//! variable the tests print a notice and pass as skipped; with
//! `TOLLGATE_REQUIRE_POSTGRES=1` (as CI sets) a missing variable fails instead.

use async_trait::async_trait;
use std::sync::Arc;
use std::time::Duration;
use tollgate_conformance::{Backend, START};
use tollgate_core::ManualClock;
use tollgate_store::Store;
use tollgate_store::postgres::{PostgresOptions, PostgresStore};

/// One test's schema.
struct PostgresBackend {
    url: String,
    schema: String,
    clock: ManualClock,
}

#[async_trait]
impl Backend for PostgresBackend {
    async fn open(&self) -> Arc<dyn Store> {
        let mut options = PostgresOptions::new(self.url.clone())
            .with_clock(Arc::new(self.clock.clone()))
            .with_schema(self.schema.clone());
        // Tests open several instances in parallel: keep each pool small.
        options.max_connections = 6;
        options.acquire_timeout = Duration::from_secs(60);
        let store = PostgresStore::open(options)
            .await
            .unwrap_or_else(|e| panic!("cannot open schema {}: {e}", self.schema));
        Arc::new(store)
    }

    fn clock(&self) -> &ManualClock {
        &self.clock
    }
}

async fn backend(test_name: &str) -> Option<PostgresBackend> {
    let url = tollgate_conformance::postgres_url(test_name)?;
    let short: String = test_name
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
        .take(40)
        .collect();
    let schema = format!("t_{short}_{}", uuid::Uuid::new_v4().simple());
    Some(PostgresBackend {
        url,
        schema: schema.to_ascii_lowercase(),
        clock: ManualClock::new(START),
    })
}

tollgate_conformance::conformance_suite!(backend);

impl Drop for PostgresBackend {
    /// Drops the test's schema so repeated runs leave nothing behind.
    fn drop(&mut self) {
        let url = self.url.clone();
        let schema = self.schema.clone();
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                if let Ok(pool) = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(1)
                    .connect(&url)
                    .await
                {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                    )))
                    .execute(&pool)
                    .await;
                    pool.close().await;
                }
            });
        })
        .join();
    }
}
