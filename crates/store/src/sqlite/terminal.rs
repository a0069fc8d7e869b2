//! The statements of a terminal move on SQLite (ids bound as a JSON list for
//! `json_each`), the ones `shared::terminal` leaves to a backend. The writer lock covers
//! every row, so there is nothing to skip.

use super::{Tx, id_list};
use crate::StoreResult;
use crate::shared::attempts::{attempt_charges, open_attempt_outcome};
use crate::shared::cost::SettleRow;
use crate::shared::rows::run_id;
use crate::shared::terminal::TerminalStatements;
use async_trait::async_trait;
use tollgate_core::{RunId, Timestamp};

#[async_trait]
impl TerminalStatements for Tx {
    const GIVE_BACK_APP: &'static str = "UPDATE app_slots SET active = active - $1 WHERE app = $2";
    const SPEND_IN_ONE_STATEMENT: bool = false;
    // The write lock (`BEGIN IMMEDIATE`) already holds every row.
    const LOCK_RUN_OF: Option<&'static str> = None;

    /// One statement a scope (the write lock holds every row).
    async fn refund_tokens(&mut self, refunds: &[(&str, &str, i64)]) -> StoreResult<()> {
        for (app, scope, tokens) in refunds {
            sqlx::query(
                "UPDATE scope_state SET token_units = \
                   MAX(token_units, MIN(token_units + ? * 60000, token_capacity)) \
                 WHERE app = ? AND scope = ? AND token_units IS NOT NULL \
                 AND token_capacity IS NOT NULL",
            )
            .bind(tokens)
            .bind(app)
            .bind(scope)
            .execute(&mut **self)
            .await?;
        }
        Ok(())
    }

    async fn charge(&mut self, charged: &[(String, i64, i64)]) -> StoreResult<()> {
        for (id, nano, tokens) in charged {
            sqlx::query("UPDATE tasks SET charged_nano = ?, charged_tokens = ? WHERE id = ?")
                .bind(nano)
                .bind(tokens)
                .bind(id)
                .execute(&mut **self)
                .await?;
        }
        Ok(())
    }

    async fn unsettled(&mut self, ids: &[String]) -> StoreResult<Vec<SettleRow>> {
        Ok(sqlx::query_as(concat!(
            "SELECT id, app, scope, created_at, claimed_at, reservation, usage, ",
            attempt_charges!(),
            " FROM tasks WHERE id IN (SELECT value FROM json_each($1)) \
             AND reservation IS NOT NULL AND charged_nano IS NULL ORDER BY id"
        ))
        .bind(id_list(ids))
        .fetch_all(&mut **self)
        .await?)
    }

    async fn end_open_attempts(&mut self, ids: &[String], now: Timestamp) -> StoreResult<()> {
        sqlx::query(concat!(
            "UPDATE task_attempts SET ended_at = $1, outcome = ",
            open_attempt_outcome!(),
            ", charged_nano = reserved_nano, charged_tokens = reserved_tokens \
             WHERE ended_at IS NULL AND task_id IN (SELECT value FROM json_each($2))"
        ))
        .bind(now.0)
        .bind(id_list(ids))
        .execute(&mut **self)
        .await?;
        Ok(())
    }

    async fn clear_logical_keys(&mut self, ids: &[String]) -> StoreResult<()> {
        sqlx::query(
            "UPDATE admissions SET logical_key = NULL \
             WHERE task_id IN (SELECT value FROM json_each(?)) AND logical_key IS NOT NULL",
        )
        .bind(id_list(ids))
        .execute(&mut **self)
        .await?;
        Ok(())
    }

    async fn wake_runs(
        &mut self,
        ids: &[String],
        now: Timestamp,
        _skip_locked: bool,
    ) -> StoreResult<Vec<RunId>> {
        wake_runs_waiting_on(self, &id_list(ids), now).await
    }
}

/// Wakes runs waiting on any task of a JSON id list.
async fn wake_runs_waiting_on(tx: &mut Tx, list: &str, now: Timestamp) -> StoreResult<Vec<RunId>> {
    let woken: Vec<String> = sqlx::query_scalar(
        "UPDATE runs SET state = 'running', waiting_on = NULL, woken_at = ?, updated_at = ? \
         WHERE state = 'waiting' AND waiting_on IN (SELECT value FROM json_each(?)) \
         RETURNING id",
    )
    .bind(now.0)
    .bind(now.0)
    .bind(list)
    .fetch_all(&mut **tx)
    .await?;
    woken.iter().map(|r| run_id(r)).collect()
}
