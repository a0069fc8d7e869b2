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
mod dispatch;
mod lifecycle;
mod list;
mod maintenance;
mod pace;
mod pipelines;
mod runs;
mod tasks;
mod terminal;

use crate::{StoreError, StoreResult};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Sqlite, Transaction};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{Clock, SystemClock};

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
    /// The order `claim_next` claims in (docs/conformance.md#fair-share; default fair).
    pub claim_order: crate::ClaimOrder,
    /// docs/conformance.md#fair-share: how long this instance's fair claims reuse its last read of the active
    /// queues (default 50 ms; other instances' new queues and claims show after at most
    /// this long). Zero reads them for every claim and writes each claim's pass moves
    /// before it returns: for tests that compare several instances with a model of the
    /// database.
    pub queue_view_ttl: Duration,
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
            claim_order: crate::ClaimOrder::Fair,
            queue_view_ttl: crate::shared::dispatch::QUEUE_VIEW_TTL,
        }
    }

    /// Reuses a read of the active queues for this long ([`Self::queue_view_ttl`]).
    pub fn with_queue_view_ttl(mut self, ttl: Duration) -> SqliteOptions {
        self.queue_view_ttl = ttl;
        self
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
    claim_order: crate::ClaimOrder,
    /// docs/conformance.md#fair-share: this instance's recent view of the active queues.
    queue_view: Arc<crate::shared::dispatch::QueueView>,
    /// Creations made together (docs/locking.md, "Creations made together").
    groups: Arc<crate::shared::group::Groups>,
}

type Tx = Transaction<'static, Sqlite>;

impl SqliteStore {
    /// The same store (same pool) claiming in another order (docs/conformance.md#fair-share; benchmarks
    /// compare fair and oldest-first claiming on one database).
    pub fn with_claim_order(mut self, order: crate::ClaimOrder) -> SqliteStore {
        self.claim_order = order;
        self
    }

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
        crate::shared::sql::check_schema_version(
            writer.clone(),
            &MIGRATOR,
            "SELECT CAST(1 AS BIGINT) FROM sqlite_master \
             WHERE type = 'table' AND name = '_sqlx_migrations'",
        )
        .await?;
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
            claim_order: options.claim_order,
            queue_view: Arc::new(crate::shared::dispatch::QueueView::with_ttl(
                options.queue_view_ttl,
            )),
            groups: Arc::default(),
        })
    }

    /// How many creations this instance made together with others, in one write
    /// transaction (docs/locking.md, "Creations made together"; for diagnostics and
    /// tests).
    pub fn created_together(&self) -> u64 {
        self.groups.together()
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

/// Reads that decide nothing go to the read pool, beside the writer.
#[async_trait::async_trait]
impl crate::shared::sql::Backend for SqliteStore {
    type Tx = Tx;
    type Reader = SqlitePool;

    async fn begin_tx(&self) -> StoreResult<Tx> {
        self.begin().await
    }

    async fn now_in(&self, _tx: &mut Tx) -> StoreResult<tollgate_core::Timestamp> {
        Ok(self.now())
    }

    async fn now_out(&self) -> StoreResult<tollgate_core::Timestamp> {
        Ok(self.now())
    }

    fn reader(&self) -> SqlitePool {
        self.reader.clone()
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

crate::shared::attempts::attempt_store_for!(SqliteStore);
crate::shared::embeddings::embedding_store_for!(SqliteStore);
crate::shared::stream_log::stream_log_store_for!(SqliteStore);
