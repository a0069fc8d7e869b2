//! SPEC §3, §5 cancel and §8 on PostgreSQL, the application's side of tasks
//! ([`TaskStore`]): creation (in [`admission`](super::admission)), reads, cancel,
//! release, listing and owner deletion.

use super::PostgresStore;
use super::admission::{self, lock_scope};
use super::lifecycle::{CANCELED_MESSAGE, finish, lock_run_of, status_in_flight};
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
impl TaskStore for PostgresStore {
    async fn create_task(&self, new: NewTask) -> StoreResult<Created> {
        let keeps_view = self.queue_view.covers(std::slice::from_ref(&new));
        let created = around_creation(
            &self.queue_view,
            keeps_view,
            self.pay_pass_debt(),
            admission::create_task(self, new),
        )
        .await?;
        if created.as_ref().is_ok_and(|c| c.created) {
            self.rows_created(1);
        }
        created
    }

    async fn create_tasks(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>> {
        let keeps_view = self.queue_view.covers(&news);
        let created = around_creation(
            &self.queue_view,
            keeps_view,
            self.pay_pass_debt(),
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

    async fn get_task(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Task>> {
        let row: Option<TaskRow> = sqlx::query_as(concat!(
            "SELECT ",
            task_columns!(),
            " FROM tasks WHERE id = $1 AND app = $2"
        ))
        .bind(id.to_string())
        .bind(app.as_str())
        .fetch_optional(&self.pool)
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
            " FROM tasks WHERE app = $1 AND effect_key = $2"
        ))
        .bind(app.as_str())
        .bind(key.as_str())
        .fetch_optional(&self.pool)
        .await?;
        row.map(TaskRow::into_task).transpose()
    }

    async fn request_cancel(&self, app: &AppId, id: TaskId) -> StoreResult<Option<Transition>> {
        let mut tx = self.begin().await?;
        let exists: Option<String> =
            sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1 AND app = $2")
                .bind(id.to_string())
                .bind(app.as_str())
                .fetch_optional(&mut *tx)
                .await?;
        if exists.is_none() {
            tx.rollback().await?;
            return Ok(None);
        }
        let now = self.now(&mut tx).await?;
        lock_run_of(&mut tx, id).await?;
        // Terminal states are final: only a queued or running task is marked and canceled.
        let done: Option<FinishedRow> = sqlx::query_as(concat!(
            "UPDATE tasks SET cancel_requested = TRUE, status = 'canceled', error_code = $1, \
             error_message = $2, completed_at = $3 WHERE id = $4 AND app = $5 AND ",
            status_in_flight!(),
            " RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved"
        ))
        .bind(ErrorCode::Canceled.as_str())
        .bind(CANCELED_MESSAGE)
        .bind(now.0)
        .bind(id.to_string())
        .bind(app.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        finish(tx, id, done, TerminalMove::ENDED, now)
            .await
            .map(Some)
    }

    async fn release(&self, app: &AppId, scope: &ScopeId, key: &EffectKey) -> StoreResult<bool> {
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        let matched = sqlx::query(
            "UPDATE tasks SET released_at = COALESCE(released_at, $1) \
             WHERE app = $2 AND effect_key = $3 AND scope = $4 AND run_id IS NULL",
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
             WHERE app = $1 AND run_id IS NULL AND released_at IS NULL AND source_id IS NOT NULL \
             AND ($2::TEXT IS NULL OR scope = $2) AND ($3::TEXT IS NULL OR step = $3) \
             AND ($4::TEXT IS NULL OR (scope, source_id) > ($4, $5)) \
             AND ($7::TEXT IS NULL OR (subject_type = $7 AND subject_id = $8)) \
             ORDER BY scope, source_id LIMIT $6",
        )
        .bind(app.as_str())
        .bind(query.scope.as_ref().map(|s| s.as_str()))
        .bind(query.step.as_ref().map(|s| s.as_str()))
        .bind(after_scope)
        .bind(after_source)
        .bind(keyset_fetch(limit))
        .bind(query.subject.as_ref().map(|s| s.kind.as_str()))
        .bind(query.subject.as_ref().map(|s| s.id.as_str()))
        .fetch_all(&self.pool)
        .await?;
        unreleased_page(rows, limit)
    }

    async fn delete_owner_data(
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
        let ids: Vec<&str> = rows.iter().map(|r| r.finished.id.as_str()).collect();
        sqlx::query("DELETE FROM tasks WHERE id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await?;
        let deleted = rows;
        tx.commit().await?;
        Ok(deleted.len() as u64)
    }

    async fn spend(&self, app: &AppId, scope: Option<&ScopeId>) -> StoreResult<SpendWindow> {
        let mut tx = self.begin().await?;
        let now = self.now(&mut tx).await?;
        let first = window_first_bucket(now);
        let (sums, bucket): (SpendSums, Option<TokenBucketRow>) = match scope {
            Some(scope) => {
                let sums = sqlx::query_as(concat!(
                    spend_sums!(),
                    " FROM scope_spend WHERE app = $1 AND scope = $2 AND bucket >= $3"
                ))
                .bind(app.as_str())
                .bind(scope.as_str())
                .bind(first)
                .fetch_one(&mut *tx)
                .await?;
                let bucket = sqlx::query_as(
                    "SELECT token_units, token_at, token_capacity FROM scope_state \
                     WHERE app = $1 AND scope = $2",
                )
                .bind(app.as_str())
                .bind(scope.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                (sums, bucket)
            }
            None => {
                let sums = sqlx::query_as(concat!(
                    spend_sums!(),
                    " FROM app_spend WHERE app = $1 AND bucket >= $2"
                ))
                .bind(app.as_str())
                .bind(first)
                .fetch_one(&mut *tx)
                .await?;
                (sums, None)
            }
        };
        tx.commit().await?;
        Ok(sums.into_window(first, now, bucket))
    }
}
