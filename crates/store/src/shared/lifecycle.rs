//! docs/conformance.md#heartbeat, docs/conformance.md#lifecycle: the worker's side of tasks
//! ([`WorkerStore`](crate::WorkerStore)) written once ([`Worker`]): complete, fail,
//! acknowledge cancellation, ask whether to stop, reserve one more attempt, and the
//! checks around the claims and the heartbeat. A backend supplies only what really
//! differs ([`WorkerStatements`]): its claims (`SKIP LOCKED` on PostgreSQL, the write
//! lock on SQLite), its heartbeat statement (ids as an array or a JSON list, row locks in
//! id order) and the locks a reservation takes before reading its task; the lock of a
//! task's run is [`TerminalStatements::LOCK_RUN_OF`].

use crate::shared::attempts::{END_ATTEMPT, Ending};
use crate::shared::cost::{AttemptRow, decode_reservation, reserve_checked};
use crate::shared::rows::{
    CancelStateRow, FinishedRow, TaskRow, cancellation_requested, encode_completion, encode_usage,
    heartbeat_report, tasks,
};
use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::shared::tasks::{CANCELED_MESSAGE, fetch_task};
use crate::shared::terminal::{TerminalMove, TerminalStatements, finish};
use crate::{AttemptEnd, Completion, HeartbeatReport, MAX_PAGE, StoreResult, Transition};
use async_trait::async_trait;
use tollgate_core::TaskError;
use tollgate_core::attempt::{AttemptOutcome, Charged};
use tollgate_core::cost::window_first_bucket;
use tollgate_core::{
    ErrorCode, Lease, Reservation, Task, TaskId, Usage, WorkerId, truncate_message,
};

/// SQL condition: the task's run (if any) is not canceled (`tasks` unaliased).
macro_rules! run_not_canceled {
    () => {
        "(run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = tasks.run_id \
         AND (r.cancel_requested OR r.state = 'canceled')))"
    };
}
pub(crate) use run_not_canceled;

/// SQL condition: cancellation was requested for the task or its run (`tasks`
/// unaliased).
macro_rules! cancel_wanted {
    () => {
        "(tasks.cancel_requested OR (tasks.run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs r \
         WHERE r.id = tasks.run_id AND (r.cancel_requested OR r.state = 'canceled'))))"
    };
}
pub(crate) use cancel_wanted;

/// SQL conditions on the status of a task named by id, written with `IS NOT DISTINCT
/// FROM` (the same as `=` on the NOT NULL column) so they imply no partial index's
/// predicate: PostgreSQL then reads the task through the primary key whatever the
/// statistics say. With `status = 'queued'` or `status IN ('queued', 'running')`, and
/// statistics taken while no task was queued, its planner walked `tasks_queued_dispatch`
/// or `tasks_app_unsucceeded` whole, believing them nearly empty.
macro_rules! status_is_queued {
    () => {
        "status IS NOT DISTINCT FROM 'queued'"
    };
}
pub(crate) use status_is_queued;

/// The task is queued or running (see [`status_is_queued!`]).
macro_rules! status_in_flight {
    () => {
        "(status IS NOT DISTINCT FROM 'queued' OR status IS NOT DISTINCT FROM 'running')"
    };
}
pub(crate) use status_in_flight;

/// What a terminal move returns of the task it moved ([`FinishedRow`]).
macro_rules! returning_finished {
    () => {
        " RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved"
    };
}
pub(crate) use returning_finished;

/// SQL condition: the task (`tasks` unaliased) runs under the lease of `$worker` and
/// `$claim` (a claim the task was requeued from since, and claimed again — by the same
/// worker, too — holds nothing) and no cancellation was requested: what a completion
/// needs, single or batched. For `concat!`.
macro_rules! completes_under {
    ($worker:literal, $claim:literal) => {
        concat!(
            "tasks.status = 'running' AND tasks.worker = ",
            $worker,
            " AND tasks.attempt = ",
            $claim,
            " AND NOT ",
            $crate::shared::lifecycle::cancel_wanted!()
        )
    };
}
pub(crate) use completes_under;

/// docs/conformance.md#lifecycle complete: `running → succeeded` under the worker's
/// lease (`$5` worker, `$6` claim, [`completes_under!`]) (`$1` output, `$2` usage, `$3`
/// now, `$4` task).
const COMPLETE: &str = concat!(
    "UPDATE tasks SET status = 'succeeded', output = $1, usage = $2, completed_at = $3 \
     WHERE id = $4 AND ",
    completes_under!("$5", "$6"),
    returning_finished!()
);

/// docs/conformance.md#lifecycle fail: `queued/running → failed` (`$1` code, `$2` message,
/// `$3` now, `$4` task, `$5` usage, kept when `NULL`).
macro_rules! fail_where {
    ($condition:expr) => {
        concat!(
            "UPDATE tasks SET status = 'failed', error_code = $1, error_message = $2, \
             completed_at = $3, usage = COALESCE($5, usage) WHERE id = $4 AND ",
            $condition,
            returning_finished!()
        )
    };
}

/// Fail whoever holds the task (see [`fail_where!`]).
const FAIL: &str = fail_where!(status_in_flight!());

/// A worker fails the task it executes: only while it runs under the worker's lease
/// (`$6` worker, `$7` claim), as [`COMPLETE`] requires (see [`fail_where!`]).
const FAIL_HELD: &str =
    fail_where!("status IS NOT DISTINCT FROM 'running' AND worker = $6 AND attempt = $7");

/// A worker acknowledges cancellation: `queued/running → canceled` when cancellation was
/// requested for the task or its run (`$1` code, `$2` message, `$3` now, `$4` task).
const MARK_CANCELED: &str = concat!(
    "UPDATE tasks SET cancel_requested = TRUE, status = 'canceled', error_code = $1, \
     error_message = $2, completed_at = $3 WHERE id = $4 AND ",
    status_in_flight!(),
    " AND ",
    cancel_wanted!(),
    returning_finished!()
);

/// The task's status and flag and its run's (`$1` task).
const CANCEL_STATE: &str = "SELECT t.status, t.cancel_requested, \
     r.cancel_requested AS run_cancel_requested, r.state AS run_state \
     FROM tasks t LEFT JOIN runs r ON r.id = t.run_id WHERE t.id = $1";

/// docs/budgets.md, "The reservation": the running task held under the worker's lease,
/// with its scope's token bucket and spend window (`$1` task, `$2` worker, `$3` the
/// window's first bucket, `$4` claim); the backend's row lock
/// ([`WorkerStatements::ATTEMPT_ROW_LOCK`]) follows.
const ATTEMPT_ROW: &str = concat!(
    "SELECT tasks.id, tasks.app, tasks.scope, tasks.created_at, tasks.reservation, \
     s.token_units, s.token_at, \
     (SELECT CAST(COALESCE(SUM(reserved_nano + settled_nano), 0) AS BIGINT) \
      FROM scope_spend b WHERE b.app = tasks.app AND b.scope = tasks.scope \
      AND b.bucket >= $3) AS scope_window_nano \
     FROM tasks LEFT JOIN scope_state s ON s.app = tasks.app AND s.scope = tasks.scope \
     WHERE tasks.id = $1 AND tasks.status IS NOT DISTINCT FROM 'running' \
     AND tasks.worker = $2 AND tasks.attempt = $4 AND tasks.reservation IS NOT NULL AND NOT ",
    cancel_wanted!()
);

/// What differs between the backends on the worker's side of tasks.
#[async_trait]
pub(crate) trait WorkerStatements: Backend {
    /// The row lock [`ATTEMPT_ROW`] ends with (PostgreSQL: the task row; SQLite: none,
    /// the write lock holds every row).
    const ATTEMPT_ROW_LOCK: &'static str;

    /// docs/conformance.md#lifecycle claim of one task: `queued → running` for `worker`
    /// unless the task or its run is canceled; the claimed row.
    async fn claim_one(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<TaskRow>>;
    /// Claims up to `limit` (1 to [`MAX_PAGE`]) queued tasks in the store's claim order.
    async fn claim_rows(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<TaskRow>>;
    /// docs/conformance.md#heartbeat: records a heartbeat for each `(id, claim)` of
    /// `held` (at least one) whose task is running under `worker` by that claim with no
    /// cancellation requested; returns those as `(id, claim)`.
    async fn keep_alive(
        &self,
        worker: &WorkerId,
        held: &[(TaskId, u32)],
    ) -> StoreResult<Vec<(String, i64)>>;
    /// The locks a reservation of one more attempt takes before reading its task
    /// (docs/locking.md; PostgreSQL: the scope's advisory lock, then the app's spend lock
    /// when the app has a limit). `false`: the task has no reservation (or is gone),
    /// there is nothing to reserve.
    async fn lock_attempt(&self, tx: &mut Self::Tx, id: TaskId) -> StoreResult<bool>;
}

/// [`WorkerStore`](crate::WorkerStore)'s shared methods.
pub(crate) struct Worker;

impl Worker {
    pub(crate) async fn claim_task<B: WorkerStatements>(
        store: &B,
        id: TaskId,
        worker: &WorkerId,
    ) -> StoreResult<Option<Task>> {
        store
            .claim_one(id, worker)
            .await?
            .map(TaskRow::into_task)
            .transpose()
    }

    pub(crate) async fn claim_next<B: WorkerStatements>(
        store: &B,
        worker: &WorkerId,
        limit: u32,
    ) -> StoreResult<Vec<Task>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = store.claim_rows(worker, limit.min(MAX_PAGE)).await?;
        // A batch starts at once; present it oldest first.
        let mut claimed = tasks(rows)?;
        claimed.sort_by_key(|t| (t.created_at, t.id));
        Ok(claimed)
    }

    pub(crate) async fn heartbeat<B: WorkerStatements>(
        store: &B,
        worker: &WorkerId,
        held: &[(TaskId, u32)],
    ) -> StoreResult<HeartbeatReport> {
        if held.is_empty() {
            return Ok(HeartbeatReport::default());
        }
        let alive = store.keep_alive(worker, held).await?;
        heartbeat_report(held, &alive)
    }

    /// One completion in its own transaction: the task succeeds and its open attempt
    /// ends `succeeded` ([`Ending::of_completion`]) before the terminal move settles it.
    pub(crate) async fn complete<B: WorkerStatements>(
        store: &B,
        item: Completion,
    ) -> StoreResult<Transition> {
        let id = item.id;
        // The request never changes, so its contract is checked before the write (against
        // the worker's claimed copy when it has one). An invalid output is never stored
        // as success.
        let read;
        let claimed = item.claimed.as_deref().filter(|t| t.id == id);
        let current = match claimed {
            Some(task) => task,
            None => match fetch_task(&mut store.reader(), &id.to_string()).await? {
                Some(task) => {
                    read = task;
                    &read
                }
                None => return Ok(Transition::default()),
            },
        };
        let (output, usage) = encode_completion(current, &item.output, &item.usage)?;
        let ending = Ending::of_completion(current, &item.usage, item.attempt.as_ref())?;
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        if current.run_id().is_some() {
            tx.lock_run_of(id).await?;
        }
        let statement = Statement::new(COMPLETE)
            .bind(output)
            .bind(usage)
            .bind(now.0)
            .bind(id.to_string())
            .bind(item.lease.worker.as_str())
            .bind(i64::from(item.lease.claim));
        let done: Option<FinishedRow> = tx.optional(statement).await?;
        if done.is_some() {
            tx.run(ending.bind(Statement::new(END_ATTEMPT), now, &id.to_string()))
                .await?;
        }
        finish(tx, id, done, TerminalMove::SUCCEEDED, now).await
    }

    pub(crate) async fn fail_task<B: WorkerStatements>(
        store: &B,
        id: TaskId,
        lease: Option<&Lease>,
        code: ErrorCode,
        message: &str,
        usage: Option<&Usage>,
    ) -> StoreResult<Transition> {
        let usage_reported = usage;
        let usage = usage.map(encode_usage).transpose()?;
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        tx.lock_run_of(id).await?;
        let statement = Statement::new(if lease.is_some() { FAIL_HELD } else { FAIL })
            .bind(code.as_str())
            .bind(truncate_message(message))
            .bind(now.0)
            .bind(id.to_string())
            .bind(usage);
        let statement = match lease {
            Some(l) => statement.bind(l.worker.as_str()).bind(i64::from(l.claim)),
            None => statement,
        };
        let done: Option<FinishedRow> = tx.optional(statement).await?;
        if let (Some(done), Some(used)) = (&done, usage_reported) {
            // The open attempt (a worker that ends its attempts itself has none) used
            // what the failure reports, at the prices the task reserved at.
            let reservation: Option<String> = tx
                .one::<(Option<String>,)>(
                    Statement::new("SELECT reservation FROM tasks WHERE id = $1").bind(&done.id),
                )
                .await?
                .0;
            let prices = reservation
                .map(|r| decode_reservation(&done.id, &r))
                .transpose()?
                .and_then(|r| r.prices);
            let end = AttemptEnd {
                outcome: AttemptOutcome::of_error(code),
                usage: Some(*used),
                prices,
                error: Some(TaskError::new(code, message)),
            };
            let ending = Ending::of(&end, Charged::default())?;
            tx.run(ending.bind(Statement::new(END_ATTEMPT), now, &done.id))
                .await?;
        }
        finish(tx, id, done, TerminalMove::ENDED, now).await
    }

    pub(crate) async fn reserve_attempt<B: WorkerStatements>(
        store: &B,
        id: TaskId,
        lease: &Lease,
        attempt: &Reservation,
    ) -> StoreResult<Option<Reservation>> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        if !store.lock_attempt(&mut tx, id).await? {
            tx.rollback_tx().await?;
            return Ok(None);
        }
        // Lock order (docs/locking.md): the backend's locks, then the task row, then
        // scope_state and the spend buckets.
        let row: Option<AttemptRow> = tx
            .optional(
                Statement::new(format!("{ATTEMPT_ROW}{}", B::ATTEMPT_ROW_LOCK))
                    .bind(id.to_string())
                    .bind(lease.worker.as_str())
                    .bind(window_first_bucket(now))
                    .bind(i64::from(lease.claim)),
            )
            .await?;
        let Some(row) = row else {
            tx.rollback_tx().await?;
            return Ok(None);
        };
        let stored = reserve_checked(&mut tx, &row, attempt, now).await?;
        tx.commit_tx().await?;
        Ok(Some(stored))
    }

    pub(crate) async fn mark_canceled<B: WorkerStatements>(
        store: &B,
        id: TaskId,
    ) -> StoreResult<Transition> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        tx.lock_run_of(id).await?;
        let done: Option<FinishedRow> = tx
            .optional(
                Statement::new(MARK_CANCELED)
                    .bind(ErrorCode::Canceled.as_str())
                    .bind(CANCELED_MESSAGE)
                    .bind(now.0)
                    .bind(id.to_string()),
            )
            .await?;
        finish(tx, id, done, TerminalMove::ENDED, now).await
    }

    pub(crate) async fn is_cancellation_requested<B: WorkerStatements>(
        store: &B,
        id: TaskId,
    ) -> StoreResult<bool> {
        let row: Option<CancelStateRow> = store
            .reader()
            .optional(Statement::new(CANCEL_STATE).bind(id.to_string()))
            .await?;
        Ok(cancellation_requested(row))
    }
}

/// [`WorkerStore`](crate::WorkerStore) for a backend that implements
/// [`WorkerStatements`] (written once; the store's wrappers forward the trait by a
/// blanket impl, so each backend states its own); its batched completion is
/// [`complete_batch`](crate::shared::completion::complete_batch) with the backend's
/// [`BatchCompletion`](crate::shared::completion::BatchCompletion).
macro_rules! worker_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::WorkerStore for $store {
            async fn claim_task(
                &self,
                id: tollgate_core::TaskId,
                worker: &tollgate_core::WorkerId,
            ) -> $crate::StoreResult<Option<tollgate_core::Task>> {
                $crate::shared::lifecycle::Worker::claim_task(self, id, worker).await
            }

            async fn claim_next(
                &self,
                worker: &tollgate_core::WorkerId,
                limit: u32,
            ) -> $crate::StoreResult<Vec<tollgate_core::Task>> {
                $crate::shared::lifecycle::Worker::claim_next(self, worker, limit).await
            }

            async fn heartbeat(
                &self,
                worker: &tollgate_core::WorkerId,
                held: &[(tollgate_core::TaskId, u32)],
            ) -> $crate::StoreResult<$crate::HeartbeatReport> {
                $crate::shared::lifecycle::Worker::heartbeat(self, worker, held).await
            }

            async fn complete_task(
                &self,
                id: tollgate_core::TaskId,
                lease: &tollgate_core::Lease,
                output: serde_json::Value,
                usage: tollgate_core::Usage,
            ) -> $crate::StoreResult<$crate::Transition> {
                let item = $crate::Completion {
                    id,
                    lease: lease.clone(),
                    output,
                    usage,
                    claimed: None,
                    attempt: None,
                };
                $crate::shared::lifecycle::Worker::complete(self, item).await
            }

            async fn complete_tasks(
                &self,
                items: Vec<$crate::Completion>,
            ) -> $crate::StoreResult<Vec<$crate::StoreResult<$crate::Transition>>> {
                $crate::shared::completion::complete_batch(self, items).await
            }

            async fn fail_task(
                &self,
                id: tollgate_core::TaskId,
                lease: Option<&tollgate_core::Lease>,
                code: tollgate_core::ErrorCode,
                message: &str,
                usage: Option<&tollgate_core::Usage>,
            ) -> $crate::StoreResult<$crate::Transition> {
                $crate::shared::lifecycle::Worker::fail_task(self, id, lease, code, message, usage)
                    .await
            }

            async fn reserve_attempt(
                &self,
                id: tollgate_core::TaskId,
                lease: &tollgate_core::Lease,
                attempt: &tollgate_core::Reservation,
            ) -> $crate::StoreResult<Option<tollgate_core::Reservation>> {
                $crate::shared::lifecycle::Worker::reserve_attempt(self, id, lease, attempt).await
            }

            async fn mark_canceled(
                &self,
                id: tollgate_core::TaskId,
            ) -> $crate::StoreResult<$crate::Transition> {
                $crate::shared::lifecycle::Worker::mark_canceled(self, id).await
            }

            async fn is_cancellation_requested(
                &self,
                id: tollgate_core::TaskId,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::lifecycle::Worker::is_cancellation_requested(self, id).await
            }
        }
    };
}
pub(crate) use worker_store_for;
