//! docs/conformance.md#heartbeat on PostgreSQL, the worker's side ([`WorkerStore`](crate::WorkerStore)):
//! complete, fail, acknowledge cancellation and the rest are written once in
//! `shared::lifecycle`; here are the statements that differ (the claims with `SKIP
//! LOCKED`, the heartbeat's row locks in id order, a reservation's advisory locks) and
//! the batched completion, one transaction for a batch.

use super::admission::lock_scope;
use super::terminal::refund_tokens_sql;
use super::{PostgresStore, now_sql};
use crate::shared::admission::SpendReads;
use crate::shared::attempts::claim_attempt;
use crate::shared::completion::{self, Batch, BatchCompletion, Prepared};
use crate::shared::cost::{
    SettleRow, SettlementPlan, SpendDelta, app_spend_into, decode_reservation, plan_settlement,
    scope_spend_into, spend_rows_conflict,
};
use crate::shared::lifecycle::{
    WorkerStatements, cancel_wanted, completes_under, run_not_canceled, status_is_queued,
    worker_store_for,
};
use crate::shared::rows::{CompletedRow, TaskRow, task_columns, task_columns_qualified, tasks};
use crate::shared::webhooks::{
    apps_announcing, budget_listened, budget_listener_pattern, task_event_listened,
};
use crate::{ClaimOrder, StoreError, StoreResult};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tollgate_core::{AppId, AttemptOutcome, RunId, ScopeId, Task, TaskId, WorkerId};

/// A completion batch's statement up to its last CTE, `$1` to `$13` ([`bind_batch`]).
///
/// "now" is read inside the statement (no round trip of its own) and returned with
/// every row it moved, as the row is now (no read afterwards). The rows are found by id
/// as arrays (`= ANY`), locked in id order, and only then joined to the items: joined to
/// the unnested items from the start, the planner (which cannot know how many items
/// there are) took every running task for every item, 9 ms for a batch of 57 behind 150
/// running tasks instead of 1. The tasks moved end their open attempts in the same
/// statement (docs/routes.md, "Attempts"). The reserved ones are charged in it too (a
/// running task is not settled yet: settlement happens once, at its terminal move) what
/// they cost if that attempt was their only one. Each row also says whether its event
/// has a listener, so a batch nobody listens to skips the outbox statement.
macro_rules! completion_ctes {
    () => {
        concat!(
            "WITH clock AS (SELECT ",
            now_sql!(5),
            " AS now), \
             item AS (SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], \
             $6::TEXT[], $7::BIGINT[], $8::BIGINT[], $10::BIGINT[], $11::BIGINT[], \
             $12::BIGINT[], $13::TEXT[]) \
             AS i(id, worker, output, usage, attempt_usage, charged_nano, charged_tokens, \
             claim, guess_nano, guess_tokens, guess_reservation)), \
             picked AS MATERIALIZED (SELECT id FROM tasks WHERE id = ANY($1) \
             AND status = 'running' ORDER BY id FOR NO KEY UPDATE), \
             done AS (UPDATE tasks SET status = 'succeeded', output = item.output, \
             usage = item.usage, completed_at = clock.now, \
             charged_nano = CASE WHEN tasks.reservation IS NULL THEN NULL \
               ELSE item.guess_nano END, \
             charged_tokens = CASE WHEN tasks.reservation IS NULL THEN NULL \
               ELSE item.guess_tokens END FROM item, clock \
             WHERE tasks.id = ANY(ARRAY(SELECT id FROM picked)) AND item.id = tasks.id AND ",
            completes_under!("item.worker", "item.claim"),
            " RETURNING ",
            task_columns_qualified!(),
            ", tasks.admitted, clock.now AS now, ",
            task_event_listened!("tasks"),
            " AS listened), \
             ended AS (UPDATE task_attempts SET ended_at = done.now, outcome = $9, \
             usage = item.attempt_usage, charged_nano = item.charged_nano, \
             charged_tokens = item.charged_tokens, error_code = NULL, error_message = NULL \
             FROM done JOIN item ON item.id = done.id \
             WHERE task_attempts.task_id = done.id AND task_attempts.ended_at IS NULL)"
        )
    };
}

/// The rows a completion batch moved ([`CompletedRow`]), each with its attempts as the
/// settlement counts them once the attempt ending now has ended (`attempt_charges!`'s
/// sums), read in the statement's snapshot: a running task's attempts change only by its
/// claiming worker, whose completion this is. An unreserved task has nothing to settle,
/// so its attempts are not read.
macro_rules! completed_rows {
    () => {
        "SELECT done.*, a.attempts, a.attempts_nano, a.attempts_tokens \
         FROM done JOIN item ON item.id = done.id CROSS JOIN LATERAL \
         (SELECT COUNT(*) AS attempts, CAST(COALESCE(SUM(CASE WHEN a.ended_at IS NULL \
           THEN item.charged_nano ELSE COALESCE(a.charged_nano, a.reserved_nano) END), 0) \
           AS BIGINT) AS attempts_nano, CAST(COALESCE(SUM(CASE WHEN a.ended_at IS NULL \
           THEN item.charged_tokens ELSE COALESCE(a.charged_tokens, a.reserved_tokens) \
           END), 0) AS BIGINT) AS attempts_tokens \
         FROM task_attempts a WHERE a.task_id = done.id \
           AND done.reservation IS NOT NULL) a"
    };
}

/// The end of a claim statement after its `clock` (and `picked`) CTEs: `$update` (the
/// claim's `UPDATE … RETURNING` the task columns) as the CTE `claimed`, the claims'
/// attempts opened from it in the same statement
/// ([`open_claimed_attempts!`](crate::shared::attempts::open_claimed_attempts), JSON read
/// with `->>`), and the claimed rows as the answer: still one round trip.
macro_rules! claiming {
    ($update:expr) => {
        concat!(
            ", claimed AS (",
            $update,
            "), opened AS (",
            $crate::shared::attempts::open_claimed_attempts!(
                "claimed",
                "(model_ref::json ->> 'provider')",
                "(model_ref::json ->> 'model')",
                "(reservation::json ->> 'nano_usd')",
                "(reservation::json ->> 'tokens')"
            ),
            ") SELECT * FROM claimed"
        )
    };
}
pub(super) use claiming;

#[async_trait]
impl WorkerStatements for PostgresStore {
    const ATTEMPT_ROW_LOCK: &'static str = " FOR UPDATE OF tasks";

    async fn claim_one(&self, id: TaskId, worker: &WorkerId) -> StoreResult<Option<TaskRow>> {
        // One statement, its own transaction: one round trip. A concurrent claim waits for
        // the row, then re-checks `status = 'queued'` and finds it running: each task is
        // claimed once.
        Ok(sqlx::query_as(concat!(
            "WITH clock AS (SELECT ",
            now_sql!(2),
            " AS now)",
            claiming!(concat!(
                "UPDATE tasks SET status = 'running', worker = $1, attempt = ",
                claim_attempt!(),
                ", claimed_at = clock.now, heartbeat_at = clock.now FROM clock \
                 WHERE id = $3 AND ",
                status_is_queued!(),
                " AND NOT cancel_requested AND ",
                run_not_canceled!(),
                " RETURNING ",
                task_columns_qualified!()
            ))
        ))
        .bind(worker.as_str())
        .bind(self.fixed_now())
        .bind(id.to_string())
        .fetch_optional(&self.pool)
        .await?)
    }

    async fn claim_rows(&self, worker: &WorkerId, limit: u32) -> StoreResult<Vec<TaskRow>> {
        match self.claim_order {
            ClaimOrder::Fair => super::dispatch::claim_fair(self, worker, limit).await,
            // One statement, its own transaction: one round trip for the whole claim.
            // MATERIALIZED: the pick runs once, so LIMIT and SKIP LOCKED hold exactly.
            ClaimOrder::Oldest => Ok(sqlx::query_as(concat!(
                "WITH clock AS (SELECT ",
                now_sql!(2),
                " AS now), picked AS MATERIALIZED (SELECT id FROM tasks \
                 WHERE status = 'queued' AND NOT cancel_requested AND ",
                run_not_canceled!(),
                " ORDER BY created_at, id LIMIT $3 FOR UPDATE SKIP LOCKED)",
                claiming!(concat!(
                    "UPDATE tasks SET status = 'running', worker = $1, attempt = ",
                    claim_attempt!(),
                    ", claimed_at = clock.now, heartbeat_at = clock.now FROM clock \
                     WHERE tasks.id = ANY(ARRAY(SELECT id FROM picked)) RETURNING ",
                    task_columns_qualified!()
                ))
            ))
            .bind(worker.as_str())
            .bind(self.fixed_now())
            .bind(i64::from(limit))
            .fetch_all(&self.pool)
            .await?),
        }
    }

    async fn keep_alive(
        &self,
        worker: &WorkerId,
        held: &[(TaskId, u32)],
    ) -> StoreResult<Vec<(String, i64)>> {
        // One statement for all of the worker's tasks, its own transaction: one round trip.
        // Rows are found by id as an array and locked in id order (the lock order for
        // several task rows); the claims are only a filter on them, each (id, claim)
        // pair asked about (`$4`, parallel to `$2`) a lease the task must still run by.
        let (ids, claims): (Vec<String>, Vec<i64>) = held
            .iter()
            .map(|(id, claim)| (id.to_string(), i64::from(*claim)))
            .unzip();
        Ok(sqlx::query_as(concat!(
            "WITH picked AS MATERIALIZED (SELECT id FROM tasks WHERE id = ANY($2) \
             AND status = 'running' AND worker = $3 AND EXISTS (SELECT 1 FROM \
             unnest($2::TEXT[], $4::BIGINT[]) AS h(id, claim) \
             WHERE h.id = tasks.id AND h.claim = tasks.attempt) \
             ORDER BY id FOR NO KEY UPDATE) \
             UPDATE tasks SET heartbeat_at = ",
            now_sql!(1),
            " FROM picked \
             WHERE tasks.id = picked.id AND tasks.status = 'running' AND NOT ",
            cancel_wanted!(),
            " RETURNING tasks.id, tasks.attempt"
        ))
        .bind(self.fixed_now())
        .bind(ids)
        .bind(worker.as_str())
        .bind(claims)
        .fetch_all(&self.pool)
        .await?)
    }

    async fn lock_attempt(&self, tx: &mut Self::Tx, id: TaskId) -> StoreResult<bool> {
        // Which scope: then its exclusive advisory lock, as an admission takes it, so this
        // reservation and the scope's admissions are serialized (the same exactness).
        let owner: Option<(String, String, String)> = sqlx::query_as(
            "SELECT app, scope, reservation FROM tasks WHERE id = $1 AND reservation IS NOT NULL",
        )
        .bind(id.to_string())
        .fetch_optional(&mut **tx)
        .await?;
        let Some((app, scope, admitted)) = owner else {
            return Ok(false);
        };
        // The limits never change after admission: whether the app's lock is needed.
        let app_limited = decode_reservation(&id.to_string(), &admitted)?
            .limits
            .is_some_and(|l| l.app_nano_per_24_hours.is_some());
        let corrupt =
            |e: tollgate_core::InvalidInput| StoreError::Corrupt(format!("task {id}: {e}"));
        let app_id = AppId::new(app).map_err(corrupt)?;
        let scope_id = ScopeId::new(scope).map_err(corrupt)?;
        lock_scope(tx, &app_id, &scope_id, true).await?;
        if app_limited {
            // The app's spend lock, as an admission takes it (scope, then app), in its
            // own statement so the app's window read after it is current.
            tx.lock_app(&app_id).await?;
        }
        Ok(true)
    }
}

worker_store_for!(PostgresStore);

/// Several completions in ONE transaction ([`completion::complete_batch`], which checks
/// each item as [`complete_task`](crate::WorkerStore::complete_task) checks it): one
/// statement moves every applicable task to `succeeded` (for a lone completion outside a
/// run, that statement may be the whole write: [`complete_in_one_statement`]). Lock order as on the single paths: the runs of the tasks first, then
/// the task rows in id order. Runs woken by the batch are reported on its first applied
/// transition (wakes are notification hints; the database holds the truth).
#[async_trait]
impl BatchCompletion for PostgresStore {
    async fn tasks_by_id(&self, ids: &[String]) -> StoreResult<HashMap<TaskId, Task>> {
        tasks_by_id(&self.pool, ids).await
    }

    async fn write(&self, prepared: &Prepared) -> StoreResult<(Vec<CompletedRow>, Vec<RunId>)> {
        let (batch, any_run) = (&prepared.batch, prepared.any_run);
        // A lone completion (at low load) is written in one statement when its guess
        // holds; a batch of several in its transaction (docs/locking.md, "Completions in
        // one statement").
        if let Some(guessed) = prepared.guessed.as_deref()
            && !any_run
            && let Some(rows) = complete_in_one_statement(self, batch, guessed).await?
        {
            return Ok((rows, Vec::new()));
        }
        // Every completion may write webhook events with it (docs/webhooks.md, "The
        // outbox"), so the UPDATE runs in a transaction with the terminal-move plan.
        let mut tx = self.begin().await?;
        if any_run {
            sqlx::query(
                "SELECT 1 FROM runs WHERE id IN (SELECT run_id FROM tasks WHERE id = ANY($1)) \
                 ORDER BY id FOR NO KEY UPDATE",
            )
            .bind(&batch.ids)
            .execute(&mut *tx)
            .await?;
        }
        let done: Vec<CompletedRow> = bind_batch(
            batch,
            sqlx::query_as(concat!(completion_ctes!(), " ", completed_rows!())),
            self.fixed_now(),
        )
        .fetch_all(&mut *tx)
        .await?;
        let woken_runs = completion::settle_moved(&mut tx, &done, batch, any_run).await?;
        tx.commit().await?;
        Ok((done, woken_runs))
    }
}

/// `$1` to `$13` of [`completion_ctes!`]: a batch's columns bound as arrays on `q`
/// (`fixed_now`: the test clock).
fn bind_batch<'q, O>(
    batch: &'q Batch,
    q: sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments>,
    fixed_now: Option<i64>,
) -> sqlx::query::QueryAs<'q, sqlx::Postgres, O, sqlx::postgres::PgArguments> {
    q.bind(&batch.ids)
        .bind(&batch.workers)
        .bind(&batch.outputs)
        .bind(&batch.usages)
        .bind(fixed_now)
        .bind(&batch.attempt_usages)
        .bind(&batch.charged_nano)
        .bind(&batch.charged_tokens)
        .bind(AttemptOutcome::Succeeded.as_str())
        .bind(&batch.claims)
        .bind(&batch.guess_nano)
        .bind(&batch.guess_tokens)
        .bind(&batch.guess_reservations)
}

/// How long completions take their transaction after a batch found a listener.
const GUESS_PAUSE: Duration = Duration::from_secs(10);

/// docs/locking.md, "Completions in one statement": a batch's statement when its
/// settlement is planned before it (`$1` to `$13`: [`bind_batch`]; `$14` to `$16`: the
/// checks; `$17` to `$19`: the token refunds; `$20` to `$27` and `$28` to `$35`: the scope
/// and app spend rows, as arrays in key order). One text whatever the batch, so each
/// connection prepares it once.
macro_rules! completion_in_one_statement {
    () => {
        concat!(
            completion_ctes!(),
            ", refunded AS (",
            refund_tokens_sql!("$17", "$18", "$19"),
            " AND (SELECT COUNT(*) FROM done) >= 0 RETURNING 1), \
             scope_spent AS (",
            scope_spend_into!(),
            "SELECT v.app, v.scope, v.bucket, v.reserved_nano, v.settled_nano, \
             v.reserved_tokens, v.settled_tokens, v.overrun_nano \
             FROM unnest($20::TEXT[], $21::TEXT[], $22::BIGINT[], $23::BIGINT[], \
             $24::BIGINT[], $25::BIGINT[], $26::BIGINT[], $27::BIGINT[]) WITH ORDINALITY \
             AS v(app, scope, bucket, reserved_nano, settled_nano, reserved_tokens, \
             settled_tokens, overrun_nano, n) \
             WHERE (SELECT COUNT(*) FROM refunded) >= 0 AND tollgate_guess_holds(NOT ",
            budget_listened!("$15::TEXT[]", "$16"),
            ", 'TGG01') AND tollgate_guess_holds((SELECT COUNT(*) FROM done) = $14, 'TGG02') \
             ORDER BY v.n",
            spend_rows_conflict!("scope_spend", "app, scope, bucket"),
            " RETURNING 1), app_spent AS (",
            app_spend_into!(),
            "SELECT v.app, v.bucket, v.stripe, v.reserved_nano, v.settled_nano, \
             v.reserved_tokens, v.settled_tokens, v.overrun_nano \
             FROM unnest($28::TEXT[], $29::BIGINT[], $30::INT[], $31::BIGINT[], \
             $32::BIGINT[], $33::BIGINT[], $34::BIGINT[], $35::BIGINT[]) WITH ORDINALITY \
             AS v(app, bucket, stripe, reserved_nano, settled_nano, reserved_tokens, \
             settled_tokens, overrun_nano, n) \
             WHERE (SELECT COUNT(*) FROM scope_spent) >= 0 ORDER BY v.n",
            spend_rows_conflict!("app_spend", "app, bucket, stripe"),
            " RETURNING 1), moved AS MATERIALIZED (",
            completed_rows!(),
            "), guessed AS MATERIALIZED (SELECT \
             tollgate_guess_holds(NOT EXISTS (SELECT 1 FROM moved WHERE moved.listened), \
             'TGG01') AND tollgate_guess_holds(NOT EXISTS (SELECT 1 FROM moved \
             JOIN item ON item.id = moved.id WHERE (NOT moved.admitted \
             AND moved.reservation IS NOT DISTINCT FROM item.guess_reservation \
             AND (moved.reservation IS NULL OR (moved.attempts = 1 \
               AND moved.attempts_nano = item.charged_nano \
               AND moved.attempts_tokens = item.charged_tokens))) IS NOT TRUE), 'TGG02') \
             AS held) \
             SELECT moved.* FROM moved, guessed WHERE guessed.held"
        )
    };
}

/// A settlement plan's spend rows as the columns [`completion_in_one_statement!`] binds
/// (`$20` to `$35`), in key order.
#[derive(Default)]
struct SpendColumns {
    scope_apps: Vec<String>,
    scopes: Vec<String>,
    scope_buckets: Vec<i64>,
    scope_amounts: [Vec<i64>; 5],
    apps: Vec<String>,
    app_buckets: Vec<i64>,
    stripes: Vec<i32>,
    app_amounts: [Vec<i64>; 5],
}

impl SpendColumns {
    fn of(plan: &SettlementPlan) -> StoreResult<SpendColumns> {
        fn push(amounts: &mut [Vec<i64>; 5], d: &SpendDelta) {
            let row = [
                d.reserved_nano,
                d.settled_nano,
                d.reserved_tokens,
                d.settled_tokens,
                d.overrun_nano,
            ];
            for (column, value) in amounts.iter_mut().zip(row) {
                column.push(value);
            }
        }
        let mut c = SpendColumns::default();
        for ((app, scope, bucket), d) in &plan.scope {
            c.scope_apps.push(app.clone());
            c.scopes.push(scope.clone());
            c.scope_buckets.push(*bucket);
            push(&mut c.scope_amounts, d);
        }
        for ((app, bucket, stripe), d) in &plan.app {
            c.apps.push(app.clone());
            c.app_buckets.push(*bucket);
            // The stripe column is an `INT`.
            c.stripes.push(
                i32::try_from(*stripe)
                    .map_err(|_| StoreError::Corrupt(format!("spend stripe {stripe}")))?,
            );
            push(&mut c.app_amounts, d);
        }
        Ok(c)
    }
}

/// docs/locking.md, "Completions in one statement": a batch of tasks without an
/// admission and outside runs, moved and settled in ONE statement (no transaction of its
/// own: a round trip for `BEGIN`, one for the spend buckets and one for `COMMIT` fewer),
/// when the settlement `guessed` from the worker's copies (each reserved task's attempt
/// ending now its only one) is what the rows say. The statement checks that it is
/// (`tollgate_guess_holds`, migration 0029): every item moved, none admitted, each
/// reservation and attempt sum as guessed, no endpoint listening for the tasks' events
/// or for a budget threshold the settlement may cross; otherwise it fails whole and
/// writes nothing. `None`: not tried, or the guess did not hold; the caller records the
/// batch in its transaction. Its caller asks for lone completions only (docs/locking.md
/// says why).
async fn complete_in_one_statement(
    store: &PostgresStore,
    batch: &Batch,
    guessed: &[SettleRow],
) -> StoreResult<Option<Vec<CompletedRow>>> {
    if store.guesses.missed_lately() {
        return Ok(None);
    }
    let plan = plan_settlement(guessed)?;
    // Charges the move does not write take a statement of their own.
    let written = batch.written();
    if plan.charged.iter().any(|c| !written.contains(c)) {
        return Ok(None);
    }
    let announcing = apps_announcing(guessed, &plan.charged)?;
    let (refund_apps, refund_scopes): (Vec<&str>, Vec<&str>) = plan
        .refunds
        .keys()
        .map(|(a, s)| (a.as_str(), s.as_str()))
        .unzip();
    let refund_tokens: Vec<i64> = plan
        .refunds
        .values()
        .map(|t| i64::try_from(*t).unwrap_or(i64::MAX))
        .collect();
    let spend = SpendColumns::of(&plan)?;
    let [s1, s2, s3, s4, s5] = &spend.scope_amounts;
    let [a1, a2, a3, a4, a5] = &spend.app_amounts;
    let mut lone = store.hot.lone().await?;
    let moved = bind_batch(
        batch,
        sqlx::query_as::<_, CompletedRow>(completion_in_one_statement!()),
        store.fixed_now(),
    )
    .bind(batch.ids.len() as i64)
    .bind(&announcing)
    .bind(budget_listener_pattern())
    .bind(&refund_apps)
    .bind(&refund_scopes)
    .bind(&refund_tokens)
    .bind(&spend.scope_apps)
    .bind(&spend.scopes)
    .bind(&spend.scope_buckets)
    .bind(s1)
    .bind(s2)
    .bind(s3)
    .bind(s4)
    .bind(s5)
    .bind(&spend.apps)
    .bind(&spend.app_buckets)
    .bind(&spend.stripes)
    .bind(a1)
    .bind(a2)
    .bind(a3)
    .bind(a4)
    .bind(a5)
    .fetch_all(lone.conn())
    .await;
    lone.done_sqlx(&moved);
    match moved {
        Ok(rows) => {
            store
                .guesses
                .held
                .fetch_add(rows.len() as u64, Ordering::Relaxed);
            Ok(Some(rows))
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(LISTENED) => {
            store.guesses.missed_now();
            Ok(None)
        }
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(NOT_AS_GUESSED) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `tollgate_guess_holds`'s SQLSTATE (migration 0029) when someone listens for the
/// batch's events: completions take their transaction for [`GUESS_PAUSE`].
const LISTENED: &str = "TGG01";
/// Its SQLSTATE when the rows are not as guessed.
const NOT_AS_GUESSED: &str = "TGG02";

/// What [`complete_in_one_statement`] keeps between batches.
#[derive(Debug, Default)]
pub(super) struct Guesses {
    /// Tasks completed in one statement.
    pub(super) held: AtomicU64,
    /// When a batch last found a listener.
    missed: Mutex<Option<Instant>>,
}

impl Guesses {
    /// Whether a batch found a listener within [`GUESS_PAUSE`].
    fn missed_lately(&self) -> bool {
        let missed = self.missed.lock().unwrap_or_else(PoisonError::into_inner);
        missed.is_some_and(|at| at.elapsed() < GUESS_PAUSE)
    }

    fn missed_now(&self) {
        *self.missed.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }
}

/// The tasks of these ids that exist, by id (no statement for none).
async fn tasks_by_id(pool: &sqlx::PgPool, ids: &[String]) -> StoreResult<HashMap<TaskId, Task>> {
    if ids.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(pool)
    .await?;
    Ok(tasks(rows)?.into_iter().map(|t| (t.id, t)).collect())
}
