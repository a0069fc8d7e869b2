//! One way to run a statement on either backend, so logic that only the placeholders
//! would tell apart is written once (`shared::runs`, `shared::tasks`, the listings, …).
//!
//! Statements are written with PostgreSQL's numbered placeholders (`$1`, `$2`, … — a
//! number may repeat): sqlx's SQLite driver reads `$NNN` as the NNN-th argument too, so
//! one text runs on both. A [`Statement`] carries its arguments in order; [`Exec`] runs it
//! on a transaction or a pool of either backend; [`Backend`] is what shared logic needs
//! of a store besides that (its transactions, its clock, its read pool). Only the
//! statements that really differ (locks, `SKIP LOCKED`, id sets as arrays or JSON, the
//! claim) stay in a backend's module, handed to the shared code as constants or hooks.

use crate::StoreResult;
use async_trait::async_trait;
use std::borrow::Cow;
use tollgate_core::Timestamp;

/// An argument to bind, in order.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Arg {
    /// Text, or a typed `NULL`.
    Text(Option<String>),
    /// A 64-bit integer, or a typed `NULL`.
    Int(Option<i64>),
    /// A 32-bit integer (PostgreSQL `INT` columns compared as such).
    Int32(i32),
    /// A boolean (`BOOLEAN` columns; SQLite stores 0 or 1).
    Bool(bool),
}

impl From<bool> for Arg {
    fn from(v: bool) -> Arg {
        Arg::Bool(v)
    }
}

impl From<&str> for Arg {
    fn from(v: &str) -> Arg {
        Arg::Text(Some(v.to_string()))
    }
}
impl From<String> for Arg {
    fn from(v: String) -> Arg {
        Arg::Text(Some(v))
    }
}
impl From<&String> for Arg {
    fn from(v: &String) -> Arg {
        Arg::Text(Some(v.clone()))
    }
}
impl From<Option<&str>> for Arg {
    fn from(v: Option<&str>) -> Arg {
        Arg::Text(v.map(str::to_string))
    }
}
impl From<Option<String>> for Arg {
    fn from(v: Option<String>) -> Arg {
        Arg::Text(v)
    }
}
impl From<i64> for Arg {
    fn from(v: i64) -> Arg {
        Arg::Int(Some(v))
    }
}
impl From<Option<i64>> for Arg {
    fn from(v: Option<i64>) -> Arg {
        Arg::Int(v)
    }
}
impl From<i32> for Arg {
    fn from(v: i32) -> Arg {
        Arg::Int32(v)
    }
}

/// A statement (`$n` placeholders) and its arguments, for either backend.
#[derive(Debug, Clone, Default)]
pub(crate) struct Statement {
    pub(crate) text: Cow<'static, str>,
    pub(crate) args: Vec<Arg>,
}

impl Statement {
    /// A statement without arguments yet.
    pub(crate) fn new(text: impl Into<Cow<'static, str>>) -> Statement {
        Statement {
            text: text.into(),
            args: Vec::new(),
        }
    }

    /// Binds the next argument (`$1` first).
    pub(crate) fn bind(mut self, arg: impl Into<Arg>) -> Statement {
        self.args.push(arg.into());
        self
    }

    /// Binds `arg` to a new placeholder and returns it (`$<n>`), for statements built
    /// piece by piece.
    pub(crate) fn placeholder(&mut self, arg: Arg) -> String {
        self.args.push(arg);
        format!("${}", self.args.len())
    }

    /// Appends text.
    pub(crate) fn push(&mut self, s: &str) {
        self.text.to_mut().push_str(s);
    }

    /// The text and the arguments, bound in order for the backend `A` belongs to.
    pub(crate) fn into_parts<A>(self) -> StoreResult<(Cow<'static, str>, A)>
    where
        A: sqlx::Arguments,
        Option<String>: for<'t> sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
        Option<i64>: for<'t> sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
        i32: for<'t> sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
        bool: for<'t> sqlx::Encode<'t, A::Database> + sqlx::Type<A::Database>,
    {
        let mut a = A::default();
        a.reserve(self.args.len(), 0);
        for arg in self.args {
            match arg {
                Arg::Text(s) => a.add(s),
                Arg::Int(i) => a.add(i),
                Arg::Int32(i) => a.add(i),
                Arg::Bool(b) => a.add(b),
            }
            .map_err(|e| crate::StoreError::Database(e.to_string()))?;
        }
        Ok((self.text, a))
    }
}

#[cfg(feature = "postgres")]
/// Decodable from a PostgreSQL row.
pub(crate) trait PgFetched: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> {}
#[cfg(feature = "postgres")]
impl<T: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow>> PgFetched for T {}
#[cfg(not(feature = "postgres"))]
/// Without the backend, nothing to decode.
pub(crate) trait PgFetched {}
#[cfg(not(feature = "postgres"))]
impl<T> PgFetched for T {}

#[cfg(feature = "sqlite")]
/// Decodable from a SQLite row.
pub(crate) trait SqliteFetched: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow> {}
#[cfg(feature = "sqlite")]
impl<T: for<'r> sqlx::FromRow<'r, sqlx::sqlite::SqliteRow>> SqliteFetched for T {}
#[cfg(not(feature = "sqlite"))]
/// Without the backend, nothing to decode.
pub(crate) trait SqliteFetched {}
#[cfg(not(feature = "sqlite"))]
impl<T> SqliteFetched for T {}

/// A row shape every enabled backend decodes (the named rows of `shared::rows`, tuples).
pub(crate) trait Fetched: PgFetched + SqliteFetched + Send + Unpin {}
impl<T: PgFetched + SqliteFetched + Send + Unpin> Fetched for T {}

/// Runs statements: a backend's transaction or pool.
#[async_trait]
pub(crate) trait Exec: Send {
    /// Runs it; the rows it changed.
    async fn run(&mut self, s: Statement) -> StoreResult<u64>;
    /// Every row.
    async fn all<T: Fetched>(&mut self, s: Statement) -> StoreResult<Vec<T>>;
    /// At most one row.
    async fn optional<T: Fetched>(&mut self, s: Statement) -> StoreResult<Option<T>>;
    /// Exactly one row.
    async fn one<T: Fetched>(&mut self, s: Statement) -> StoreResult<T>;
}

/// A backend's open transaction.
#[async_trait]
pub(crate) trait TxExec: Exec + Sized {
    /// Commits it.
    async fn commit_tx(self) -> StoreResult<()>;
    /// Rolls it back.
    async fn rollback_tx(self) -> StoreResult<()>;
}

/// What shared logic needs of a store besides [`Exec`].
#[async_trait]
pub(crate) trait Backend: Send + Sync {
    /// Its transaction.
    type Tx: TxExec + crate::shared::terminal::TerminalStatements;
    /// Its pool for reads that decide nothing.
    type Reader: Exec;

    /// Opens a read-then-write transaction (SQLite: `BEGIN IMMEDIATE`).
    async fn begin_tx(&self) -> StoreResult<Self::Tx>;
    /// "Now" for the transaction: the configured clock, or the database's.
    async fn now_in(&self, tx: &mut Self::Tx) -> StoreResult<Timestamp>;
    /// "Now" outside a transaction.
    async fn now_out(&self) -> StoreResult<Timestamp>;
    /// The read pool (a cheap handle).
    fn reader(&self) -> Self::Reader;
}

/// Refuses a database whose schema is newer than this binary knows
/// ([`StoreError::SchemaTooNew`](crate::StoreError::SchemaTooNew)); a database without
/// the migrations table yet is new. `has_table` returns a row when the table exists
/// (how to ask differs between the backends).
pub(crate) async fn check_schema_version<E: Exec>(
    mut exec: E,
    migrator: &sqlx::migrate::Migrator,
    has_table: &'static str,
) -> StoreResult<()> {
    let known = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    let table: Option<(i64,)> = exec.optional(Statement::new(has_table)).await?;
    if table.is_none() {
        return Ok(());
    }
    let (found,): (Option<i64>,) = exec
        .one(Statement::new("SELECT MAX(version) FROM _sqlx_migrations"))
        .await?;
    match found {
        Some(found) if found > known => Err(crate::StoreError::SchemaTooNew { found, known }),
        _ => Ok(()),
    }
}

/// [`Exec`] by way of the connection `$ty` dereferences to.
macro_rules! exec_by_deref {
    ($ty:ty) => {
        #[async_trait::async_trait]
        impl $crate::shared::sql::Exec for $ty {
            async fn run(&mut self, s: $crate::shared::sql::Statement) -> $crate::StoreResult<u64> {
                (**self).run(s).await
            }
            async fn all<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<Vec<T>> {
                (**self).all(s).await
            }
            async fn optional<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<Option<T>> {
                (**self).optional(s).await
            }
            async fn one<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<T> {
                (**self).one(s).await
            }
        }
    };
}

/// [`Exec`] for one backend's connections, transactions, pooled connections and pools (a
/// pool runs a statement on a connection it lends, as sqlx's own pool executor does).
macro_rules! exec_for {
    ($db:ty, $conn:ty, $args:ty) => {
        #[async_trait::async_trait]
        impl $crate::shared::sql::Exec for $conn {
            async fn run(&mut self, s: $crate::shared::sql::Statement) -> $crate::StoreResult<u64> {
                let (text, a) = s.into_parts::<$args>()?;
                Ok(sqlx::query_with::<$db, _>(sqlx::AssertSqlSafe(text), a)
                    .execute(&mut *self)
                    .await?
                    .rows_affected())
            }
            async fn all<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<Vec<T>> {
                let (text, a) = s.into_parts::<$args>()?;
                Ok(
                    sqlx::query_as_with::<$db, T, _>(sqlx::AssertSqlSafe(text), a)
                        .fetch_all(&mut *self)
                        .await?,
                )
            }
            async fn optional<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<Option<T>> {
                let (text, a) = s.into_parts::<$args>()?;
                Ok(
                    sqlx::query_as_with::<$db, T, _>(sqlx::AssertSqlSafe(text), a)
                        .fetch_optional(&mut *self)
                        .await?,
                )
            }
            async fn one<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<T> {
                let (text, a) = s.into_parts::<$args>()?;
                Ok(
                    sqlx::query_as_with::<$db, T, _>(sqlx::AssertSqlSafe(text), a)
                        .fetch_one(&mut *self)
                        .await?,
                )
            }
        }

        exec_by_deref!(sqlx::Transaction<'static, $db>);
        exec_by_deref!(sqlx::pool::PoolConnection<$db>);

        #[async_trait::async_trait]
        impl $crate::shared::sql::TxExec for sqlx::Transaction<'static, $db> {
            async fn commit_tx(self) -> $crate::StoreResult<()> {
                Ok(self.commit().await?)
            }
            async fn rollback_tx(self) -> $crate::StoreResult<()> {
                Ok(self.rollback().await?)
            }
        }

        #[async_trait::async_trait]
        impl $crate::shared::sql::Exec for sqlx::Pool<$db> {
            async fn run(&mut self, s: $crate::shared::sql::Statement) -> $crate::StoreResult<u64> {
                self.acquire().await?.run(s).await
            }
            async fn all<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<Vec<T>> {
                self.acquire().await?.all(s).await
            }
            async fn optional<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<Option<T>> {
                self.acquire().await?.optional(s).await
            }
            async fn one<T: $crate::shared::sql::Fetched>(
                &mut self,
                s: $crate::shared::sql::Statement,
            ) -> $crate::StoreResult<T> {
                self.acquire().await?.one(s).await
            }
        }
    };
}

#[cfg(feature = "postgres")]
exec_for!(
    sqlx::Postgres,
    sqlx::PgConnection,
    sqlx::postgres::PgArguments
);
#[cfg(feature = "sqlite")]
exec_for!(
    sqlx::Sqlite,
    sqlx::SqliteConnection,
    sqlx::sqlite::SqliteArguments
);
