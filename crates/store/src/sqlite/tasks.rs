//! docs/conformance.md#creating-a-task, docs/conformance.md#lifecycle cancel and docs/conformance.md#application-tasks on SQLite, the application's side of tasks
//! ([`TaskStore`](crate::TaskStore)): reads, cancel, release, the unreleased sources and spend are written once in
//! `shared::tasks`; here are creation (in [`admission`](super::admission)), owner deletion
//! under the write lock.

use super::SqliteStore;
use super::admission;
use crate::shared::dispatch::around_creation;
use crate::shared::rows::EndedRow;
use crate::shared::tasks::{TaskStatements, task_store_for};
use crate::shared::terminal::{TerminalMove, after_terminal};
use crate::{Created, StoreResult};
use async_trait::async_trait;
use tollgate_core::{AppId, NewTask, ScopeId, SourceId, Timestamp};

#[async_trait]
impl TaskStatements for SqliteStore {
    async fn create_one(&self, new: NewTask) -> StoreResult<Created> {
        let keeps_view = self.queue_view.covers(std::slice::from_ref(&new));
        around_creation(
            &self.queue_view,
            keeps_view,
            self.pay_pass_debt(),
            admission::create_task(self, new),
        )
        .await?
    }

    async fn create_many(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>> {
        let keeps_view = self.queue_view.covers(&news);
        around_creation(
            &self.queue_view,
            keeps_view,
            self.pay_pass_debt(),
            admission::create_tasks(self, news),
        )
        .await?
    }

    async fn delete_owner(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> StoreResult<u64> {
        // The write lock serializes this with every creation: no task of the owner can slip
        // in between. Admission records are kept, so accounting is not reset.
        let mut tx = self.begin().await?;
        // In-flight tasks leave queued/running first, while their rows still hold their
        // reservations: they give back their capacity and settle as a cancel does
        // (docs/budgets.md, "Settlement"); their workers see cancellation. Admission
        // records and logical keys stay as they are.
        let in_flight: Vec<EndedRow> = sqlx::query_as(
            "SELECT id, app, scope, admitted, reservation IS NOT NULL AS reserved, status FROM tasks \
             WHERE app = ?1 AND scope = ?2 \
             AND run_id IS NULL AND (?3 IS NULL OR source_id = ?3) \
             AND status IN ('queued', 'running') ORDER BY id",
        )
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(source.map(|s| s.as_str()))
        .fetch_all(&mut *tx)
        .await?;
        let in_flight = EndedRow::in_flight(&in_flight);
        after_terminal(&mut tx, &in_flight, TerminalMove::DELETED, Timestamp(0)).await?;
        // docs/webhooks.md, "Retention and deletion": the tasks' events go with them.
        crate::shared::webhooks::forget_owner_events(&mut *tx, app, scope, source).await?;
        let deleted = sqlx::query(
            "DELETE FROM tasks WHERE app = ?1 AND scope = ?2 AND run_id IS NULL \
             AND (?3 IS NULL OR source_id = ?3)",
        )
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(source.map(|s| s.as_str()))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(deleted)
    }
}

task_store_for!(SqliteStore);
