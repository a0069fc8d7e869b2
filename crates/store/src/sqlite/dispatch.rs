//! SPEC §14 fair claiming on SQLite. The writer lock covers the whole claim; the plan is
//! the shared one ([`crate::shared::dispatch`]), taken in one statement, and the passes
//! move as on PostgreSQL: in the instance's view at once, in the rows when the view is
//! read again ([`QueueView`]).

use super::Tx;
use super::lifecycle::run_not_canceled;
use crate::shared::dispatch::{
    QueueRow, QueueTake, QueueView, plan_claim, queue_join_conflict, queue_join_pass,
};
use crate::shared::rows::{TaskRow, task_columns};
use crate::{MAX_CLAIM_QUEUES, MAX_CLAIM_ROUNDS, StoreResult};
use sqlx::SqliteConnection;
use tollgate_core::{AppId, ScopeId, Timestamp, Weight, WorkerId, join_credit};

/// A creation's part (SPEC §14): the task's (app, scope) queue becomes active, joining
/// at the shared rule's pass ([`queue_join_pass`], [`queue_join_conflict`]), and takes
/// the weight of the task's policy.
pub(super) async fn activate_queue(
    conn: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    weight: Weight,
) -> StoreResult<()> {
    sqlx::query(concat!(
        "INSERT INTO dispatch_queues (app, scope, weight, pass, active) VALUES (?1, ?2, ?3, ",
        queue_join_pass!("?4"),
        ", 1) ",
        queue_join_conflict!()
    ))
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(i64::from(weight))
    .bind(join_credit(weight))
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// SPEC §14: claims up to `limit` tasks across the active queues with the least virtual
/// time, by the stride plan, each queue's tasks in dispatch-key order; a queue found
/// empty is deactivated; slots a queue could not fill go round again to the others.
pub(super) async fn claim_fair(
    view: &QueueView,
    tx: &mut Tx,
    worker: &WorkerId,
    limit: u32,
    now: Timestamp,
) -> StoreResult<Vec<TaskRow>> {
    let mut claimed: Vec<TaskRow> = Vec::new();
    // Queues that gave fewer than planned in this claim: nothing more of theirs is
    // claimable now, so later rounds leave them out.
    let mut spent: Vec<(String, String)> = Vec::new();
    for _ in 0..MAX_CLAIM_ROUNDS {
        let want = limit.saturating_sub(claimed.len() as u32);
        if want == 0 {
            break;
        }
        let n = want.min(MAX_CLAIM_QUEUES) as usize;
        // A view read or kept in this claim serves its later rounds too.
        let cached = view.fresh(n, &spent);
        let queues = match cached {
            Some(q) => q,
            None => {
                pay_pass_debt(view, tx).await?;
                let all: Vec<QueueRow> = sqlx::query_as(
                    "SELECT app, scope, weight, pass FROM dispatch_queues WHERE active \
                     ORDER BY pass, app, scope LIMIT ?",
                )
                .bind(i64::from(MAX_CLAIM_QUEUES))
                .fetch_all(&mut **tx)
                .await?;
                let mut all = view.keep(all);
                all.retain(|q| !spent.iter().any(|(a, s)| *a == q.app && *s == q.scope));
                all.truncate(n);
                all
            }
        };
        if queues.is_empty() {
            break;
        }
        let listed = queues.len();
        let plan = plan_claim(queues, want);
        let rows = claim_planned(tx, worker, now, &plan).await?;
        let mut emptied = false;
        let mut short = false;
        for take in &plan {
            let got = rows
                .iter()
                .filter(|r| r.app() == take.queue.app && r.scope() == take.queue.scope)
                .count() as u32;
            view.owe(&take.queue.app, &take.queue.scope, take.queue.advance(got));
            if got < take.take {
                short = true;
                spent.push((take.queue.app.clone(), take.queue.scope.clone()));
            }
            if got == 0 {
                // Nothing of this queue was claimable: it stays active only while it
                // still holds queued tasks (unclaimable for now). (A queue that gave
                // some is looked at again by the next claim.)
                let gone = sqlx::query(
                    "UPDATE dispatch_queues SET active = 0 WHERE app = ?1 AND scope = ?2 \
                     AND NOT EXISTS (SELECT 1 FROM tasks WHERE app = ?1 AND scope = ?2 \
                     AND status = 'queued')",
                )
                .bind(&take.queue.app)
                .bind(&take.queue.scope)
                .execute(&mut **tx)
                .await?;
                if gone.rows_affected() > 0 {
                    emptied = true;
                    view.forget(&take.queue.app, &take.queue.scope);
                }
            }
        }
        claimed.extend(rows);
        // Go round again when a queue came up short and others are listed (their turn
        // for the slots it left), or a queue emptied.
        let again = emptied || (short && listed > 1);
        if !again {
            break;
        }
    }
    Ok(claimed)
}

/// Claims every planned queue's share in one statement: per queue its first tasks in
/// dispatch-key order (a `LIMIT`ed pick each, joined by `UNION ALL`).
async fn claim_planned(
    tx: &mut Tx,
    worker: &WorkerId,
    now: Timestamp,
    plan: &[QueueTake],
) -> StoreResult<Vec<TaskRow>> {
    const PICK: &str = concat!(
        "SELECT id FROM (SELECT id FROM tasks WHERE app = ? AND scope = ? \
         AND status = 'queued' AND cancel_requested = 0 AND ",
        run_not_canceled!(),
        " ORDER BY dispatch_key, id LIMIT ?)"
    );
    let picks = vec![PICK; plan.len()].join(" UNION ALL ");
    let sql = format!(
        concat!(
            "UPDATE tasks SET status = 'running', worker = ?, attempt = attempt + 1, \
             claimed_at = ?, heartbeat_at = ? WHERE id IN ({}) RETURNING ",
            task_columns!()
        ),
        picks
    );
    // Audited: the text is fixed but for how many copies of the pick it joins.
    let mut query = sqlx::query_as(sqlx::AssertSqlSafe(sql))
        .bind(worker.as_str())
        .bind(now.0)
        .bind(now.0);
    for take in plan {
        query = query
            .bind(&take.queue.app)
            .bind(&take.queue.scope)
            .bind(i64::from(take.take));
    }
    Ok(query.fetch_all(&mut **tx).await?)
}

/// Writes the pass moves this instance's claims owe ([`QueueView`]), inside the claim's
/// write transaction.
async fn pay_pass_debt(view: &QueueView, tx: &mut Tx) -> StoreResult<()> {
    let debt = view.debt();
    for (app, scope, by) in &debt {
        sqlx::query("UPDATE dispatch_queues SET pass = pass + ? WHERE app = ? AND scope = ?")
            .bind(by)
            .bind(app)
            .bind(scope)
            .execute(&mut **tx)
            .await?;
    }
    view.paid(&debt);
    Ok(())
}

impl super::SqliteStore {
    /// SPEC §14: before a creation, writes what this instance's claims owe the queues'
    /// passes in a short write transaction (none when nothing is owed), so a queue the
    /// creation activates joins at the passes as they really are.
    pub(super) async fn pay_pass_debt(&self) -> StoreResult<()> {
        if self.queue_view.owes() {
            let mut tx = self.begin().await?;
            pay_pass_debt(&self.queue_view, &mut tx).await?;
            tx.commit().await?;
        }
        Ok(())
    }
}
