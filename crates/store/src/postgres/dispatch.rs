//! docs/conformance.md#fair-share fair claiming on PostgreSQL, correct with any number of replicas claiming at
//! once.
//!
//! A claim is one statement: each planned queue's first tasks in dispatch-key order
//! with `FOR UPDATE SKIP LOCKED` (replicas never wait for each other's task rows and
//! never claim one task twice), by the shared stride plan ([`crate::shared::dispatch`])
//! over this instance's view of the active queues. The view is read again when it is
//! older than [`QUEUE_VIEW_TTL`](crate::shared::dispatch::QUEUE_VIEW_TTL) or cannot name
//! the queues a read would list (one more statement, after
//! writing the pass moves this instance's claims owe, in one statement that skips rows
//! others hold), so claims never wait on queue-row locks. Replicas that read the same
//! passes at once serve the same queues a little more than their share for a moment;
//! the passes count every claim, so shares over time stay those of the weights.
//!
//! A queue that gave no task of those planned may be empty; the slots it left go round
//! again to the other queues. The queues that gave nothing are deactivated after the
//! claim has returned its tasks, in one batch of the instance in the background
//! ([`super::deactivate`]): one short transaction that first locks their rows (so no
//! creation of their scopes is in flight: creations hold them to their commit) and
//! only then looks, with a fresh snapshot, for queued tasks. The instance's next read of
//! the queues waits for a batch in flight.

use super::lifecycle::claiming;
use super::{PostgresStore, now_sql};
use crate::StoreResult;
use crate::shared::attempts::claim_attempt;
use crate::shared::dispatch::{EmptyQueues, FairClaim, PassDebt, QueueRow, QueueTake, QueueView};
use crate::shared::lifecycle::run_not_canceled;
use crate::shared::rows::{TaskRow, task_columns_qualified};
use std::sync::{Arc, LazyLock};
use tollgate_core::WorkerId;

/// docs/conformance.md#fair-share: claims up to `limit` tasks across the active queues with the least virtual
/// time, by the stride plan (the shared loop, [`claim_fair`](crate::shared::dispatch::claim_fair)).
pub(super) async fn claim_fair(
    store: &PostgresStore,
    worker: &WorkerId,
    limit: u32,
) -> StoreResult<Vec<TaskRow>> {
    let mut steps = PgFairClaim { store, worker };
    crate::shared::dispatch::claim_fair(&store.queue_view, &mut steps, limit).await
}

/// The end of both fair claim statements, after their `clock` and `picked` CTEs
/// (`$1` the worker). MATERIALIZED picks run once, so LIMIT and SKIP LOCKED hold
/// exactly. The update finds the picked rows by id as an array: joined to the pick, the
/// planner (which cannot know how few rows the limits give) hashes the whole queue.
/// It does not repeat the pick's `status = 'queued'`: the picked rows are locked and
/// were queued when locked (the lock re-checks the condition on the newest version),
/// and with that condition the planner may walk a queued index it believes nearly empty
/// (statistics taken while nothing was queued) instead of the primary key.
/// Each claim opens its attempt in the same statement ([`claiming!`]).
macro_rules! claim_picked {
    () => {
        claiming!(concat!(
            "UPDATE tasks SET status = 'running', worker = $1, attempt = ",
            claim_attempt!(),
            ", claimed_at = clock.now, heartbeat_at = clock.now \
             FROM clock WHERE tasks.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING ",
            task_columns_qualified!()
        ))
    };
}

/// Largest take of a one-queue claim with its limit written into the statement (one
/// prepared statement per limit and connection).
const SINGLE_QUEUE_LIMITS: u32 = 32;

/// The one-queue claims, indexed by their take (0 to [`SINGLE_QUEUE_LIMITS`]): scalar
/// arguments and the limit written in, so PostgreSQL's generic plan knows how few rows
/// it takes (the queue's index in start order) and is kept, instead of planning the
/// array statement again on every call. A limit as a parameter would be planned as a
/// tenth of the queue (a bad plan behind a large backlog).
static SINGLE_QUEUE_CLAIMS: LazyLock<Vec<Arc<str>>> = LazyLock::new(|| {
    (0..=SINGLE_QUEUE_LIMITS)
        .map(|take| {
            format!(
                concat!(
                    "WITH clock AS (SELECT ",
                    now_sql!(2),
                    " AS now), \
                     picked AS MATERIALIZED (SELECT id FROM tasks WHERE app = $3 AND scope = $4 \
                       AND status = 'queued' AND NOT cancel_requested AND ",
                    run_not_canceled!(),
                    " ORDER BY dispatch_key, id LIMIT {} FOR UPDATE SKIP LOCKED)",
                    claim_picked!()
                ),
                take
            )
            .into()
        })
        .collect()
});

/// PostgreSQL's statements of a fair claim, each in autocommit.
struct PgFairClaim<'a> {
    store: &'a PostgresStore,
    worker: &'a WorkerId,
}

#[async_trait::async_trait]
impl FairClaim for PgFairClaim<'_> {
    /// After this instance's deactivation batch in flight, if any (it pays the debt
    /// too, and changes the queues a read lists).
    async fn pay_debt(&mut self, _view: &QueueView) -> StoreResult<()> {
        self.store.deactivation.settled().await;
        pay_pass_debt(self.store).await
    }

    async fn read_queues(&mut self, limit: i64) -> StoreResult<Vec<QueueRow>> {
        // Never a view a batch is about to change (a claim on this instance may have
        // handed one over since the payment).
        self.store.deactivation.settled().await;
        Ok(sqlx::query_as(
            "SELECT app, scope, weight, pass FROM dispatch_queues WHERE active \
             ORDER BY pass, app, scope LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.store.pool)
        .await?)
    }

    async fn claim(&mut self, plan: &[QueueTake]) -> StoreResult<Vec<TaskRow>> {
        if let [one] = plan
            && let Some(sql) = SINGLE_QUEUE_CLAIMS.get(one.take as usize)
        {
            return Ok(sqlx::query_as(sqlx::AssertSqlSafe(Arc::clone(sql)))
                .bind(self.worker.as_str())
                .bind(self.store.fixed_now())
                .bind(one.queue.app.as_str())
                .bind(one.queue.scope.as_str())
                .fetch_all(&self.store.pool)
                .await?);
        }
        let apps: Vec<&str> = plan.iter().map(|t| t.queue.app.as_str()).collect();
        let scopes: Vec<&str> = plan.iter().map(|t| t.queue.scope.as_str()).collect();
        let takes: Vec<i64> = plan.iter().map(|t| i64::from(t.take)).collect();
        Ok(sqlx::query_as(concat!(
            "WITH clock AS (SELECT ",
            now_sql!(2),
            " AS now), \
             plan AS (SELECT * FROM UNNEST($3::TEXT[], $4::TEXT[], $5::BIGINT[]) \
               AS p(app, scope, take)), \
             picked AS MATERIALIZED (SELECT x.id FROM plan p CROSS JOIN LATERAL \
               (SELECT id FROM tasks WHERE tasks.app = p.app AND tasks.scope = p.scope \
                AND status = 'queued' AND NOT cancel_requested AND ",
            run_not_canceled!(),
            " ORDER BY dispatch_key, id LIMIT p.take FOR UPDATE SKIP LOCKED) x)",
            claim_picked!()
        ))
        .bind(self.worker.as_str())
        .bind(self.store.fixed_now())
        .bind(&apps)
        .bind(&scopes)
        .bind(&takes)
        .fetch_all(&self.store.pool)
        .await?)
    }

    /// After the claim: in the background ([`PostgresStore::deactivate_later`]), or
    /// before it returns when the view has no period (tests compare rows with a model).
    async fn deactivate_empty(&mut self, view: &QueueView, queues: EmptyQueues) -> StoreResult<()> {
        if view.writes_through() {
            if let Err(e) = super::deactivate::deactivate_empty(self.store, &queues).await {
                // The claim holds its tasks: never lose them for a deactivation.
                tracing::warn!(error = %e, "deactivating empty queues failed (they stay active)");
            }
        } else {
            self.store.deactivate_later(queues);
        }
        Ok(())
    }
}

/// Writes the pass moves this instance's claims owe ([`QueueView`]) in one statement
/// (none when nothing is owed): before a fair claim's read of the queues, and before a
/// creation (docs/conformance.md#fair-share), so a queue it activates joins at the
/// passes as they really are;
/// rows locked in (app, scope) order; a row a creation or another instance holds is
/// skipped and its move stays owed until the next read. One writer of the instance's
/// debt at a time ([`Deactivation::writer`](super::deactivate::Deactivation)), so no
/// move is written twice.
///
/// [`QueueView`]: crate::shared::dispatch::QueueView
pub(super) async fn pay_pass_debt(store: &PostgresStore) -> StoreResult<()> {
    if !store.queue_view.owes() {
        return Ok(());
    }
    let _writer = store.deactivation.writer.lock().await;
    let debt = store.queue_view.debt();
    if debt.is_empty() {
        return Ok(());
    }
    let paid = write_pass_debt(&store.pool, &debt).await?;
    store.queue_view.paid(&paid);
    Ok(())
}

/// The statement of [`pay_pass_debt`]: writes `debt` (rows it can lock) and returns the
/// moves it wrote, and those of queues that have no row (a scope whose tasks were all
/// created claimed, docs/engine.md, "Tasks claimed at creation": a queue that does
/// not exist has no pass to move, and joins at the passes as they are when it first
/// activates); the caller marks them paid once they are committed. Otherwise such a
/// move would stay owed for ever, and every payment would carry it again.
pub(super) async fn write_pass_debt<'c>(
    db: impl sqlx::PgExecutor<'c>,
    debt: &PassDebt,
) -> StoreResult<PassDebt> {
    let apps: Vec<&str> = debt.iter().map(|d| d.0.as_str()).collect();
    let scopes: Vec<&str> = debt.iter().map(|d| d.1.as_str()).collect();
    let moves: Vec<i64> = debt.iter().map(|d| d.2).collect();
    let written: Vec<(String, String)> = sqlx::query_as(
        "WITH owed AS (SELECT * FROM UNNEST($1::TEXT[], $2::TEXT[], $3::BIGINT[]) \
           AS o(app, scope, by)), \
         locked AS (SELECT d.app, d.scope FROM dispatch_queues d JOIN owed o \
           ON d.app = o.app AND d.scope = o.scope \
           ORDER BY d.app, d.scope FOR NO KEY UPDATE OF d SKIP LOCKED), \
         moved AS (UPDATE dispatch_queues d SET pass = d.pass + o.by FROM owed o, locked l \
           WHERE d.app = o.app AND d.scope = o.scope AND l.app = d.app AND l.scope = d.scope \
           RETURNING d.app, d.scope) \
         SELECT app, scope FROM moved \
         UNION ALL SELECT o.app, o.scope FROM owed o WHERE NOT EXISTS \
           (SELECT 1 FROM dispatch_queues d WHERE d.app = o.app AND d.scope = o.scope)",
    )
    .bind(&apps)
    .bind(&scopes)
    .bind(&moves)
    .fetch_all(db)
    .await?;
    Ok(debt
        .iter()
        .filter(|(app, scope, _)| written.iter().any(|(a, s)| a == app && s == scope))
        .cloned()
        .collect())
}
