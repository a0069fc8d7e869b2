//! SPEC §15 listings on PostgreSQL: how the shared listings of [`crate::shared::list`]
//! bind their statements and read rows (on the pool, outside any transaction).

use super::PostgresStore;
use crate::StoreResult;
use crate::list::{Dialect, ListSql};
use crate::shared::list::ListRows;
use async_trait::async_trait;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{FromRow, Postgres};
use tollgate_core::Timestamp;

#[async_trait]
impl ListRows for PostgresStore {
    type Row = PgRow;
    const DIALECT: Dialect = Dialect::Postgres;

    /// The configured clock, or the database's.
    async fn list_now(&self) -> StoreResult<Timestamp> {
        match self.fixed_now() {
            Some(ms) => Ok(Timestamp(ms)),
            None => Ok(Timestamp(
                sqlx::query_scalar("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT")
                    .fetch_one(&self.pool)
                    .await?,
            )),
        }
    }

    async fn rows_of<T>(&self, sql: ListSql) -> StoreResult<Vec<T>>
    where
        T: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        let a: PgArguments = crate::shared::list::arguments(&sql)?;
        Ok(
            sqlx::query_as_with::<Postgres, T, _>(sqlx::AssertSqlSafe(sql.text), a)
                .fetch_all(&self.pool)
                .await?,
        )
    }
}
