//! docs/conformance.md#creating-a-task, docs/conformance.md#lifecycle cancel, docs/conformance.md#application-tasks, docs/conformance.md#money-and-tokens's spend window, the application's side of tasks
//! ([`TaskStore`](crate::TaskStore)), written once ([`Tasks`]): reads, cancel, release,
//! the unreleased sources and spend. A backend supplies what really differs
//! ([`TaskStatements`]): creation (its admission) and owner deletion (its locks); the lock
//! of a task's run is [`TerminalStatements::LOCK_RUN_OF`].

use crate::shared::cost::{SpendSums, TokenBucketRow, spend_sums};
use crate::shared::lifecycle::{returning_finished, status_in_flight};
use crate::shared::rows::{FinishedRow, ScopedSourceRow, TaskRow, task_columns, unreleased_page};
use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::shared::terminal::{TerminalMove, TerminalStatements, finish};
use crate::{
    Created, SpendWindow, StoreResult, Transition, UnreleasedPage, UnreleasedQuery, keyset_fetch,
    page_size,
};
use async_trait::async_trait;
use tollgate_core::cost::window_first_bucket;
use tollgate_core::{AppId, EffectKey, ErrorCode, NewTask, ScopeId, SourceId, Task, TaskId};

/// The message of a task canceled by request.
pub(crate) const CANCELED_MESSAGE: &str = "canceled by request";

/// docs/conformance.md#lifecycle cancel: cancels the app's task if it is queued or
/// running (`$1` error code, `$2` message, `$3` now, `$4` task, `$5` app), returning it
/// as a [`FinishedRow`].
const CANCEL_TASK: &str = concat!(
    "UPDATE tasks SET cancel_requested = TRUE, status = 'canceled', error_code = $1, \
     error_message = $2, completed_at = $3 WHERE id = $4 AND app = $5 AND ",
    status_in_flight!(),
    returning_finished!()
);

/// docs/conformance.md#application-tasks: a page of unreleased (scope, source) pairs (`$1`
/// app, `$2` scope, `$3` step, `$4` and `$5` the cursor's scope and source, `$6` the rows
/// to read, `$7` and `$8` the subject; a `NULL` filter matches everything).
const UNRELEASED_SOURCES: &str = "SELECT DISTINCT scope, source_id FROM tasks \
     WHERE app = $1 AND run_id IS NULL AND released_at IS NULL AND source_id IS NOT NULL \
     AND (CAST($2 AS TEXT) IS NULL OR scope = $2) AND (CAST($3 AS TEXT) IS NULL OR step = $3) \
     AND (CAST($4 AS TEXT) IS NULL OR (scope, source_id) > ($4, $5)) \
     AND (CAST($7 AS TEXT) IS NULL OR (subject_type = $7 AND subject_id = $8)) \
     ORDER BY scope, source_id LIMIT $6";

/// What differs between the backends on the application's side of tasks.
#[async_trait]
pub(crate) trait TaskStatements: Backend {
    /// docs/conformance.md#creating-a-task, docs/conformance.md#admission: creates one task (the backend's admission).
    async fn create_one(&self, new: NewTask) -> StoreResult<Created>;
    /// docs/conformance.md#creating-a-task, docs/conformance.md#admission: creates several tasks.
    async fn create_many(&self, news: Vec<NewTask>) -> StoreResult<Vec<StoreResult<Created>>>;
    /// docs/conformance.md#application-tasks: deletes an owner's application tasks under the backend's locks.
    async fn delete_owner(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> StoreResult<u64>;
}

/// The task, whoever's it is.
pub(crate) async fn fetch_task<E: Exec + ?Sized>(
    exec: &mut E,
    id: &str,
) -> StoreResult<Option<Task>> {
    let row: Option<TaskRow> = exec
        .optional(
            Statement::new(concat!(
                "SELECT ",
                task_columns!(),
                " FROM tasks WHERE id = $1"
            ))
            .bind(id),
        )
        .await?;
    row.map(TaskRow::into_task).transpose()
}

/// The task one statement selects, read on the read pool.
async fn read_task<B: Backend>(store: &B, select: Statement) -> StoreResult<Option<Task>> {
    let row: Option<TaskRow> = store.reader().optional(select).await?;
    row.map(TaskRow::into_task).transpose()
}

/// [`TaskStore`](crate::TaskStore)'s shared methods.
pub(crate) struct Tasks;

impl Tasks {
    pub(crate) async fn get_task<B: TaskStatements>(
        store: &B,
        app: &AppId,
        id: TaskId,
    ) -> StoreResult<Option<Task>> {
        read_task(
            store,
            Statement::new(concat!(
                "SELECT ",
                task_columns!(),
                " FROM tasks WHERE id = $1 AND app = $2"
            ))
            .bind(id.to_string())
            .bind(app.as_str()),
        )
        .await
    }

    pub(crate) async fn get_task_by_effect_key<B: TaskStatements>(
        store: &B,
        app: &AppId,
        key: &EffectKey,
    ) -> StoreResult<Option<Task>> {
        read_task(
            store,
            Statement::new(concat!(
                "SELECT ",
                task_columns!(),
                " FROM tasks WHERE app = $1 AND effect_key = $2"
            ))
            .bind(app.as_str())
            .bind(key.as_str()),
        )
        .await
    }

    /// docs/conformance.md#lifecycle: terminal states are final: only a queued or running task is marked and
    /// canceled.
    pub(crate) async fn request_cancel<B: TaskStatements>(
        store: &B,
        app: &AppId,
        id: TaskId,
    ) -> StoreResult<Option<Transition>> {
        let mut tx = store.begin_tx().await?;
        let exists: Option<(String,)> = tx
            .optional(
                Statement::new("SELECT status FROM tasks WHERE id = $1 AND app = $2")
                    .bind(id.to_string())
                    .bind(app.as_str()),
            )
            .await?;
        if exists.is_none() {
            tx.rollback_tx().await?;
            return Ok(None);
        }
        let now = store.now_in(&mut tx).await?;
        tx.lock_run_of(id).await?;
        let done: Option<FinishedRow> = tx
            .optional(
                Statement::new(CANCEL_TASK)
                    .bind(ErrorCode::Canceled.as_str())
                    .bind(CANCELED_MESSAGE)
                    .bind(now.0)
                    .bind(id.to_string())
                    .bind(app.as_str()),
            )
            .await?;
        finish(tx, id, done, TerminalMove::ENDED, now)
            .await
            .map(Some)
    }

    pub(crate) async fn release<B: TaskStatements>(
        store: &B,
        app: &AppId,
        scope: &ScopeId,
        key: &EffectKey,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let matched = tx
            .run(
                Statement::new(
                    "UPDATE tasks SET released_at = COALESCE(released_at, $1) \
                     WHERE app = $2 AND effect_key = $3 AND scope = $4 AND run_id IS NULL",
                )
                .bind(now.0)
                .bind(app.as_str())
                .bind(key.as_str())
                .bind(scope.as_str()),
            )
            .await?
            > 0;
        tx.commit_tx().await?;
        Ok(matched)
    }

    pub(crate) async fn list_unreleased_sources<B: TaskStatements>(
        store: &B,
        app: &AppId,
        query: &UnreleasedQuery,
    ) -> StoreResult<UnreleasedPage> {
        let limit = page_size(query.limit);
        let (after_scope, after_source) = match &query.after {
            Some(c) => (Some(c.scope.as_str()), Some(c.source.as_str())),
            None => (None, None),
        };
        let rows: Vec<ScopedSourceRow> = store
            .reader()
            .all(
                Statement::new(UNRELEASED_SOURCES)
                    .bind(app.as_str())
                    .bind(query.scope.as_ref().map(|s| s.as_str()))
                    .bind(query.step.as_ref().map(|s| s.as_str()))
                    .bind(after_scope)
                    .bind(after_source)
                    .bind(keyset_fetch(limit))
                    .bind(query.subject.as_ref().map(|s| s.kind.as_str()))
                    .bind(query.subject.as_ref().map(|s| s.id.as_str())),
            )
            .await?;
        unreleased_page(rows, limit)
    }

    /// docs/conformance.md#cost-limits: the spend window of a scope (with its token bucket) or of the app. Reads
    /// that decide nothing: on the read pool.
    pub(crate) async fn spend<B: TaskStatements>(
        store: &B,
        app: &AppId,
        scope: Option<&ScopeId>,
    ) -> StoreResult<SpendWindow> {
        let now = store.now_out().await?;
        let first = window_first_bucket(now);
        let mut reader = store.reader();
        let (sums, bucket): (SpendSums, Option<TokenBucketRow>) = match scope {
            Some(scope) => {
                let sums = reader
                    .one(
                        Statement::new(concat!(
                            spend_sums!(),
                            " FROM scope_spend WHERE app = $1 AND scope = $2 AND bucket >= $3"
                        ))
                        .bind(app.as_str())
                        .bind(scope.as_str())
                        .bind(first),
                    )
                    .await?;
                let bucket = reader
                    .optional(
                        Statement::new(
                            "SELECT token_units, token_at, token_capacity FROM scope_state \
                             WHERE app = $1 AND scope = $2",
                        )
                        .bind(app.as_str())
                        .bind(scope.as_str()),
                    )
                    .await?;
                (sums, bucket)
            }
            None => {
                let sums = reader
                    .one(
                        Statement::new(concat!(
                            spend_sums!(),
                            " FROM app_spend WHERE app = $1 AND bucket >= $2"
                        ))
                        .bind(app.as_str())
                        .bind(first),
                    )
                    .await?;
                (sums, None)
            }
        };
        Ok(sums.into_window(first, now, bucket))
    }
}

/// [`TaskStore`](crate::TaskStore) for a backend that implements [`TaskStatements`]
/// (written once; the store's wrappers forward the trait by a blanket impl, so each
/// backend states its own).
macro_rules! task_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::TaskStore for $store {
            async fn create_task(
                &self,
                new: tollgate_core::NewTask,
            ) -> $crate::StoreResult<$crate::Created> {
                $crate::shared::tasks::TaskStatements::create_one(self, new).await
            }

            async fn create_tasks(
                &self,
                news: Vec<tollgate_core::NewTask>,
            ) -> $crate::StoreResult<Vec<$crate::StoreResult<$crate::Created>>> {
                $crate::shared::tasks::TaskStatements::create_many(self, news).await
            }

            async fn get_task(
                &self,
                app: &tollgate_core::AppId,
                id: tollgate_core::TaskId,
            ) -> $crate::StoreResult<Option<tollgate_core::Task>> {
                $crate::shared::tasks::Tasks::get_task(self, app, id).await
            }

            async fn get_task_by_effect_key(
                &self,
                app: &tollgate_core::AppId,
                key: &tollgate_core::EffectKey,
            ) -> $crate::StoreResult<Option<tollgate_core::Task>> {
                $crate::shared::tasks::Tasks::get_task_by_effect_key(self, app, key).await
            }

            async fn request_cancel(
                &self,
                app: &tollgate_core::AppId,
                id: tollgate_core::TaskId,
            ) -> $crate::StoreResult<Option<$crate::Transition>> {
                $crate::shared::tasks::Tasks::request_cancel(self, app, id).await
            }

            async fn release(
                &self,
                app: &tollgate_core::AppId,
                scope: &tollgate_core::ScopeId,
                key: &tollgate_core::EffectKey,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::tasks::Tasks::release(self, app, scope, key).await
            }

            async fn list_unreleased_sources(
                &self,
                app: &tollgate_core::AppId,
                query: &$crate::UnreleasedQuery,
            ) -> $crate::StoreResult<$crate::UnreleasedPage> {
                $crate::shared::tasks::Tasks::list_unreleased_sources(self, app, query).await
            }

            async fn delete_owner_data(
                &self,
                app: &tollgate_core::AppId,
                scope: &tollgate_core::ScopeId,
                source: Option<&tollgate_core::SourceId>,
            ) -> $crate::StoreResult<u64> {
                $crate::shared::tasks::TaskStatements::delete_owner(self, app, scope, source).await
            }

            async fn spend(
                &self,
                app: &tollgate_core::AppId,
                scope: Option<&tollgate_core::ScopeId>,
            ) -> $crate::StoreResult<$crate::SpendWindow> {
                $crate::shared::tasks::Tasks::spend(self, app, scope).await
            }
        }
    };
}
pub(crate) use task_store_for;
