//! PostgreSQL test schemas, shared by the store's backend tests and the conformance
//! crate's replica races (`#[path]`-included by both, so neither test crate depends on
//! the other).

use std::sync::Arc;
use tollgate_core::ManualClock;
use tollgate_store::postgres::PostgresOptions;

/// The test database's URL, or `None` (with a notice) to skip; with
/// `TOLLGATE_REQUIRE_POSTGRES=1` a missing URL fails instead.
pub fn database_url(test: &str) -> Option<String> {
    match std::env::var("TOLLGATE_TEST_DATABASE_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            if std::env::var("TOLLGATE_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
                panic!("TOLLGATE_REQUIRE_POSTGRES=1 but TOLLGATE_TEST_DATABASE_URL is not set");
            }
            eprintln!("skipping {test}: TOLLGATE_TEST_DATABASE_URL is not set");
            None
        }
    }
}

/// A fresh schema, dropped at the end.
pub struct Schema {
    url: String,
    /// The schema's name.
    pub name: String,
}

impl Schema {
    pub fn new(url: &str, test: &str) -> Schema {
        Schema {
            url: url.to_string(),
            name: format!("b_{test}_{}", uuid::Uuid::new_v4().simple()),
        }
    }

    pub fn options(&self, clock: &ManualClock) -> PostgresOptions {
        let mut o = PostgresOptions::new(self.url.clone())
            .with_clock(Arc::new(clock.clone()))
            .with_schema(self.name.clone());
        o.max_connections = 4;
        o
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                if let Ok(pool) = sqlx::PgPool::connect(&url).await {
                    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                        "DROP SCHEMA IF EXISTS \"{name}\" CASCADE"
                    )))
                    .execute(&pool)
                    .await;
                }
            });
        })
        .join();
    }
}
