//! docs/conformance.md#fair-share fair claiming on SQLite. The writer lock covers the whole claim; the plan is
//! the shared one ([`crate::shared::dispatch`]), taken in one statement, and the passes
//! move as on PostgreSQL: in the instance's view at once, in the rows when the view is
//! read again ([`QueueView`]).

use super::Tx;
use crate::StoreResult;
use crate::shared::attempts::claim_attempt;
use crate::shared::dispatch::{FairClaim, QueueRow, QueueTake, QueueView};
use crate::shared::lifecycle::run_not_canceled;
use crate::shared::rows::{TaskRow, task_columns};
use tollgate_core::{Timestamp, WorkerId};

/// docs/conformance.md#fair-share: claims up to `limit` tasks across the active queues with the least virtual
/// time, by the stride plan (the shared loop,
/// [`claim_fair`](crate::shared::dispatch::claim_fair)), inside the claim's write
/// transaction.
pub(super) async fn claim_fair(
    view: &QueueView,
    tx: &mut Tx,
    worker: &WorkerId,
    limit: u32,
    now: Timestamp,
) -> StoreResult<Vec<TaskRow>> {
    let mut steps = SqliteFairClaim { tx, worker, now };
    crate::shared::dispatch::claim_fair(view, &mut steps, limit).await
}

/// SQLite's statements of a fair claim, in the claim's write transaction.
struct SqliteFairClaim<'a> {
    tx: &'a mut Tx,
    worker: &'a WorkerId,
    now: Timestamp,
}

#[async_trait::async_trait]
impl FairClaim for SqliteFairClaim<'_> {
    async fn pay_debt(&mut self, view: &QueueView) -> StoreResult<()> {
        pay_pass_debt(view, self.tx).await
    }

    async fn read_queues(&mut self, limit: i64) -> StoreResult<Vec<QueueRow>> {
        Ok(sqlx::query_as(
            "SELECT app, scope, weight, pass FROM dispatch_queues WHERE active \
             ORDER BY pass, app, scope LIMIT ?",
        )
        .bind(limit)
        .fetch_all(&mut **self.tx)
        .await?)
    }

    async fn claim(&mut self, plan: &[QueueTake]) -> StoreResult<Vec<TaskRow>> {
        claim_planned(self.tx, self.worker, self.now, plan).await
    }

    /// Nothing of the queue was claimable: it stays active only while it still holds
    /// queued tasks (unclaimable for now).
    async fn deactivate_if_empty(&mut self, app: &str, scope: &str) -> StoreResult<bool> {
        let gone = sqlx::query(
            "UPDATE dispatch_queues SET active = 0 WHERE app = ?1 AND scope = ?2 \
             AND NOT EXISTS (SELECT 1 FROM tasks WHERE app = ?1 AND scope = ?2 \
             AND status = 'queued')",
        )
        .bind(app)
        .bind(scope)
        .execute(&mut **self.tx)
        .await?;
        Ok(gone.rows_affected() > 0)
    }
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
            "UPDATE tasks SET status = 'running', worker = ?, attempt = ",
            claim_attempt!(),
            ", claimed_at = ?, heartbeat_at = ? WHERE id IN ({}) RETURNING ",
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
    /// docs/conformance.md#fair-share: before a creation, writes what this instance's claims owe the queues'
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
