//! SPEC §3, §5 cancel and §8 on SQLite, the application's side of tasks
//! ([`TaskStore`]): creation (in [`admission`](super::admission)), reads, cancel,
//! release, listing and owner deletion.

use super::SqliteStore;
use super::admission;
use super::lifecycle::{CANCELED_MESSAGE, finish};
use crate::shared::cost::{SpendSums, TokenBucketRow, spend_sums};
use crate::shared::dispatch::around_creation;
use crate::shared::rows::{
    EndedRow, FinishedRow, ScopedSourceRow, TaskRow, task_columns, unreleased_page,
};
use crate::shared::terminal::{TerminalMove, after_terminal};
use crate::{
    Created, SpendWindow, StoreResult, TaskStore, Transition, UnreleasedPage, UnreleasedQuery,
    keyset_fetch, page_size,
};
use async_trait::async_trait;
use tollgate_core::cost::window_first_bucket;
use tollgate_core::{
    AppId, EffectKey, ErrorCode, NewTask, ScopeId, SourceId, Task, TaskId, Timestamp,
};
#[async_trait]
impl TaskStore for SqliteStore {
    async fn create_task(&self, new: NewTask) -> StoreResult<Created> {
        let keeps_view = self.queue_view.covers(std::slice::from_ref(&new));
        around_creation(
            &self.queue_view,
            keeps_view,
            self.pay_pass_debt(),
            admission::create_task(self, new),
        )
        .await?
    }

    async fn create_tasks(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>> {
        let keeps_view = self.queue_view.covers(&news);
        around_creation(
            &self.queue_view,
            keeps_view,
            self.pay_pass_debt(),
            admission::create_tasks(self, news),
        )
        .await?
    }

    async fn get_task(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Task>> {
        let row: Option<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id = ? AND app = ?"
        ))
        .bind(id.to_string())
        .bind(app.as_str())
        .fetch_optional(&self.reader)
        .await?;
        row.map(TaskRow::into_task).transpose()
    }

    async fn get_task_by_effect_key(
        &self,
        app: &AppId,
        key: &EffectKey,
    ) -> StoreResult<Option<Task>> {
        let row: Option<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE app = ? AND effect_key = ?"
        ))
        .bind(app.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.reader)
        .await?;
        row.map(TaskRow::into_task).transpose()
    }

    async fn request_cancel(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Transition>> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let status: Option<String> =
            sqlx::query_scalar("SELECT status FROM tasks WHERE id = ? AND app = ?")
                .bind(id.to_string())
                .bind(app.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        if status.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        // Terminal states are final: only a queued or running task is marked and canceled.
        let done: Option<FinishedRow> = sqlx::query_as(
            "UPDATE tasks SET cancel_requested = 1, status = 'canceled', error_code = ?, \
             error_message = ?, completed_at = ? \
             WHERE id = ? AND status IN ('queued', 'running') RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved",
        )
        .bind(ErrorCode::Canceled.as_str())
        .bind(CANCELED_MESSAGE)
        .bind(now.0)
        .bind(id.to_string())
        .fetch_optional(&mut *tx)
        .await?;
        finish(tx, id, done, TerminalMove::ENDED, now)
            .await
            .map(Some)
    }

    async fn release(&self, app: &AppId, scope: &ScopeId, key: &EffectKey) -> StoreResult<bool> {
        let mut tx = self.begin().await?;
        let now = self.now();
        let matched = sqlx::query(
            "UPDATE tasks SET released_at = COALESCE(released_at, ?) \
             WHERE app = ? AND effect_key = ? AND scope = ? AND run_id IS NULL",
        )
        .bind(now.0)
        .bind(app.as_str())
        .bind(key.as_str())
        .bind(scope.as_str())
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        tx.commit().await?;
        Ok(matched)
    }

    async fn list_unreleased_sources(
        &self,
        app: &AppId,
        query: &UnreleasedQuery,
    ) -> StoreResult<UnreleasedPage> {
        let limit = page_size(query.limit);
        let (after_scope, after_source) = match &query.after {
            Some(c) => (Some(c.scope.as_str()), Some(c.source.as_str())),
            None => (None, None),
        };
        let rows: Vec<ScopedSourceRow> = sqlx::query_as(
            "SELECT DISTINCT scope, source_id FROM tasks \
             WHERE app = ?1 AND run_id IS NULL AND released_at IS NULL AND source_id IS NOT NULL \
             AND (?2 IS NULL OR scope = ?2) AND (?3 IS NULL OR step = ?3) \
             AND (?4 IS NULL OR (scope, source_id) > (?4, ?5)) \
             AND (?7 IS NULL OR (subject_type = ?7 AND subject_id = ?8)) \
             ORDER BY scope, source_id LIMIT ?6",
        )
        .bind(app.as_str())
        .bind(query.scope.as_ref().map(|s| s.as_str()))
        .bind(query.step.as_ref().map(|s| s.as_str()))
        .bind(after_scope)
        .bind(after_source)
        .bind(keyset_fetch(limit))
        .bind(query.subject.as_ref().map(|s| s.kind.as_str()))
        .bind(query.subject.as_ref().map(|s| s.id.as_str()))
        .fetch_all(&self.reader)
        .await?;
        unreleased_page(rows, limit)
    }

    async fn delete_owner_data(
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

    async fn spend(&self, app: &AppId, scope: Option<&ScopeId>) -> StoreResult<SpendWindow> {
        let now = self.now();
        let first = window_first_bucket(now);
        let (sums, bucket): (SpendSums, Option<TokenBucketRow>) = match scope {
            Some(scope) => {
                let sums = sqlx::query_as(concat!(
                    spend_sums!(),
                    " FROM scope_spend WHERE app = ? AND scope = ? AND bucket >= ?"
                ))
                .bind(app.as_str())
                .bind(scope.as_str())
                .bind(first)
                .fetch_one(&self.reader)
                .await?;
                let bucket = sqlx::query_as(
                    "SELECT token_units, token_at, token_capacity FROM scope_state \
                     WHERE app = ? AND scope = ?",
                )
                .bind(app.as_str())
                .bind(scope.as_str())
                .fetch_optional(&self.reader)
                .await?;
                (sums, bucket)
            }
            None => {
                let sums = sqlx::query_as(concat!(
                    spend_sums!(),
                    " FROM app_spend WHERE app = ? AND bucket >= ?"
                ))
                .bind(app.as_str())
                .bind(first)
                .fetch_one(&self.reader)
                .await?;
                (sums, None)
            }
        };
        Ok(sums.into_window(first, now, bucket))
    }
}
