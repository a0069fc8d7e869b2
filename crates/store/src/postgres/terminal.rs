//! The statements of a terminal move on PostgreSQL (ids bound as a `TEXT[]`), the ones
//! `shared::terminal` leaves to a backend, and the run locks of single-task transitions.

use super::Tx;
use crate::StoreResult;
use crate::shared::attempts::{attempt_charges, open_attempt_outcome};
use crate::shared::cost::{SettleRow, SettlementPlan, spend_rows_one_statement};
use crate::shared::rows::run_id;
use crate::shared::sql::Exec;
use crate::shared::terminal::{TerminalStatements, spend_rows_each};
use async_trait::async_trait;
use tollgate_core::{RunId, Timestamp};

/// docs/conformance.md#cost-reservation on PostgreSQL: unused reserved tokens back to
/// scopes' token buckets (`$apps`, `$scopes`, `$tokens`: placeholders of `TEXT[]`,
/// `TEXT[]`, `BIGINT[]`), never above a bucket's capacity nor below what it holds. The
/// rows are locked in (app, scope) order first (`ORDER BY … FOR NO KEY UPDATE` locks as
/// the sorted rows come out), so two settlements refunding the same scopes cannot
/// deadlock. For `concat!`.
macro_rules! refund_tokens_sql {
    ($apps:literal, $scopes:literal, $tokens:literal) => {
        concat!(
            "UPDATE scope_state st SET token_units = \
               GREATEST(st.token_units, LEAST(st.token_units + l.tokens * 60000, st.token_capacity)) \
             FROM (SELECT s.app, s.scope, r.tokens FROM scope_state s \
                   JOIN UNNEST(",
            $apps,
            "::TEXT[], ",
            $scopes,
            "::TEXT[], ",
            $tokens,
            "::BIGINT[]) AS r(app, scope, tokens) \
                     ON s.app = r.app AND s.scope = r.scope \
                   WHERE s.token_units IS NOT NULL AND s.token_capacity IS NOT NULL \
                   ORDER BY s.app, s.scope FOR NO KEY UPDATE OF s) AS l \
             WHERE st.app = l.app AND st.scope = l.scope"
        )
    };
}
pub(super) use refund_tokens_sql;

#[async_trait]
impl TerminalStatements for Tx {
    // On stripe 0 (the row an app with a share takes its own slots on), which an app
    // without a share may not have yet.
    const GIVE_BACK_APP: &'static str = "INSERT INTO app_slots (app, stripe, active, share) \
         VALUES ($2, 0, -$1, 0) \
         ON CONFLICT (app, stripe) DO UPDATE SET active = app_slots.active - $1";
    const LOCK_RUN_OF: Option<&'static str> = Some(
        "SELECT 1 FROM runs WHERE id = (SELECT run_id FROM tasks WHERE id = $1) FOR NO KEY UPDATE",
    );

    /// Scope and app rows in one statement when they fit ([`spend_rows_one_statement`]: a
    /// data-modifying CTE).
    async fn apply_spend(&mut self, plan: &SettlementPlan) -> StoreResult<()> {
        match spend_rows_one_statement(plan)? {
            Some(s) => {
                self.run(s).await?;
                Ok(())
            }
            None => spend_rows_each(self, plan).await,
        }
    }

    /// The token refunds in one statement for every scope ([`refund_tokens_sql!`]), the
    /// spend rows ([`Self::apply_spend`]), the charges in one statement for every task.
    async fn apply_settlement(&mut self, plan: &SettlementPlan) -> StoreResult<()> {
        if !plan.refunds.is_empty() {
            let apps: Vec<&str> = plan.refunds.keys().map(|(a, _)| a.as_str()).collect();
            let scopes: Vec<&str> = plan.refunds.keys().map(|(_, s)| s.as_str()).collect();
            let tokens: Vec<i64> = plan
                .refunds
                .values()
                .map(|t| i64::try_from(*t).unwrap_or(i64::MAX))
                .collect();
            sqlx::query(refund_tokens_sql!("$1", "$2", "$3"))
                .bind(&apps)
                .bind(&scopes)
                .bind(&tokens)
                .execute(&mut **self)
                .await?;
        }
        self.apply_spend(plan).await?;
        if !plan.charged.is_empty() {
            let charged = &plan.charged;
            let ids: Vec<&str> = charged.iter().map(|c| c.0.as_str()).collect();
            let nanos: Vec<i64> = charged.iter().map(|c| c.1).collect();
            let toks: Vec<i64> = charged.iter().map(|c| c.2).collect();
            sqlx::query(
                "UPDATE tasks SET charged_nano = c.nano, charged_tokens = c.tokens \
                 FROM unnest($1::TEXT[], $2::BIGINT[], $3::BIGINT[]) AS c(id, nano, tokens) \
                 WHERE tasks.id = c.id",
            )
            .bind(&ids)
            .bind(&nanos)
            .bind(&toks)
            .execute(&mut **self)
            .await?;
        }
        Ok(())
    }

    async fn unsettled(&mut self, ids: &[String]) -> StoreResult<Vec<SettleRow>> {
        Ok(sqlx::query_as(concat!(
            "SELECT id, app, scope, created_at, claimed_at, reservation, usage, ",
            attempt_charges!(),
            " FROM tasks WHERE id = ANY($1) AND reservation IS NOT NULL \
             AND charged_nano IS NULL ORDER BY id"
        ))
        .bind(ids)
        .fetch_all(&mut **self)
        .await?)
    }

    async fn end_open_attempts(&mut self, ids: &[String], now: Timestamp) -> StoreResult<()> {
        sqlx::query(concat!(
            "UPDATE task_attempts SET ended_at = $1, outcome = ",
            open_attempt_outcome!(),
            ", charged_nano = reserved_nano, charged_tokens = reserved_tokens \
             WHERE ended_at IS NULL AND task_id = ANY($2)"
        ))
        .bind(now.0)
        .bind(ids)
        .execute(&mut **self)
        .await?;
        Ok(())
    }

    async fn clear_logical_keys(&mut self, ids: &[String]) -> StoreResult<()> {
        sqlx::query(
            "UPDATE admissions SET logical_key = NULL \
             WHERE task_id = ANY($1) AND logical_key IS NOT NULL",
        )
        .bind(ids)
        .execute(&mut **self)
        .await?;
        Ok(())
    }

    async fn wake_runs(
        &mut self,
        ids: &[String],
        now: Timestamp,
        skip_locked: bool,
    ) -> StoreResult<Vec<RunId>> {
        wake_runs_waiting_on(self, ids, now, skip_locked).await
    }
}

/// Wakes runs waiting on any of the tasks. Transactions that already hold the runs' rows
/// (single-task transitions lock the run first) wait; sweeps, which lock tasks before
/// runs, skip locked runs instead (a run locked elsewhere is being canceled or is about to
/// wait and check the task itself; the repair sweep heals anything left).
async fn wake_runs_waiting_on(
    tx: &mut Tx,
    ids: &[String],
    now: Timestamp,
    skip_locked: bool,
) -> StoreResult<Vec<RunId>> {
    let sql = if skip_locked {
        "UPDATE runs SET state = 'running', waiting_on = NULL, woken_at = $1, updated_at = $1 \
         WHERE id IN (SELECT id FROM runs WHERE state = 'waiting' AND waiting_on = ANY($2) \
         FOR NO KEY UPDATE SKIP LOCKED) RETURNING id"
    } else {
        "UPDATE runs SET state = 'running', waiting_on = NULL, woken_at = $1, updated_at = $1 \
         WHERE state = 'waiting' AND waiting_on = ANY($2) RETURNING id"
    };
    let woken: Vec<String> = sqlx::query_scalar(sql)
        .bind(now.0)
        .bind(ids)
        .fetch_all(&mut **tx)
        .await?;
    woken.iter().map(|r| run_id(r)).collect()
}
