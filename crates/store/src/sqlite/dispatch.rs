//! SPEC §14 fair claiming on SQLite. The writer lock covers the whole claim, so the queue
//! rows, the tasks and the virtual times change together; the plan is the shared one
//! ([`crate::shared::dispatch`]).

use super::Tx;
use super::lifecycle::run_not_canceled;
use crate::shared::dispatch::{QueueRow, QueueView, plan_claim};
use crate::shared::rows::{TaskRow, task_columns};
use crate::{MAX_CLAIM_QUEUES, MAX_CLAIM_ROUNDS, StoreResult};
use sqlx::SqliteConnection;
use tollgate_core::{AppId, ScopeId, Timestamp, Weight, WorkerId};

/// A creation's part (SPEC §14): the task's (app, scope) queue becomes active (a new or
/// idle queue starts at the least virtual time of the active queues, or of all queues
/// when none is active, so it is served in the next claim and banks no credit while
/// idle) and takes the weight of the task's policy.
pub(super) async fn activate_queue(
    conn: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    weight: Weight,
) -> StoreResult<()> {
    sqlx::query(
        "INSERT INTO dispatch_queues (app, scope, weight, pass, active) \
         VALUES (?1, ?2, ?3, COALESCE((SELECT MIN(pass) FROM dispatch_queues WHERE active), \
         (SELECT MAX(pass) FROM dispatch_queues), 0), 1) \
         ON CONFLICT (app, scope) DO UPDATE SET weight = excluded.weight, \
         pass = CASE WHEN active THEN pass ELSE MAX(pass, excluded.pass) END, active = 1 \
         WHERE NOT active OR weight <> excluded.weight",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(i64::from(weight))
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
    for round in 0..MAX_CLAIM_ROUNDS {
        let want = limit.saturating_sub(claimed.len() as u32);
        if want == 0 {
            break;
        }
        let n = want.min(MAX_CLAIM_QUEUES) as usize;
        let cached = if round == 0 { view.fresh(n) } else { None };
        let from_view = cached.is_some();
        let queues = match cached {
            Some(q) => q,
            None => {
                let all: Vec<QueueRow> = sqlx::query_as(
                    "SELECT app, scope, weight, pass FROM dispatch_queues WHERE active \
                     ORDER BY pass, app, scope LIMIT ?",
                )
                .bind(i64::from(MAX_CLAIM_QUEUES))
                .fetch_all(&mut **tx)
                .await?;
                view.keep(&all);
                all.into_iter().take(n).collect()
            }
        };
        if queues.is_empty() {
            break;
        }
        let mut emptied = false;
        let mut short = false;
        for take in plan_claim(queues, want) {
            let rows: Vec<TaskRow> = sqlx::query_as(concat!(
                "UPDATE tasks SET status = 'running', worker = ?, attempt = attempt + 1, \
                 claimed_at = ?, heartbeat_at = ? \
                 WHERE id IN (SELECT id FROM tasks WHERE app = ? AND scope = ? \
                 AND status = 'queued' AND cancel_requested = 0 AND ",
                run_not_canceled!(),
                " ORDER BY dispatch_key, id LIMIT ?) RETURNING ",
                task_columns!()
            ))
            .bind(worker.as_str())
            .bind(now.0)
            .bind(now.0)
            .bind(&take.queue.app)
            .bind(&take.queue.scope)
            .bind(i64::from(take.take))
            .fetch_all(&mut **tx)
            .await?;
            let got = rows.len() as u32;
            view.advance(&take.queue.app, &take.queue.scope, take.queue.advance(got));
            if got < take.take {
                short = true;
            }
            if got > 0 {
                sqlx::query(
                    "UPDATE dispatch_queues SET pass = pass + ? WHERE app = ? AND scope = ?",
                )
                .bind(take.queue.advance(got))
                .bind(&take.queue.app)
                .bind(&take.queue.scope)
                .execute(&mut **tx)
                .await?;
            }
            if got < take.take {
                // Fewer than planned: nothing claimable is left in this queue. It stays
                // active only while it still holds queued tasks (unclaimable for now).
                let gone = sqlx::query(
                    "UPDATE dispatch_queues SET active = 0 WHERE app = ?1 AND scope = ?2 \
                     AND NOT EXISTS (SELECT 1 FROM tasks WHERE app = ?1 AND scope = ?2 \
                     AND status = 'queued')",
                )
                .bind(&take.queue.app)
                .bind(&take.queue.scope)
                .execute(&mut **tx)
                .await?;
                emptied |= gone.rows_affected() > 0;
            }
            claimed.extend(rows);
        }
        if short {
            view.clear();
        }
        // Go round again only when a queue emptied, or a cached view may be stale.
        let again = emptied || (short && from_view);
        if !again {
            break;
        }
    }
    Ok(claimed)
}
