//! The embedded SQLite backend: one file, nothing to install.
//!
//! Locking design: SQLite has one writer at a time per database file. Every
//! read-then-write transaction starts with `BEGIN IMMEDIATE`, which takes the file's
//! write lock up front, so the reads that decide a write (idempotency, owner check,
//! cache, admission counts) cannot be invalidated before the write commits, whether the
//! competing writer is this pool, another [`SqliteStore`] on the same file or another
//! process. Reads that decide nothing use a separate read pool (WAL lets them run beside
//! the writer). `busy_timeout` makes contending writers wait instead of failing.

mod admission;
mod lifecycle;
mod list;
mod pipelines;
mod runs;
mod sweep;

use crate::rows::{TaskRow, task_columns};
use crate::{
    Created, HeartbeatReport, PipelineRef, RunCancel, RunResult, Store, StoreError, StoreResult,
    StoredPipeline, SweepConfig, SweepReport, Transition, UnreleasedPage, UnreleasedQuery,
    WaitOutcome,
};
use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{
    AppId, Clock, EffectKey, ErrorCode, NewRun, NewTask, PipelineName, Run, RunId, ScopeId,
    SourceId, SystemClock, Task, TaskId, Timestamp, Usage, WorkerId,
};

/// The migrations this binary ships.
pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations/sqlite");

/// How to open a SQLite database.
#[derive(Debug, Clone)]
pub struct SqliteOptions {
    /// The database file; created (with its folder) if it does not exist.
    pub path: PathBuf,
    /// Where "now" comes from.
    pub clock: Arc<dyn Clock>,
    /// Connections of the read pool.
    pub read_connections: u32,
    /// How long a writer waits for another writer before giving up.
    pub busy_timeout: Duration,
    /// `synchronous = FULL` (the default: a committed task survives power loss) or
    /// `NORMAL` (survives process crashes; faster).
    pub synchronous_full: bool,
}

impl SqliteOptions {
    /// Defaults for a file: system clock, 4 readers, 10 s busy timeout, FULL sync.
    pub fn new(path: impl Into<PathBuf>) -> SqliteOptions {
        SqliteOptions {
            path: path.into(),
            clock: Arc::new(SystemClock),
            read_connections: 4,
            busy_timeout: Duration::from_secs(10),
            synchronous_full: true,
        }
    }

    /// Uses another clock (tests move a [`tollgate_core::ManualClock`]).
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> SqliteOptions {
        self.clock = clock;
        self
    }
}

/// The SQLite [`Store`].
#[derive(Debug, Clone)]
pub struct SqliteStore {
    writer: SqlitePool,
    reader: SqlitePool,
    clock: Arc<dyn Clock>,
}

type Tx = Transaction<'static, Sqlite>;

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations. A database
    /// whose schema is newer than this binary knows is refused with
    /// [`StoreError::SchemaTooNew`].
    pub async fn open(options: SqliteOptions) -> StoreResult<SqliteStore> {
        if let Some(dir) = options.path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(|e| {
                StoreError::Unavailable(format!("cannot create {}: {e}", dir.display()))
            })?;
        }
        let base = SqliteConnectOptions::new()
            .filename(&options.path)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(options.busy_timeout)
            .foreign_keys(false)
            .synchronous(if options.synchronous_full {
                SqliteSynchronous::Full
            } else {
                SqliteSynchronous::Normal
            });
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(options.busy_timeout + Duration::from_secs(20))
            .connect_with(base.clone().create_if_missing(true))
            .await?;
        check_schema_version(&writer).await?;
        MIGRATOR.run(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(options.read_connections.max(1))
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(base.read_only(true))
            .await?;
        Ok(SqliteStore {
            writer,
            reader,
            clock: options.clock,
        })
    }

    /// Starts a read-then-write transaction holding the write lock from the start.
    async fn begin(&self) -> StoreResult<Tx> {
        Ok(self.writer.begin_with("BEGIN IMMEDIATE").await?)
    }

    fn now(&self) -> tollgate_core::Timestamp {
        self.clock.now()
    }

    /// The writer pool (one connection), for benchmark baselines that share the file.
    pub fn writer_pool(&self) -> &SqlitePool {
        &self.writer
    }

    /// Closes both pools.
    pub async fn close(&self) {
        self.writer.close().await;
        self.reader.close().await;
    }
}

async fn check_schema_version(pool: &SqlitePool) -> StoreResult<()> {
    let known = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    let has_table: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_sqlx_migrations'",
    )
    .fetch_optional(pool)
    .await?;
    if has_table.is_none() {
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

/// A JSON array of ids, for `json_each(?)` set membership in one statement.
pub(crate) fn id_list<T: std::fmt::Display>(ids: &[T]) -> String {
    serde_json::Value::Array(
        ids.iter()
            .map(|i| serde_json::Value::String(i.to_string()))
            .collect(),
    )
    .to_string()
}

async fn fetch_task(exec: impl sqlx::SqliteExecutor<'_>, id: &str) -> StoreResult<Option<Task>> {
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE id = ?"
    ))
    .bind(id)
    .fetch_optional(exec)
    .await?;
    row.map(TaskRow::into_task).transpose()
}

#[async_trait]
impl Store for SqliteStore {
    fn backend(&self) -> &'static str {
        "sqlite"
    }

    async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
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
            " FROM tasks WHERE id = ? AND app = ?"
        ))
        .bind(id.to_string())
        .bind(app.as_str())
        .fetch_optional(&self.reader)
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
            " FROM tasks WHERE app = ? AND effect_key = ?"
        ))
        .bind(app.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.reader)
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
        runs::get_run(&self.reader, app, id).await
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
