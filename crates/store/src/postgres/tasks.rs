//! docs/conformance.md#creating-a-task, docs/conformance.md#lifecycle cancel and docs/conformance.md#application-tasks on PostgreSQL, the application's side of tasks
//! ([`TaskStore`](crate::TaskStore)): reads, cancel, release, the unreleased sources and spend are written once in
//! `shared::tasks`; here are creation (in [`admission`](super::admission)), owner deletion
//! under the scope's advisory lock.

use super::PostgresStore;
use super::admission::{self, lock_scope};
use crate::shared::dispatch::around_creation;
use crate::shared::rows::EndedRow;
use crate::shared::tasks::{TaskStatements, task_store_for};
use crate::shared::terminal::{TerminalMove, after_terminal};
use crate::{Created, StoreResult};
use async_trait::async_trait;
use tollgate_core::{AppId, NewTask, ScopeId, SourceId, Timestamp};

#[async_trait]
impl TaskStatements for PostgresStore {
    async fn create_one(&self, new: NewTask) -> StoreResult<Created> {
        // A deactivation batch in flight may drop from the view the queue this task
        // joins: whether the view covers it is decided after the batch.
        self.deactivation.settled().await;
        let keeps_view = self.queue_view.covers(std::slice::from_ref(&new));
        let created = around_creation(
            &self.queue_view,
            keeps_view,
            super::dispatch::pay_pass_debt(self),
            admission::create_task(self, new),
        )
        .await?;
        if created.as_ref().is_ok_and(|c| c.created) {
            self.rows_created(1);
        }
        created
    }

    async fn create_many(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>> {
        self.deactivation.settled().await;
        let keeps_view = self.queue_view.covers(&news);
        let created = around_creation(
            &self.queue_view,
            keeps_view,
            super::dispatch::pay_pass_debt(self),
            admission::create_tasks(self, news),
        )
        .await?;
        if let Ok(items) = &created {
            let n = items
                .iter()
                .filter(|c| c.as_ref().is_ok_and(|c| c.created))
                .count();
            self.rows_created(n as u64);
        }
        created
    }

    async fn delete_owner(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> StoreResult<u64> {
        let mut tx = self.begin().await?;
        // Exclusive scope lock: serialized with every creation of this owner, so no task of
        // the owner slips in during the deletion. Admission records are kept.
        lock_scope(&mut tx, app, scope, true).await?;
        // The owner's rows, locked in id order (the lock order for several task rows).
        let rows: Vec<EndedRow> = sqlx::query_as(
            "SELECT id, app, scope, admitted, reservation IS NOT NULL AS reserved, status FROM tasks \
             WHERE app = $1 AND scope = $2 \
             AND run_id IS NULL AND ($3::TEXT IS NULL OR source_id = $3) ORDER BY id FOR UPDATE",
        )
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(source.map(|s| s.as_str()))
        .fetch_all(&mut *tx)
        .await?;
        // In-flight tasks leave queued/running first, while their rows still hold their
        // reservations: they give back their capacity and settle as a cancel does
        // (docs/budgets.md, "Settlement"); their workers see cancellation. Admission
        // records and logical keys stay as they are.
        let in_flight = EndedRow::in_flight(&rows);
        after_terminal(&mut tx, &in_flight, TerminalMove::DELETED, Timestamp(0)).await?;
        // docs/webhooks.md, "Retention and deletion": the tasks' events go with them.
        crate::shared::webhooks::forget_owner_events(&mut *tx, app, scope, source).await?;
        let ids: Vec<&str> = rows.iter().map(|r| r.finished.id.as_str()).collect();
        sqlx::query("DELETE FROM tasks WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(rows.len() as u64)
    }
}

task_store_for!(PostgresStore);
