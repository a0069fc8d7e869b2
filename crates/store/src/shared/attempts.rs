//! Attempts (docs/routes.md, "Attempts") written once for both backends: a running
//! task's worker begins an attempt before a deployment's call and ends it after
//! ([`Attempts`]); each attempt keeps what it reserved and, once ended, what it is
//! charged (core's [`attempt_charge`]); a terminal move settles the sum
//! ([`ATTEMPT_CHARGES`], read with the settlement's rows) and ends an attempt still
//! open; the sweep puts a silent task with tries left back in the queue ([`requeue`]).
//!
//! At most one attempt of a task is open (`ended_at IS NULL`): one begins only while the
//! task is running under the worker's lease (its worker and claim) and none is open, in one transaction that writes the
//! task row first (the row lock on PostgreSQL; SQLite's writer covers all).

use crate::shared::dispatch::QUEUE_JOIN;
use crate::shared::lifecycle::cancel_wanted;
use crate::shared::rows::task_id;
use crate::shared::sql::{Backend, Exec, Statement, TxExec};
use crate::{AttemptEnd, StoreError, StoreResult};
use tollgate_core::attempt::{Attempt, AttemptOutcome, Charged, attempt_charge};
use tollgate_core::{
    AppId, ErrorCode, Lease, TaskError, TaskId, Timestamp, Usage, Weight, join_credit, stride,
};

/// The settlement's view of a task's attempts, as columns of a `tasks` select: how many
/// it made, and the sum of what they are charged (an open one at its reservation).
macro_rules! attempt_charges {
    () => {
        "(SELECT COUNT(*) FROM task_attempts a WHERE a.task_id = tasks.id) AS attempts, \
         CAST(COALESCE((SELECT SUM(COALESCE(a.charged_nano, a.reserved_nano)) \
         FROM task_attempts a WHERE a.task_id = tasks.id), 0) AS BIGINT) AS attempts_nano, \
         CAST(COALESCE((SELECT SUM(COALESCE(a.charged_tokens, a.reserved_tokens)) \
         FROM task_attempts a WHERE a.task_id = tasks.id), 0) AS BIGINT) AS attempts_tokens"
    };
}
pub(crate) use attempt_charges;

/// SQL condition: the task has tries left (docs/routes.md, "Attempts"): it was claimed
/// and attempted fewer times than its `max_attempts` (each claim uses up a try, so a task
/// of one try is never run twice; `tasks` unaliased). A silent task with tries left whose
/// cancellation was not requested goes back to the queue; only the others expire.
macro_rules! tries_left {
    () => {
        "(max_attempts > attempt AND max_attempts > \
         (SELECT COUNT(*) FROM task_attempts a WHERE a.task_id = tasks.id))"
    };
}
pub(crate) use tries_left;

/// The outcome of an attempt still open when its task ends (a terminal move): canceled
/// with a canceled task, otherwise interrupted (its worker ended the task without ending
/// the attempt, or the sweep did). As an SQL expression over `task_attempts`.
macro_rules! open_attempt_outcome {
    () => {
        "COALESCE((SELECT CASE WHEN t.status = 'canceled' THEN 'canceled' \
         ELSE 'interrupted' END FROM tasks t WHERE t.id = task_attempts.task_id), 'interrupted')"
    };
}
pub(crate) use open_attempt_outcome;

/// The number of the attempt a claim begins (docs/routes.md, "Attempts"): after every
/// attempt the task made (`tasks` unaliased). A claim stores it as the task's `attempt`,
/// which is then the claim's number: it grows with every claim.
macro_rules! claim_attempt {
    () => {
        "(SELECT COUNT(*) FROM task_attempts a WHERE a.task_id = tasks.id) + 1"
    };
}
pub(crate) use claim_attempt;

/// A claim's attempt, opened with the claim (docs/routes.md, "Attempts"), one row per
/// task just claimed (`$from`: the claimed rows, with `attempt` set by
/// [`claim_attempt!`]): on the first deployment of the task's model reference, named
/// as [`Deployment::name`](tollgate_core::Deployment::name) names it (`provider/model`;
/// a route's first deployment), holding the admission's reservation when it is the
/// task's first attempt (a requeued task's later attempt holds nothing until its
/// worker reserves it). The backend supplies how it reads a field of a JSON text
/// (`$provider`, `$model` of `model_ref`; `$nano`, `$tokens` of `reservation`). A worker
/// whose call goes to another deployment of the route says so first
/// ([`AttemptStore::redirect_attempt`](crate::AttemptStore::redirect_attempt)).
macro_rules! open_claimed_attempts {
    ($from:expr, $provider:expr, $model:expr, $nano:expr, $tokens:expr) => {
        concat!(
            "INSERT INTO task_attempts (task_id, n, deployment, started_at, outcome, \
             reserved_nano, reserved_tokens) SELECT id, attempt, ",
            $provider,
            " || '/' || ",
            $model,
            ", claimed_at, 'running', CASE WHEN attempt = 1 THEN COALESCE(CAST(",
            $nano,
            " AS BIGINT), 0) ELSE 0 END, CASE WHEN attempt = 1 THEN COALESCE(CAST(",
            $tokens,
            " AS BIGINT), 0) ELSE 0 END FROM ",
            $from
        )
    };
}
pub(crate) use open_claimed_attempts;

/// What an ended attempt's row says when a terminal move or a requeue ends it: charged
/// its reservation (its usage is unknown). `$1` the time, `$2` the outcome, `$3` the
/// error code, `$4` the message; the caller appends its task condition.
pub(crate) const END_OPEN: &str = "UPDATE task_attempts SET ended_at = $1, outcome = $2, \
     charged_nano = reserved_nano, charged_tokens = reserved_tokens, \
     error_code = $3, error_message = $4 WHERE ended_at IS NULL AND ";

/// Ends an open attempt of a task with what its worker says ([`Ending`]): `$1` the
/// time, `$2`–`$7` the ending, `$8` the task; the caller appends its condition on the
/// attempt. Written once for [`AttemptStore::end_attempt`](crate::AttemptStore::end_attempt)
/// and the completions, which end the attempt that produced the output.
pub(crate) const END_ATTEMPT: &str = "UPDATE task_attempts SET ended_at = $1, outcome = $2, \
     usage = $3, charged_nano = $4, charged_tokens = $5, error_code = $6, error_message = $7 \
     WHERE task_id = $8 AND ended_at IS NULL";

/// What an attempt's row says once its worker ends it: its outcome, usage, charge
/// (core's [`attempt_charge`]) and error.
pub(crate) struct Ending {
    pub(crate) outcome: &'static str,
    pub(crate) usage: Option<String>,
    pub(crate) charged: Charged,
    pub(crate) error: Option<TaskError>,
}

impl Ending {
    /// The ending of an attempt that reserved `reserved`.
    pub(crate) fn of(end: &AttemptEnd, reserved: Charged) -> StoreResult<Ending> {
        let usage = end.usage.map(|u| u.clamped().0);
        let charged = attempt_charge(end.prices, usage.as_ref(), reserved);
        Ok(Ending {
            outcome: end.outcome.as_str(),
            usage: usage
                .map(|u| serde_json::to_string(&u))
                .transpose()
                .map_err(|e| corrupt("usage", e))?,
            charged,
            error: end
                .error
                .as_ref()
                .map(|e| TaskError::new(e.code, &e.message)),
        })
    }

    /// The attempt that produced a completion's output (docs/routes.md, "Attempts"):
    /// `succeeded`, charged its own usage at its deployment's prices — `attempt`, or,
    /// when the completion does not say, the completion's usage at the prices the task
    /// reserved at. Its usage is known, so its reservation does not count.
    pub(crate) fn of_completion(
        task: &tollgate_core::Task,
        usage: &Usage,
        attempt: Option<&crate::AttemptUsage>,
    ) -> StoreResult<Ending> {
        let (usage, prices) = match attempt {
            Some(a) => (a.usage, a.prices),
            None => (*usage, task.reservation.and_then(|r| r.prices)),
        };
        let end = AttemptEnd {
            outcome: AttemptOutcome::Succeeded,
            usage: Some(usage),
            prices,
            error: None,
        };
        Ending::of(&end, Charged::default())
    }

    /// [`END_ATTEMPT`]'s `$2`–`$8` bound on `statement` (its `$1` the time).
    pub(crate) fn bind(&self, statement: Statement, now: Timestamp, id: &str) -> Statement {
        let error = self.error.clone();
        statement
            .bind(now.0)
            .bind(self.outcome)
            .bind(self.usage.clone())
            .bind(self.charged.nano_usd)
            .bind(i64::try_from(self.charged.tokens).unwrap_or(i64::MAX))
            .bind(error.as_ref().map(|e| e.code.as_str()))
            .bind(error.map(|e| e.message))
            .bind(id.to_string())
    }
}

/// A running task's facts when an attempt begins.
#[derive(sqlx::FromRow)]
struct BeginRow {
    max_attempts: i64,
    made: i64,
    open: i64,
}

/// An attempt's row as stored.
#[derive(sqlx::FromRow)]
struct AttemptRow {
    n: i64,
    deployment: String,
    started_at: i64,
    ended_at: Option<i64>,
    outcome: String,
    usage: Option<String>,
    reserved_nano: i64,
    reserved_tokens: i64,
    charged_nano: Option<i64>,
    charged_tokens: Option<i64>,
    error_code: Option<String>,
    error_message: Option<String>,
}

fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("attempt {what}: {e}"))
}

fn tokens(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl AttemptRow {
    fn into_attempt(self) -> StoreResult<Attempt> {
        let reserved = Charged {
            nano_usd: self.reserved_nano,
            tokens: tokens(self.reserved_tokens),
        };
        let error = match (self.error_code, self.error_message) {
            (Some(code), message) => Some(TaskError {
                code: ErrorCode::parse(&code).ok_or_else(|| corrupt("error_code", &code))?,
                message: message.unwrap_or_default(),
            }),
            (None, _) => None,
        };
        Ok(Attempt {
            n: u32::try_from(self.n).map_err(|e| corrupt("n", e))?,
            deployment: self.deployment,
            started_at: Timestamp(self.started_at),
            ended_at: self.ended_at.map(Timestamp),
            outcome: AttemptOutcome::parse(&self.outcome)
                .ok_or_else(|| corrupt("outcome", &self.outcome))?,
            usage: self
                .usage
                .as_deref()
                .map(serde_json::from_str::<Usage>)
                .transpose()
                .map_err(|e| corrupt("usage", e))?,
            reserved,
            charged: match (self.charged_nano, self.charged_tokens) {
                (Some(nano_usd), Some(t)) => Charged {
                    nano_usd,
                    tokens: tokens(t),
                },
                _ => reserved,
            },
            error,
        })
    }
}

/// [`AttemptStore`](crate::AttemptStore)'s methods.
pub(crate) struct Attempts;

impl Attempts {
    /// Begins the next attempt of a task running under `lease`; see
    /// [`AttemptStore::begin_attempt`](crate::AttemptStore::begin_attempt).
    pub(crate) async fn begin<B: Backend>(
        store: &B,
        id: TaskId,
        lease: &Lease,
        deployment: &str,
    ) -> StoreResult<Option<u32>> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let id = id.to_string();
        // Writing the task row first: its lock orders concurrent begins and the sweep.
        let row: Option<BeginRow> = tx
            .optional(
                Statement::new(
                    "UPDATE tasks SET heartbeat_at = $1 \
                     WHERE id = $2 AND status = 'running' AND worker = $3 AND attempt = $4 \
                     RETURNING max_attempts, \
                     (SELECT COUNT(*) FROM task_attempts a WHERE a.task_id = tasks.id) AS made, \
                     (SELECT COUNT(*) FROM task_attempts a WHERE a.task_id = tasks.id \
                      AND a.ended_at IS NULL) AS open",
                )
                .bind(now.0)
                .bind(&id)
                .bind(lease.worker.as_str())
                .bind(i64::from(lease.claim)),
            )
            .await?;
        let Some(row) = row.filter(|r| r.open == 0 && r.made < r.max_attempts) else {
            tx.rollback_tx().await?;
            return Ok(None);
        };
        // A claim opens its first attempt with the admission's reservation; a later one
        // reserves before its call (`reserve_attempt` adds to the open attempt).
        let reserved = Charged::default();
        let n = row.made + 1;
        tx.run(
            Statement::new(
                "INSERT INTO task_attempts (task_id, n, deployment, started_at, outcome, \
                 reserved_nano, reserved_tokens) VALUES ($1, $2, $3, $4, $5, $6, $7)",
            )
            .bind(&id)
            .bind(n)
            .bind(deployment)
            .bind(now.0)
            .bind(AttemptOutcome::Running.as_str())
            .bind(reserved.nano_usd)
            .bind(i64::try_from(reserved.tokens).unwrap_or(i64::MAX)),
        )
        .await?;
        tx.commit_tx().await?;
        Ok(Some(u32::try_from(n).unwrap_or(u32::MAX)))
    }

    /// Ends attempt `n` of a task; see [`AttemptStore::end_attempt`](crate::AttemptStore::end_attempt).
    pub(crate) async fn end<B: Backend>(
        store: &B,
        id: TaskId,
        n: u32,
        end: &AttemptEnd,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let id = id.to_string();
        let reserved: Option<(i64, i64)> = tx
            .optional(
                Statement::new(
                    "SELECT reserved_nano, reserved_tokens FROM task_attempts \
                     WHERE task_id = $1 AND n = $2 AND ended_at IS NULL",
                )
                .bind(&id)
                .bind(i64::from(n)),
            )
            .await?;
        let Some((nano_usd, reserved_tokens)) = reserved else {
            tx.rollback_tx().await?;
            return Ok(false);
        };
        let reserved = Charged {
            nano_usd,
            tokens: tokens(reserved_tokens),
        };
        let ending = Ending::of(end, reserved)?;
        tx.run(
            ending
                .bind(
                    Statement::new(format!("{END_ATTEMPT} AND n = $9")),
                    now,
                    &id,
                )
                .bind(i64::from(n)),
        )
        .await?;
        tx.commit_tx().await?;
        Ok(true)
    }

    /// Moves the claim's open attempt to another deployment; see
    /// [`AttemptStore::redirect_attempt`](crate::AttemptStore::redirect_attempt).
    pub(crate) async fn redirect<B: Backend>(
        store: &B,
        id: TaskId,
        lease: &Lease,
        n: u32,
        deployment: &str,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        let moved = tx
            .run(
                Statement::new(
                    "UPDATE task_attempts SET deployment = $1 \
                     WHERE task_id = $2 AND n = $3 AND ended_at IS NULL AND EXISTS \
                     (SELECT 1 FROM tasks WHERE tasks.id = $2 AND tasks.status = 'running' \
                      AND tasks.worker = $4 AND tasks.attempt = $5)",
                )
                .bind(deployment)
                .bind(id.to_string())
                .bind(i64::from(n))
                .bind(lease.worker.as_str())
                .bind(i64::from(lease.claim)),
            )
            .await?;
        tx.commit_tx().await?;
        Ok(moved > 0)
    }

    /// Hands a held task back to the queue; see
    /// [`AttemptStore::requeue_task`](crate::AttemptStore::requeue_task).
    pub(crate) async fn hand_back<B: Backend>(
        store: &B,
        id: TaskId,
        lease: &Lease,
        message: &str,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let moved: Option<RequeueRow> = tx
            .optional(
                Statement::new(HAND_BACK)
                    .bind(id.to_string())
                    .bind(lease.worker.as_str())
                    .bind(i64::from(lease.claim)),
            )
            .await?;
        let Some(row) = moved else {
            tx.rollback_tx().await?;
            return Ok(false);
        };
        back_in_queue(&mut tx, &[&row], message, now).await?;
        tx.commit_tx().await?;
        Ok(true)
    }

    /// A task's attempts in order; see [`AttemptStore::task_attempts`](crate::AttemptStore::task_attempts).
    pub(crate) async fn list<B: Backend>(
        store: &B,
        app: &AppId,
        id: TaskId,
    ) -> StoreResult<Vec<Attempt>> {
        let rows: Vec<AttemptRow> = store
            .reader()
            .all(
                Statement::new(
                    "SELECT a.n, a.deployment, a.started_at, a.ended_at, a.outcome, a.usage, \
                     a.reserved_nano, a.reserved_tokens, a.charged_nano, a.charged_tokens, \
                     a.error_code, a.error_message \
                     FROM task_attempts a JOIN tasks t ON t.id = a.task_id \
                     WHERE t.app = $1 AND a.task_id = $2 ORDER BY a.n",
                )
                .bind(app.as_str())
                .bind(id.to_string()),
            )
            .await?;
        rows.into_iter().map(AttemptRow::into_attempt).collect()
    }
}

/// A running task the sweep found silent with tries left.
#[derive(sqlx::FromRow)]
pub(crate) struct RequeueRow {
    pub(crate) id: String,
    pub(crate) app: String,
    pub(crate) scope: String,
}

/// The sweep's requeue (docs/routes.md, "Attempts"): running tasks silent past the
/// liveness timeout that have tries left (`picked`, each backend's pick with its locks)
/// go back to the queue for their next attempt ([`back_in_queue`]). Returns the
/// requeued tasks.
pub(crate) async fn requeue<E: Exec + ?Sized>(
    tx: &mut E,
    picked: &[RequeueRow],
    message: &str,
    now: Timestamp,
) -> StoreResult<Vec<(AppId, TaskId)>> {
    let mut moved = Vec::with_capacity(picked.len());
    for row in picked {
        let n = tx
            .run(
                Statement::new(
                    "UPDATE tasks SET status = 'queued', worker = NULL, heartbeat_at = NULL \
                     WHERE id = $1 AND status = 'running'",
                )
                .bind(&row.id),
            )
            .await?;
        if n > 0 {
            moved.push(row);
        }
    }
    back_in_queue(tx, &moved, message, now).await
}

/// Tasks just moved from running back to queued: their open attempt ended as interrupted
/// and charged its reservation (it may have been billed), their (app, scope) dispatch
/// queue active again.
async fn back_in_queue<E: Exec + ?Sized>(
    tx: &mut E,
    moved: &[&RequeueRow],
    message: &str,
    now: Timestamp,
) -> StoreResult<Vec<(AppId, TaskId)>> {
    let mut requeued = Vec::with_capacity(moved.len());
    for RequeueRow { id, app, .. } in moved.iter().copied() {
        tx.run(
            Statement::new(format!("{END_OPEN}task_id = $5"))
                .bind(now.0)
                .bind(AttemptOutcome::Interrupted.as_str())
                .bind(ErrorCode::Interrupted.as_str())
                .bind(message)
                .bind(id),
        )
        .await?;
        let app = AppId::new(app.as_str()).map_err(|e| corrupt("app", e))?;
        requeued.push((app, task_id(id)?));
    }
    // Each queue once, in (app, scope) order; an idle queue joins at the least pass of
    // the active ones (or keeps its own, if later), holding no credit. An active queue's
    // row is written too (unchanged): its lock, held to the commit as a creation holds
    // it, keeps a claim that found the queue empty from deactivating it before the
    // requeued task is seen (the claim skips a held row and leaves the queue active).
    let mut queues: Vec<(&str, &str)> = moved
        .iter()
        .map(|r| (r.app.as_str(), r.scope.as_str()))
        .collect();
    queues.sort_unstable();
    queues.dedup();
    for (app, scope) in queues {
        let joined_at = "CASE WHEN active THEN pass \
             WHEN (SELECT MIN(q.pass) FROM dispatch_queues q WHERE q.active) > pass \
             THEN (SELECT MIN(q.pass) FROM dispatch_queues q WHERE q.active) ELSE pass END";
        let updated = tx
            .run(
                Statement::new(format!(
                    "UPDATE dispatch_queues SET pass = {joined_at}, \
                     base = CASE WHEN active THEN base ELSE {joined_at} END, \
                     joined = CASE WHEN active THEN joined ELSE NULL END, active = TRUE \
                     WHERE app = $1 AND scope = $2"
                ))
                .bind(app)
                .bind(scope),
            )
            .await?;
        if updated == 0 {
            // No queue yet: its tasks were all created claimed (docs/engine.md, "Tasks
            // claimed at creation"), which join none. It joins now as a creation's
            // would, at the default weight (the task's policy is the engine's; the
            // scope's next creation that joins sets it).
            let weight = Weight::default();
            tx.run(
                Statement::new(format!(
                    "WITH join_params AS (SELECT CAST($1 AS TEXT) AS app, \
                     CAST($2 AS TEXT) AS scope, CAST($3 AS BIGINT) AS weight, \
                     CAST($4 AS BIGINT) AS credit, CAST($5 AS BIGINT) AS stride) {QUEUE_JOIN}"
                ))
                .bind(app)
                .bind(scope)
                .bind(i64::from(weight))
                .bind(join_credit(weight))
                .bind(stride(weight)),
            )
            .await?;
        }
    }
    Ok(requeued)
}

/// A worker hands back a task it holds (docs/routes.md, "Attempts"): running under its
/// lease, cancellation not requested, claimed and attempted fewer times than its
/// `max_attempts` (`$1` task, `$2` worker, `$3` claim). The row lock of the update orders it with the sweep and
/// with the task's other writes.
const HAND_BACK: &str = concat!(
    "UPDATE tasks SET status = 'queued', worker = NULL, heartbeat_at = NULL \
     WHERE id = $1 AND status = 'running' AND worker = $2 AND attempt = $3 AND ",
    tries_left!(),
    " AND NOT ",
    cancel_wanted!(),
    " RETURNING id, app, scope"
);

/// [`AttemptStore`](crate::AttemptStore) for a backend (written once here; each backend
/// states it with one line).
macro_rules! attempt_store_for {
    ($store:ty) => {
        #[async_trait::async_trait]
        impl $crate::AttemptStore for $store {
            async fn begin_attempt(
                &self,
                id: tollgate_core::TaskId,
                lease: &tollgate_core::Lease,
                deployment: &str,
            ) -> $crate::StoreResult<Option<u32>> {
                $crate::shared::attempts::Attempts::begin(self, id, lease, deployment).await
            }

            async fn redirect_attempt(
                &self,
                id: tollgate_core::TaskId,
                lease: &tollgate_core::Lease,
                n: u32,
                deployment: &str,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::attempts::Attempts::redirect(self, id, lease, n, deployment).await
            }

            async fn end_attempt(
                &self,
                id: tollgate_core::TaskId,
                n: u32,
                end: &$crate::AttemptEnd,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::attempts::Attempts::end(self, id, n, end).await
            }

            async fn task_attempts(
                &self,
                app: &tollgate_core::AppId,
                id: tollgate_core::TaskId,
            ) -> $crate::StoreResult<Vec<tollgate_core::Attempt>> {
                $crate::shared::attempts::Attempts::list(self, app, id).await
            }

            async fn requeue_task(
                &self,
                id: tollgate_core::TaskId,
                lease: &tollgate_core::Lease,
                message: &str,
            ) -> $crate::StoreResult<bool> {
                $crate::shared::attempts::Attempts::hand_back(self, id, lease, message).await
            }
        }
    };
}
pub(crate) use attempt_store_for;
