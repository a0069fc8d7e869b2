//! The PostgreSQL backend: any number of Tollgate replicas on one database.
//!
//! # Locking design
//!
//! Correctness comes from transactions (READ COMMITTED), row locks, `FOR UPDATE SKIP
//! LOCKED` and transaction-scoped advisory locks per (app, scope) — never one lock for
//! everything. `docs/locking.md` has the same text with examples.
//!
//! | lock | taken by | protects |
//! | --- | --- | --- |
//! | advisory `(app, scope)`, exclusive | scoped creation, owner deletion | the scope's admission facts (bucket, distinct sources, steps per source, scope concurrency) and "no task of the owner slips in during deletion" |
//! | advisory `(app, scope)`, shared | unscoped application-owned creation | only the deletion guarantee: unscoped creations of a scope run in parallel with each other |
//! | `runs` row, `FOR SHARE` | run-owned creation | a run canceled concurrently either sees the new task in its cascade or the creation sees the cancel |
//! | `scope_state` row | admission (upsert), tasks leaving queued/running (decrement) | the scope's counters; row lock only, same-scope traffic only |
//! | one `global_slots` stripe | the **last** statement of an admission, until its commit | the global concurrency cap: a conditional increment within the stripe's allowance, held for one statement and the commit, never across the admission's reads |
//! | every `global_slots` stripe, in order | an admission retried after its stripe's allowance ran out | the exact recount and fresh allowances (`admission::slots::take_slot_rebalancing`) |
//! | `global_finished` stripe rows | tasks leaving queued/running | the other half of the global count; 64 stripes, so finishing never contends with admitting |
//! | `app_slots` rows (one per (app, stripe), several only in stripe order), and the share pool's advisory lock for a lent slot | admission (its final statement: stripe 0 for an app with a share, one of 1–15 for one without; or the rebalancing path: every row of the app), tasks leaving queued/running (stripe 0) | each app's share of the global capacity (docs/budgets.md) |
//! | task rows | claim, transitions, sweeps (`SKIP LOCKED`) | one claim per task, terminal states final |
//! | task rows `FOR KEY SHARE` (a `stream_chunks` insert's foreign key check) | the stream log writer, in task id order | a chunk never outlives its task |
//! | `dispatch_queues` rows (several only in (app, scope) order) | creation of a queued task (from its insert to its commit, even when nothing changes), the pass moves a store instance's fair claims owe (one statement per read of its queue view, `SKIP LOCKED`), deactivation of the queues a fair claim found empty (one batch per store instance after the claim, rows locked in (app, scope) order with `SKIP LOCKED`, then a fresh-snapshot check for queued tasks) | docs/conformance.md#fair-share: a queue with a queued task is never inactive; virtual times count every claim |
//!
//! **Lock order** (every transaction takes locks in this order, and never more than one
//! of a kind except where noted): advisory `(app, scope)` → `runs` row → existing task
//! rows (several only in id order) → new task rows → `dispatch_queues` rows (several
//! only in (app, scope) order) → `scope_state` rows (several only in
//! sorted (app, scope) order) → spend buckets → share pool advisory lock → `app_slots`
//! rows (in stripe order) → `global_slots` (one, or all in order) → `global_finished` (one stripe). Sweeps take no advisory lock and skip locked rows (runs too), so they never
//! wait on a replica. Because every transaction acquires in
//! the same order, no cycle of waits can form, so no deadlock; the only wait between
//! different scopes is a shared slot stripe during an admission's final statement and
//! commit, or a rebalance.
//!
//! The global count is `Σ admitted − Σ finished`. Allowances are handed out from an
//! exact recount under every stripe's lock; a concurrent finish that the recount cannot
//! see yet only makes the count look higher, so the cap can reject early by a hair but is
//! never exceeded.

mod admission;
mod deactivate;
mod dispatch;
mod hot;
mod lifecycle;
mod maintenance;
pub mod notify;
mod pace;
mod pipelines;
mod runs;
mod stats;
mod tasks;
mod terminal;

use crate::{StoreError, StoreResult};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Clock, Timestamp};

/// How long a pooled connection may sit idle and still be used without a ping first
/// (see the pool's options in [`PostgresStore::open`]).
const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

/// SQL for "now" in epoch milliseconds inside one statement: parameter `$n` (the
/// [`PostgresStore::fixed_now`] clock) when bound, else the database's clock.
macro_rules! now_sql {
    ($n:literal) => {
        concat!(
            "COALESCE($",
            $n,
            "::BIGINT, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT)"
        )
    };
}
pub(crate) use now_sql;

/// The migrations this binary ships.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/postgres");

/// How to connect to PostgreSQL.
#[derive(Debug, Clone)]
pub struct PostgresOptions {
    /// `postgres://user@host:port/database`.
    pub url: String,
    /// Where "now" comes from: `None` (the default) reads the database's clock, the one
    /// clock all replicas share; tests pass a [`tollgate_core::ManualClock`].
    pub clock: Option<Arc<dyn Clock>>,
    /// Pool size.
    pub max_connections: u32,
    /// How long a call waits for a connection before failing as unavailable.
    pub acquire_timeout: Duration,
    /// Schema to use (`search_path`); `None` keeps the server's default. Tests use a
    /// fresh schema each.
    pub schema: Option<String>,
    /// `application_name` of the connections (shows in `pg_stat_activity`).
    pub application_name: String,
    /// The order `claim_next` claims in (docs/conformance.md#fair-share; default fair).
    pub claim_order: crate::ClaimOrder,
    /// docs/conformance.md#fair-share: how long this instance's fair claims reuse its last read of the active
    /// queues (default 50 ms; other instances' new queues and claims show after at most
    /// this long). Zero reads them for every claim and writes each claim's pass moves
    /// before it returns: for tests that compare several instances with a model of the
    /// database.
    pub queue_view_ttl: Duration,
}

impl PostgresOptions {
    /// Defaults: database clock, 16 connections, 10 s acquire timeout.
    pub fn new(url: impl Into<String>) -> PostgresOptions {
        PostgresOptions {
            url: url.into(),
            clock: None,
            max_connections: 16,
            acquire_timeout: Duration::from_secs(10),
            schema: None,
            application_name: "tollgate".to_string(),
            claim_order: crate::ClaimOrder::Fair,
            queue_view_ttl: crate::shared::dispatch::QUEUE_VIEW_TTL,
        }
    }

    /// Reuses a read of the active queues for this long ([`Self::queue_view_ttl`]).
    pub fn with_queue_view_ttl(mut self, ttl: Duration) -> PostgresOptions {
        self.queue_view_ttl = ttl;
        self
    }

    /// Uses another clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> PostgresOptions {
        self.clock = Some(clock);
        self
    }

    /// Uses a schema (created if missing).
    pub fn with_schema(mut self, schema: impl Into<String>) -> PostgresOptions {
        self.schema = Some(schema.into());
        self
    }
}

/// The PostgreSQL [`Store`].
#[derive(Debug, Clone)]
pub struct PostgresStore {
    pool: PgPool,
    clock: Option<Arc<dyn Clock>>,
    claim_order: crate::ClaimOrder,
    /// docs/conformance.md#fair-share: this instance's recent view of the active queues.
    queue_view: Arc<crate::shared::dispatch::QueueView>,
    /// docs/conformance.md#fair-share: this instance's deactivation batches of empty
    /// queues (`deactivate.rs`).
    deactivation: Arc<deactivate::Deactivation>,
    /// Keeps the planner's statistics in step with fast-growing tables.
    stats: Arc<stats::StatsWatch>,
    /// Creations of one scope made together (docs/locking.md, "Creations made
    /// together").
    groups: Arc<crate::shared::group::Groups>,
    /// Completions in one statement (docs/locking.md, "Completions in one statement"):
    /// how many, and when a guess last failed to hold.
    guesses: Arc<lifecycle::Guesses>,
    /// Creations in one statement (docs/locking.md, "A creation in one statement"): how
    /// many were made so, and how many found their facts changed.
    one_statement: Arc<admission::OneStatement>,
    /// Connections for lone statements, kept beside the pool (docs/locking.md,
    /// "Connections for lone statements").
    hot: Arc<hot::HotConnections>,
}

type Tx = Transaction<'static, Postgres>;

/// Connections kept beside a pool of `max_connections` for lone statements (docs/locking.md,
/// "Connections for lone statements"): one per eight of the pool's, one to four.
fn hot_connections(max_connections: u32) -> usize {
    (max_connections / 8).clamp(1, 4) as usize
}

impl PostgresStore {
    /// The same store (same pool) claiming in another order (docs/conformance.md#fair-share; benchmarks
    /// compare fair and oldest-first claiming on one database).
    pub fn with_claim_order(mut self, order: crate::ClaimOrder) -> PostgresStore {
        self.claim_order = order;
        self
    }

    /// Connects, creates the schema if asked, and applies migrations (safe when several
    /// replicas start at once: the migrator holds an advisory lock). A database whose
    /// schema is newer than this binary knows is refused with [`StoreError::SchemaTooNew`].
    pub async fn open(options: PostgresOptions) -> StoreResult<PostgresStore> {
        let mut connect = PgConnectOptions::from_str(&options.url)
            .map_err(|e| StoreError::Database(format!("invalid database url: {e}")))?
            .application_name(&options.application_name)
            // Not sent: connection poolers (PgBouncer) refuse the startup parameter, and
            // every value is read in binary, where it changes nothing (docs/operations:
            // README "PgBouncer").
            .extra_float_digits(None);
        if let Some(schema) = &options.schema {
            if !schema
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                return Err(StoreError::Database(format!(
                    "schema name {schema:?} must be ASCII letters, digits and _"
                )));
            }
            let admin = PgPoolOptions::new()
                .max_connections(1)
                .acquire_timeout(options.acquire_timeout)
                .connect_with(connect.clone())
                .await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "CREATE SCHEMA IF NOT EXISTS \"{schema}\""
            )))
            .execute(&admin)
            .await
            .or_else(|e| match &e {
                // Two replicas creating the same schema at once: one wins, both proceed.
                sqlx::Error::Database(db) if db.code().as_deref() == Some("23505") => {
                    Ok(sqlx::postgres::PgQueryResult::default())
                }
                _ => Err(e),
            })?;
            admin.close().await;
            connect = connect.options([("search_path", schema.as_str())]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .acquire_timeout(options.acquire_timeout)
            // sqlx pings every connection as it goes back to the pool (that ping stays),
            // and by default again as it comes out: a round trip before every statement
            // or transaction. A connection that came back moments ago was just checked,
            // so only one idle for a while (the server may have closed it meanwhile) is
            // pinged before use; a broken one is then dropped and another taken.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for >= PING_IDLE_AFTER {
                        sqlx::Connection::ping(conn).await?;
                    }
                    Ok(true)
                })
            })
            .connect_with(connect)
            .await?;
        crate::shared::sql::check_schema_version(
            pool.clone(),
            &MIGRATOR,
            "SELECT CAST(1 AS BIGINT) WHERE to_regclass('_sqlx_migrations') IS NOT NULL",
        )
        .await?;
        MIGRATOR.run(&pool).await?;
        let hot = hot::HotConnections::new(
            pool.clone(),
            hot_connections(options.max_connections),
            PING_IDLE_AFTER,
        );
        Ok(PostgresStore {
            pool,
            clock: options.clock,
            claim_order: options.claim_order,
            queue_view: Arc::new(crate::shared::dispatch::QueueView::with_ttl(
                options.queue_view_ttl,
            )),
            deactivation: Arc::default(),
            stats: Arc::default(),
            groups: Arc::default(),
            guesses: Arc::default(),
            one_statement: Arc::default(),
            hot: Arc::new(hot),
        })
    }

    /// The connection pool (for tests and benchmarks that inspect the database).
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// How many queues this instance owes pass moves to (docs/conformance.md#fair-share:
    /// its claims' moves not yet written; for diagnostics and tests).
    pub fn owed_pass_moves(&self) -> usize {
        self.queue_view.debt().len()
    }

    /// How many creations this instance made together with others of their scope, in
    /// one transaction (docs/locking.md, "Creations made together"; for
    /// diagnostics and tests).
    pub fn created_together(&self) -> u64 {
        self.groups.together()
    }

    /// How many tasks this instance completed in one statement with their settlement
    /// (docs/locking.md, "Completions in one statement"; for diagnostics and tests).
    pub fn completed_in_one_statement(&self) -> u64 {
        self.guesses.held.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many creations this instance made in one statement, and how many of those it
    /// tried found the facts they were decided on changed and took the transaction
    /// instead (docs/locking.md, "A creation in one statement"; for diagnostics and
    /// tests).
    pub fn created_in_one_statement(&self) -> (u64, u64) {
        self.one_statement.counts()
    }

    async fn begin(&self) -> StoreResult<Tx> {
        Ok(self.pool.begin().await?)
    }

    /// The configured clock's "now", or `None` when the database's clock is the clock:
    /// bound as the parameter of [`now_sql!`] so a single statement reads "now" itself
    /// instead of costing a round trip of its own.
    fn fixed_now(&self) -> Option<i64> {
        self.clock.as_ref().map(|c| c.now().0)
    }

    /// "Now" for a transaction: the configured clock, or the database's.
    async fn now(&self, tx: &mut Tx) -> StoreResult<Timestamp> {
        match &self.clock {
            Some(c) => Ok(c.now()),
            None => {
                let ms: i64 = sqlx::query_scalar(
                    "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT",
                )
                .fetch_one(&mut **tx)
                .await?;
                Ok(Timestamp(ms))
            }
        }
    }

    /// How many connections this instance keeps beside its pool for lone statements
    /// (docs/locking.md, "Connections for lone statements"; for diagnostics and tests).
    pub fn kept_connections(&self) -> usize {
        self.hot.live()
    }

    /// Closes the pool and the connections kept beside it.
    pub async fn close(&self) {
        self.hot.close().await;
        self.pool.close().await;
    }
}

#[async_trait::async_trait]
impl crate::shared::sql::Backend for PostgresStore {
    type Tx = Tx;
    type Reader = PgPool;

    async fn begin_tx(&self) -> StoreResult<Tx> {
        self.begin().await
    }

    async fn now_in(&self, tx: &mut Tx) -> StoreResult<Timestamp> {
        self.now(tx).await
    }

    /// The configured clock, or the database's.
    async fn now_out(&self) -> StoreResult<Timestamp> {
        match self.fixed_now() {
            Some(ms) => Ok(Timestamp(ms)),
            None => Ok(Timestamp(
                sqlx::query_scalar("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT")
                    .fetch_one(&self.pool)
                    .await?,
            )),
        }
    }

    fn reader(&self) -> PgPool {
        self.pool.clone()
    }
}

crate::shared::attempts::attempt_store_for!(PostgresStore);
crate::shared::embeddings::embedding_store_for!(PostgresStore);
crate::shared::stream_log::stream_log_store_for!(PostgresStore);
