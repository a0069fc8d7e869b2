//! docs/conformance.md#fair-share fair claiming on SQLite. The writer lock covers the whole claim; the plan is
//! the shared one ([`crate::shared::dispatch`]), taken in one statement, and the passes
//! move as on PostgreSQL: in the instance's view at once, in the rows when the view is
//! read again ([`QueueView`]). The queues that gave nothing are deactivated (those left
//! empty) in one more statement at the end of the claim's transaction, all together.

use super::Tx;
use super::lifecycle::opened_now;
use crate::StoreResult;
use crate::shared::attempts::claim_attempt;
use crate::shared::dispatch::{EmptyQueues, FairClaim, QueueRow, QueueTake, QueueView};
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

    /// The queues gave nothing: each stays active only while it still holds queued tasks
    /// (unclaimable for now). One statement for all of them, in the claim's transaction
    /// (the writer lock keeps every creation out until the commit); the view forgets
    /// every one left inactive.
    async fn deactivate_empty(&mut self, view: &QueueView, queues: EmptyQueues) -> StoreResult<()> {
        let pairs = serde_json::Value::Array(
            queues
                .iter()
                .map(|(app, scope)| serde_json::json!([app, scope]))
                .collect(),
        )
        .to_string();
        let gone: Vec<(String, String)> = sqlx::query_as(
            "UPDATE dispatch_queues SET active = 0 \
             WHERE (app, scope) IN (SELECT json_extract(value, '$[0]'), \
               json_extract(value, '$[1]') FROM json_each(?1)) \
             AND NOT EXISTS (SELECT 1 FROM tasks WHERE tasks.app = dispatch_queues.app \
               AND tasks.scope = dispatch_queues.scope AND tasks.status = 'queued') \
             RETURNING app, scope",
        )
        .bind(pairs)
        .fetch_all(&mut **self.tx)
        .await?;
        for (app, scope) in &gone {
            view.forget(app, scope);
        }
        Ok(())
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
            task_columns!(),
            opened_now!()
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
    Ok(query
        .bind(now.0)
        .bind(worker.as_str())
        .fetch_all(&mut **tx)
        .await?)
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
