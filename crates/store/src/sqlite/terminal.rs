//! The statements of a terminal move on SQLite (ids bound as a JSON list for
//! `json_each`), the ones `shared::terminal` leaves to a backend. The writer lock covers
//! every row, so there is nothing to skip.

use super::{Tx, id_list};
use crate::StoreResult;
use crate::shared::attempts::{attempt_charges, open_attempt_outcome};
use crate::shared::cost::{SettleRow, SettlementPlan, push_spend_statements};
use crate::shared::rows::run_id;
use crate::shared::sql::{Arg, Exec, Statement};
use crate::shared::terminal::TerminalStatements;
use async_trait::async_trait;
use tollgate_core::{RunId, Timestamp};

#[async_trait]
impl TerminalStatements for Tx {
    const GIVE_BACK_APP: &'static str = "UPDATE app_slots SET active = active - $1 WHERE app = $2";
    // The write lock (`BEGIN IMMEDIATE`) already holds every row.
    const LOCK_RUN_OF: Option<&'static str> = None;

    /// docs/conformance.md#cost-settlement in ONE query (one hop to the connection's
    /// thread, where each refund, spend side and charge took its own): the token refunds,
    /// the spend rows ([`push_spend_statements`]) and the charges, as statements of it in
    /// that order.
    async fn apply_settlement(&mut self, plan: &SettlementPlan) -> StoreResult<()> {
        let mut s = Statement::new("");
        let refunds = refund_list(plan.refunds.iter().map(|((app, scope), tokens)| {
            (
                app.as_str(),
                scope.as_str(),
                i64::try_from(*tokens).unwrap_or(i64::MAX),
            )
        }));
        if let Some(list) = refunds {
            let p = s.placeholder(Arg::from(list));
            s.push(&refund_sql(&p));
            s.push("; ");
        }
        push_spend_statements(&mut s, plan)?;
        if let Some(list) = charge_list(&plan.charged) {
            let p = s.placeholder(Arg::from(list));
            s.push(&charge_sql(&p));
        }
        if !s.text.trim().is_empty() {
            self.run(s).await?;
        }
        Ok(())
    }

    /// The spend rows in one query ([`push_spend_statements`]).
    async fn apply_spend(&mut self, plan: &SettlementPlan) -> StoreResult<()> {
        let mut s = Statement::new("");
        push_spend_statements(&mut s, plan)?;
        if !s.text.trim().is_empty() {
            self.run(s).await?;
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

/// Token refunds as the JSON list [`refund_sql`] reads (`[app, scope, tokens]` each);
/// `None` for none.
fn refund_list<'a>(refunds: impl Iterator<Item = (&'a str, &'a str, i64)>) -> Option<String> {
    let list: Vec<serde_json::Value> = refunds
        .map(|(app, scope, tokens)| serde_json::json!([app, scope, tokens]))
        .collect();
    (!list.is_empty()).then(|| serde_json::Value::Array(list).to_string())
}

/// docs/conformance.md#cost-reservation: unused reserved tokens given back to scopes'
/// token buckets (`p` a JSON list of `[app, scope, tokens]`, one per scope), never above a
/// bucket's capacity nor below what it holds.
fn refund_sql(p: &str) -> String {
    format!(
        "UPDATE scope_state SET token_units = \
           MAX(token_units, MIN(token_units + (r.value ->> 2) * 60000, token_capacity)) \
         FROM json_each({p}) AS r \
         WHERE app = r.value ->> 0 AND scope = r.value ->> 1 AND token_units IS NOT NULL \
         AND token_capacity IS NOT NULL"
    )
}

/// Charges as the JSON list [`charge_sql`] reads (`[id, nano, tokens]` each); `None` for
/// none.
fn charge_list(charged: &[(String, i64, i64)]) -> Option<String> {
    let list: Vec<serde_json::Value> = charged
        .iter()
        .map(|(id, nano, tokens)| serde_json::json!([id, nano, tokens]))
        .collect();
    (!list.is_empty()).then(|| serde_json::Value::Array(list).to_string())
}

/// docs/conformance.md#cost-settlement: each task's charge, which marks it settled (`p` a
/// JSON list of `[id, nano-dollars, tokens]`, one per task).
fn charge_sql(p: &str) -> String {
    format!(
        "UPDATE tasks SET charged_nano = c.value ->> 1, charged_tokens = c.value ->> 2 \
         FROM json_each({p}) AS c WHERE tasks.id = c.value ->> 0"
    )
}
