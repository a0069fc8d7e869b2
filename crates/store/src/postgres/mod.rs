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
//! | every `global_slots` stripe, in order | an admission retried after its stripe's allowance ran out | the exact recount and fresh allowances (`admission::take_slot_rebalancing`) |
//! | `global_finished` stripe rows | tasks leaving queued/running | the other half of the global count; 64 stripes, so finishing never contends with admitting |
//! | task rows | claim, transitions, sweeps (`SKIP LOCKED`) | one claim per task, terminal states final |
//!
//! **Lock order** (every transaction takes locks in this order, and never more than one
//! of a kind except where noted): advisory `(app, scope)` → `runs` row → existing task
//! rows (several only in id order) → new task rows → `scope_state` rows (several only in
//! sorted (app, scope) order) → `global_slots` (one, or all in order) → `global_finished` (one
//! stripe). Sweeps take no advisory lock and skip locked rows (runs too), so they never
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
mod lifecycle;
mod list;
pub mod notify;
mod pipelines;
mod runs;
mod sweep;

use crate::rows::{TaskRow, task_columns};
use crate::{
    Completion, Created, HeartbeatReport, PipelineRef, RunCancel, RunResult, Store, StoreError,
    StoreResult, StoredPipeline, SweepConfig, SweepReport, Transition, UnreleasedPage,
    UnreleasedQuery, WaitOutcome,
};
use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Postgres, Transaction};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{
    AppId, Clock, EffectKey, ErrorCode, NewRun, NewTask, PipelineName, Run, RunId, ScopeId,
    SourceId, Task, TaskId, Timestamp, Usage, WorkerId,
};

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
        }
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
}

type Tx = Transaction<'static, Postgres>;

impl PostgresStore {
    /// Connects, creates the schema if asked, and applies migrations (safe when several
    /// replicas start at once: the migrator holds an advisory lock). A database whose
    /// schema is newer than this binary knows is refused with [`StoreError::SchemaTooNew`].
    pub async fn open(options: PostgresOptions) -> StoreResult<PostgresStore> {
        let mut connect = PgConnectOptions::from_str(&options.url)
            .map_err(|e| StoreError::Database(format!("invalid database url: {e}")))?
            .application_name(&options.application_name);
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
            .connect_with(connect)
            .await?;
        check_schema_version(&pool).await?;
        MIGRATOR.run(&pool).await?;
        Ok(PostgresStore {
            pool,
            clock: options.clock,
        })
    }

    /// The connection pool (for tests and benchmarks that inspect the database).
    pub fn pool(&self) -> &PgPool {
        &self.pool
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

    /// Closes the pool.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

async fn check_schema_version(pool: &PgPool) -> StoreResult<()> {
    let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let exists: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(pool)
        .await?;
    if !exists {
        return Ok(());
    }
    let found: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
        .fetch_one(pool)
        .await?;
    match found {
        Some(found) if found > known => Err(StoreError::SchemaTooNew { found, known }),
        _ => Ok(()),
    }
}

/// Ids as a `TEXT[]` parameter.
pub(crate) fn id_array<T: std::fmt::Display>(ids: &[T]) -> Vec<String> {
    ids.iter().map(ToString::to_string).collect()
}

async fn fetch_task(exec: impl sqlx::PgExecutor<'_>, id: &str) -> StoreResult<Option<Task>> {
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(exec)
    .await?;
    row.map(TaskRow::into_task).transpose()
}

#[async_trait]
impl Store for PostgresStore {
    fn backend(&self) -> &'static str {
        "postgres"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    async fn create_task(&self, new: NewTask) -> StoreResult<Created> {
        admission::create_task(self, new).await
    }

    async fn create_tasks(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>> {
        admission::create_tasks(self, news).await
    }

    async fn get_task(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Task>> {
        let row: Option<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id = $1 AND app = $2"
        ))
        .bind(id.to_string())
        .bind(app.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(TaskRow::into_task).transpose()
    }

    async fn get_task_by_effect_key(
        &self,
        app: &AppId,
        key: &EffectKey,
    ) -> StoreResult<Option<Task>> {
        let row: Option<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE app = $1 AND effect_key = $2"
        ))
        .bind(app.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(TaskRow::into_task).transpose()
    }

    async fn claim_task(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<Task>> {
        lifecycle::claim_task(self, id, worker).await
    }

    async fn claim_next(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<Task>> {
        lifecycle::claim_next(self, worker, limit).await
    }

    async fn heartbeat(&self, worker: &WorkerId, ids: &[TaskId]) -> StoreResult<HeartbeatReport> {
        lifecycle::heartbeat(self, worker, ids).await
    }

    async fn complete_task(
        &self,
        id: TaskId,
        worker: &WorkerId,
        output: serde_json::Value,
        usage: Usage,
    ) -> StoreResult<Transition> {
        lifecycle::complete_task(self, id, worker, output, usage).await
    }

    async fn complete_tasks(
        &self,
        items: Vec<Completion>,
    ) -> StoreResult<Vec<StoreResult<Transition>>> {
        lifecycle::complete_tasks(self, items).await
    }

    async fn fail_task(
        &self,
        id: TaskId,
        code: ErrorCode,
        message: &str,
    ) -> StoreResult<Transition> {
        lifecycle::fail_task(self, id, code, message).await
    }

    async fn request_cancel(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Transition>> {
        lifecycle::request_cancel(self, app, id).await
    }

    async fn is_cancellation_requested(&self, id: TaskId) -> StoreResult<bool> {
        lifecycle::is_cancellation_requested(self, id).await
    }

    async fn mark_canceled(&self, id: TaskId) -> StoreResult<Transition> {
        lifecycle::mark_canceled(self, id).await
    }

    async fn release(&self, app: &AppId, scope: &ScopeId, key: &EffectKey) -> StoreResult<bool> {
        lifecycle::release(self, app, scope, key).await
    }

    async fn list_unreleased_sources(
        &self,
        app: &AppId,
        query: &UnreleasedQuery,
    ) -> StoreResult<UnreleasedPage> {
        lifecycle::list_unreleased_sources(self, app, query).await
    }

    async fn delete_owner_data(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> StoreResult<u64> {
        lifecycle::delete_owner_data(self, app, scope, source).await
    }

    async fn list_recoverable(
        &self,
        after: Option<TaskId>,
        limit: u32,
    ) -> StoreResult<Vec<TaskId>> {
        lifecycle::list_recoverable(self, after, limit).await
    }

    async fn sweep(&self, config: &SweepConfig) -> StoreResult<SweepReport> {
        sweep::sweep(self, config).await
    }

    async fn create_run(&self, new: NewRun) -> StoreResult<Run> {
        runs::create_run(self, new).await
    }

    async fn get_run(&self, app: &AppId, id: RunId) -> StoreResult<Option<Run>> {
        runs::get_run(&self.pool, app, id).await
    }

    async fn request_run_cancel(&self, app: &AppId, id: RunId) -> StoreResult<Option<RunCancel>> {
        runs::request_run_cancel(self, app, id).await
    }

    async fn wait_on_task(
        &self,
        app: &AppId,
        run: RunId,
        task: TaskId,
    ) -> StoreResult<WaitOutcome> {
        runs::wait_on_task(self, app, run, task).await
    }

    async fn finish_run(
        &self,
        app: &AppId,
        run: RunId,
        result: RunResult,
    ) -> StoreResult<Option<Run>> {
        runs::finish_run(self, app, run, result).await
    }
    async fn put_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: &str,
        definition: &serde_json::Value,
    ) -> StoreResult<(StoredPipeline, bool)> {
        pipelines::put_pipeline(self, app, name, version, definition).await
    }

    async fn get_pipeline(
        &self,
        app: &AppId,
        name: &PipelineName,
        version: Option<&str>,
    ) -> StoreResult<Option<StoredPipeline>> {
        pipelines::get_pipeline(self, app, name, version).await
    }

    async fn create_pipeline_run(&self, new: NewRun, pipeline: &PipelineRef) -> StoreResult<Run> {
        pipelines::create_pipeline_run(self, new, pipeline).await
    }

    async fn start_pipeline_run_once(
        &self,
        new: NewRun,
        pipeline: &PipelineRef,
        start_key: &EffectKey,
    ) -> StoreResult<(Run, bool)> {
        pipelines::start_pipeline_run_once(self, new, pipeline, start_key).await
    }

    async fn run_pipeline(&self, app: &AppId, run: RunId) -> StoreResult<Option<PipelineRef>> {
        pipelines::run_pipeline(self, app, run).await
    }

    async fn claim_pipeline_runs(
        &self,
        driver: &WorkerId,
        lease: Duration,
        limit: u32,
    ) -> StoreResult<Vec<Run>> {
        pipelines::claim_pipeline_runs(self, driver, lease, limit).await
    }

    async fn release_pipeline_run(
        &self,
        run: RunId,
        driver: &WorkerId,
        wake_at: Option<Timestamp>,
    ) -> StoreResult<bool> {
        pipelines::release_pipeline_run(self, run, driver, wake_at).await
    }

    async fn run_tasks(&self, app: &AppId, run: RunId) -> StoreResult<Vec<Task>> {
        pipelines::run_tasks(self, app, run).await
    }
}
