//! Step 6: the task insert and, for an admitted task, the admission's writes and the
//! global slot in the same final statement.

use super::super::{PostgresStore, Tx, now_sql};
use super::SlotPath;
use super::slots::{slot_stripe, take_share_rebalancing, take_slot_rebalancing};
use crate::shared::admission::{ScopeUpdate, cached_usage};
use crate::shared::cost::SpendDelta;
use crate::shared::dispatch::{queue_join_conflict, queue_join_insert, queue_join_select};
use crate::shared::rows::{TaskRow, task_columns};
use crate::{Created, StoreError, StoreResult};
use sqlx::{FromRow, Row};
use tollgate_core::cost::{app_spend_stripe, spend_bucket};
use tollgate_core::{
    AdmissionRejection, AppId, BucketState, Budget, NewTask, ScopeId, SourceId, Subject, Task,
    TaskId, Timestamp, Weight, join_credit, stride,
};

/// The columns of a task insert, in the order of [`bind_insert`]'s `$1`–`$28`.
macro_rules! task_insert_into {
    () => {
        "INSERT INTO tasks (id, app, effect_key, kind, step, run_id, scope, subject_type, \
         subject_id, source_id, source_revision, recompute, admitted, model_id, model_ref, \
         model_config_hash, request, input_hash, cache_key, status, cached_from, output, \
         usage, created_at, completed_at, reservation, priority, dispatch_key) "
    };
}

/// The task insert (`$1`–`$28`, bound by [`bind_insert`]); a taken effect key inserts
/// nothing (`ON CONFLICT DO NOTHING`) and returns no row.
macro_rules! task_insert {
    () => {
        concat!(
            task_insert_into!(),
            "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17, $18, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28) \
             ON CONFLICT (app, effect_key) DO NOTHING RETURNING ",
            task_columns!()
        )
    };
}

/// SPEC §14, after the task insert `t` in the same statement (`$29` the policy's weight,
/// `$credit` its joining credit, `$stride` its stride): a queued task makes its (app,
/// scope) queue active, joining by the shared rule ([`queue_join_select`],
/// [`queue_join_conflict`]). The row stays locked to the commit (ON CONFLICT locks it
/// even when nothing changes), so a claim that finds the queue empty cannot deactivate
/// it before this task is visible.
macro_rules! queue_activation {
    ($credit:literal, $stride:literal) => {
        concat!(
            ", dq AS (",
            queue_join_insert!(),
            queue_join_select!(concat!(
                "SELECT t.app, t.scope, $29::BIGINT AS weight, ",
                $credit,
                "::BIGINT AS credit, ",
                $stride,
                "::BIGINT AS stride FROM t WHERE t.status = 'queued'"
            )),
            queue_join_conflict!(),
            ") "
        )
    };
}

pub(super) type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds [`task_insert`]'s `$1`–`$28` (a statement with [`queue_activation`] binds the
/// weight as `$29` next, and its joining credit after its own parameters).
pub(super) fn bind_insert<'q>(q: PgQuery<'q>, i: &'q InsertRow<'_>) -> PgQuery<'q> {
    let new = i.new;
    let cached = i.cached_from.is_some();
    let scoped = new.scope.as_ref();
    let usage = cached.then(cached_usage);
    q.bind(i.id.to_string())
        .bind(new.owner.app().as_str())
        .bind(new.effect_key.as_str())
        .bind(new.request.kind().as_str())
        .bind(new.step.as_str())
        .bind(i.run_id.as_deref())
        .bind(i.scope.as_str())
        .bind(i.subject.as_ref().map(|s| s.kind.as_str()))
        .bind(i.subject.as_ref().map(|s| s.id.as_str()))
        .bind(scoped.map(|s| s.source_id.as_str()))
        .bind(scoped.map(|s| s.source_revision.as_str()))
        .bind(scoped.is_some_and(|s| s.recompute))
        .bind(i.admitted)
        .bind(new.model.as_str())
        .bind(&i.model_ref)
        .bind(&i.config_hash)
        .bind(new.request.canonical())
        .bind(new.request.input_hash())
        .bind(i.cache_key.as_deref())
        .bind(if cached { "succeeded" } else { "queued" })
        .bind(i.cached_from.as_deref())
        .bind(i.cached_output.as_deref())
        .bind(usage)
        .bind(i.now.0)
        .bind(cached.then_some(i.now.0))
        .bind(i.reservation.as_deref())
        .bind(i64::from(new.dispatch.priority))
        .bind(new.dispatch.key(i.now))
}

pub(super) struct InsertRow<'a> {
    pub(super) id: TaskId,
    pub(super) new: &'a NewTask,
    pub(super) run_id: Option<String>,
    pub(super) scope: ScopeId,
    pub(super) subject: Option<Subject>,
    pub(super) config_hash: String,
    pub(super) model_ref: String,
    pub(super) cache_key: Option<String>,
    pub(super) admitted: bool,
    pub(super) cached_from: Option<String>,
    pub(super) cached_output: Option<String>,
    pub(super) now: Timestamp,
    /// SPEC §13: the reservation as stored (admitted tasks only).
    pub(super) reservation: Option<String>,
    /// SPEC §13: what a cache hit saved (the copied task's charge), nano-dollars.
    pub(super) saved_nano: i64,
}

pub(super) struct AdmissionRecord<'a> {
    pub(super) source: &'a SourceId,
    pub(super) logical_key: &'a str,
    pub(super) budget: &'a Budget,
    pub(super) update: ScopeUpdate,
    pub(super) reserve: SpendDelta,
}

/// The writes of an admission after its task insert, as CTEs of its final statement:
/// the scope's row (bucket, sources, active, SPEC §13 token bucket), the source's
/// sighting, the admission record, and the reservation added to the scope's and the
/// app's spend bucket — only when the task row was inserted (`t`). The spend upserts
/// read from the scope row's CTE (and the app's from the scope's, and the fast path's
/// global slot from the app's), so the rows are locked in the lock order: scope row,
/// scope bucket, app bucket, global slot stripe. (Without that chain a statement could
/// take its slot stripe before its app bucket while another held the app bucket and
/// waited for the stripe: a deadlock under load.) Parameters follow the
/// task insert's and the queue activation's (`$29`): `$30` source, `$31` logical key, `$32` bucket units, `$33` bucket
/// time, `$34` sources delta, (`$35` stripe, `$36` cap: the slot's), `$37`–`$39` token
/// bucket units, time and capacity (NULL: keep), `$40` spend bucket, `$41` reserved
/// nano-dollars, `$42` reserved tokens, `$43` app stripe, `$44` the queue's joining
/// credit, `$45` its stride, `$46` the app's share of the global capacity (0: none),
/// `$47` whether the app has no share (app, scope, task id and now are the insert's `$2`, `$7`, `$1`, `$24`).
macro_rules! admission_writes {
    () => {
        ", st AS (INSERT INTO scope_state \
           (app, scope, bucket_units, bucket_at, sources_in_window, active, \
            token_units, token_at, token_capacity) \
           SELECT $2, $7, $32, $33, GREATEST($34, 0), 1, $37, $38, $39 FROM t \
           ON CONFLICT (app, scope) DO UPDATE SET bucket_units = EXCLUDED.bucket_units, \
           bucket_at = EXCLUDED.bucket_at, \
           sources_in_window = scope_state.sources_in_window + $34, \
           active = scope_state.active + 1, \
           token_units = COALESCE(EXCLUDED.token_units, scope_state.token_units), \
           token_at = COALESCE(EXCLUDED.token_at, scope_state.token_at), \
           token_capacity = COALESCE(EXCLUDED.token_capacity, scope_state.token_capacity) \
           RETURNING 1), \
         ss AS (INSERT INTO scope_sources (app, scope, source_id, last_admitted_at) \
           SELECT $2, $7, $30, $24 FROM t \
           ON CONFLICT (app, scope, source_id) DO UPDATE SET \
           last_admitted_at = GREATEST(scope_sources.last_admitted_at, \
                                       EXCLUDED.last_admitted_at)), \
         rec AS (INSERT INTO admissions \
           (app, scope, source_id, task_id, logical_key, admitted_at) \
           SELECT $2, $7, $30, $1, $31, $24 FROM t), \
         sp AS (INSERT INTO scope_spend (app, scope, bucket, reserved_nano, reserved_tokens) \
           SELECT $2, $7, $40, $41, $42 FROM st \
           ON CONFLICT (app, scope, bucket) DO UPDATE SET \
           reserved_nano = scope_spend.reserved_nano + EXCLUDED.reserved_nano, \
           reserved_tokens = scope_spend.reserved_tokens + EXCLUDED.reserved_tokens \
           RETURNING 1), \
         ap AS (INSERT INTO app_spend (app, bucket, stripe, reserved_nano, reserved_tokens) \
           SELECT $2, $40, $43, $41, $42 FROM sp \
           ON CONFLICT (app, bucket, stripe) DO UPDATE SET \
           reserved_nano = app_spend.reserved_nano + EXCLUDED.reserved_nano, \
           reserved_tokens = app_spend.reserved_tokens + EXCLUDED.reserved_tokens \
           RETURNING 1) "
    };
}

/// Step 6: insert the task; for an admitted task, then record the admission and take the
/// global slot in one final statement; commit.
pub(super) async fn insert_and_commit(
    store: &PostgresStore,
    mut tx: Tx,
    row: &InsertRow<'_>,
    app: &AppId,
    admission: Option<AdmissionRecord<'_>>,
    path: SlotPath,
) -> StoreResult<Option<Created>> {
    let Some(record) = admission else {
        let Some(task) = insert_task(&mut tx, row, true).await? else {
            // Another replica inserted the same effect key first: keep nothing of ours.
            tx.rollback().await?;
            return lost_race(store, app, row.new).await.map(Some);
        };
        if row.saved_nano > 0 {
            record_saved(&mut tx, app, &row.scope, row.now, row.saved_nano).await?;
        }
        tx.commit().await?;
        return Ok(Some(Created::inserted(task).saving(row.saved_nano)));
    };
    let cap = i64::from(record.budget.global_concurrent.get());
    let stripe = slot_stripe(row.id);
    // The task, the admission's writes and (fast path) a slot of this stripe's
    // allowance, in one statement that locks one stripe row only.
    let sql = match path {
        SlotPath::Fast => concat!(
            "WITH t AS (",
            task_insert!(),
            ")",
            queue_activation!("$44", "$45"),
            admission_writes!(),
            ", own AS (INSERT INTO app_slots (app, active, share) \
               SELECT $2, 1, $46 FROM ap WHERE $47 OR $46 > 0 \
               ON CONFLICT (app) DO UPDATE SET active = app_slots.active + 1, \
               share = EXCLUDED.share WHERE $47 OR app_slots.active < EXCLUDED.share \
               RETURNING 1), \
             slot AS (UPDATE global_slots SET admitted = admitted + 1 \
               WHERE stripe = $35 AND admitted < capacity AND cap_for = $36 \
               AND EXISTS (SELECT 1 FROM own) RETURNING admitted) \
             SELECT t.*, (SELECT admitted FROM slot) AS took FROM t"
        ),
        SlotPath::Rebalance => concat!(
            "WITH t AS (",
            task_insert!(),
            ")",
            queue_activation!("$44", "$45"),
            admission_writes!(),
            "SELECT t.*, 0::BIGINT AS took FROM t"
        ),
    };
    let token = record.update.token_bucket;
    let inserted = bind_insert(sqlx::query(sql), row)
        .bind(i64::from(row.new.dispatch.weight))
        .bind(record.source.as_str())
        .bind(record.logical_key)
        .bind(record.update.bucket.units)
        .bind(record.update.bucket.at.0)
        .bind(record.update.sources_delta)
        .bind(stripe)
        .bind(cap)
        .bind(token.map(|(b, _)| b.units))
        .bind(token.map(|(b, _)| b.at.0))
        .bind(token.map(|(_, capacity)| capacity))
        .bind(spend_bucket(row.now))
        .bind(record.reserve.reserved_nano)
        .bind(record.reserve.reserved_tokens)
        .bind(app_spend_stripe(row.scope.as_str()) as i32)
        .bind(join_credit(row.new.dispatch.weight))
        .bind(stride(row.new.dispatch.weight))
        .bind(record.budget.global_share.map_or(0, |s| i64::from(s.share)))
        .bind(record.budget.global_share.is_none())
        .fetch_optional(&mut *tx)
        .await?;
    let Some(inserted) = inserted else {
        // Another replica inserted the same effect key first: keep nothing of ours.
        tx.rollback().await?;
        return lost_race(store, app, row.new).await.map(Some);
    };
    let task = TaskRow::from_row(&inserted)?.into_task()?;
    let took = match path {
        SlotPath::Fast => inserted.try_get::<Option<i64>, _>("took")?.is_some(),
        SlotPath::Rebalance => {
            if let Err(refusal) = take_share_rebalancing(&mut tx, app, record.budget).await? {
                tx.rollback().await?;
                return Err(StoreError::Admission(refusal));
            }
            take_slot_rebalancing(&mut tx, stripe, cap).await?
        }
    };
    if !took {
        // Roll back before anything else: a failed fast path may still hold its
        // stripe's row lock (READ COMMITTED locks a concurrently updated row before
        // re-checking it), and the rebalancing retry locks every stripe in order.
        tx.rollback().await?;
        return match path {
            SlotPath::Fast => Ok(None),
            SlotPath::Rebalance => Err(StoreError::Admission(AdmissionRejection::GlobalCapacity {
                limit: record.budget.global_concurrent.get(),
            })),
        };
    }
    tx.commit().await?;
    Ok(Some(Created::inserted(task)))
}

/// docs/budgets.md, "Tasks without a source": inserts a task without a source that can
/// cost money and records its reservation — the scope's token bucket taken (`token`:
/// the bucket and its capacity in units; a new scope row starts with a full task bucket,
/// as one never admitted into), the reservation added to the scope's and the app's spend
/// bucket, in the lock order (scope row, scope bucket, app bucket) — and commits.
pub(super) async fn insert_reserved_and_commit(
    store: &PostgresStore,
    mut tx: Tx,
    row: &InsertRow<'_>,
    app: &AppId,
    budget: &Budget,
    token: Option<(BucketState, i64)>,
    reserve: SpendDelta,
) -> StoreResult<Option<Created>> {
    let Some(task) = insert_task(&mut tx, row, true).await? else {
        // Another replica inserted the same effect key first: keep nothing of ours.
        tx.rollback().await?;
        return lost_race(store, app, row.new).await.map(Some);
    };
    let tasks = BucketState::full(budget.burst.get(), row.now);
    sqlx::query(
        "WITH st AS (INSERT INTO scope_state \
           (app, scope, bucket_units, bucket_at, token_units, token_at, token_capacity) \
           SELECT $1, $2, $3, $4, $5, $6, $7 WHERE $5::BIGINT IS NOT NULL \
           ON CONFLICT (app, scope) DO UPDATE SET token_units = EXCLUDED.token_units, \
           token_at = EXCLUDED.token_at, token_capacity = EXCLUDED.token_capacity \
           RETURNING 1), \
         sp AS (INSERT INTO scope_spend (app, scope, bucket, reserved_nano, reserved_tokens) \
           SELECT $1, $2, $8, $9, $10 FROM (SELECT COUNT(*) FROM st) AS after_st \
           ON CONFLICT (app, scope, bucket) DO UPDATE SET \
           reserved_nano = scope_spend.reserved_nano + EXCLUDED.reserved_nano, \
           reserved_tokens = scope_spend.reserved_tokens + EXCLUDED.reserved_tokens \
           RETURNING 1) \
         INSERT INTO app_spend (app, bucket, stripe, reserved_nano, reserved_tokens) \
           SELECT $1, $8, $11, $9, $10 FROM sp \
           ON CONFLICT (app, bucket, stripe) DO UPDATE SET \
           reserved_nano = app_spend.reserved_nano + EXCLUDED.reserved_nano, \
           reserved_tokens = app_spend.reserved_tokens + EXCLUDED.reserved_tokens",
    )
    .bind(app.as_str())
    .bind(row.scope.as_str())
    .bind(tasks.units)
    .bind(tasks.at.0)
    .bind(token.map(|(b, _)| b.units))
    .bind(token.map(|(b, _)| b.at.0))
    .bind(token.map(|(_, capacity)| capacity))
    .bind(spend_bucket(row.now))
    .bind(reserve.reserved_nano)
    .bind(reserve.reserved_tokens)
    .bind(app_spend_stripe(row.scope.as_str()) as i32)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Some(Created::inserted(task)))
}

pub(super) async fn lost_race(
    store: &PostgresStore,
    app: &AppId,
    new: &NewTask,
) -> StoreResult<Created> {
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE app = $1 AND effect_key = $2"
    ))
    .bind(app.as_str())
    .bind(new.effect_key.as_str())
    .fetch_optional(&store.pool)
    .await?;
    let task = row.map(TaskRow::into_task).transpose()?.ok_or_else(|| {
        StoreError::Unavailable("effect key taken by a transaction that rolled back; retry".into())
    })?;
    Ok(Created::existing(task))
}

/// SPEC §13: a cache hit's saving, added to the scope's and the app's bucket of `now`
/// (scope bucket first: the lock order).
async fn record_saved(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    now: Timestamp,
    saved: i64,
) -> StoreResult<()> {
    sqlx::query(
        "WITH sp AS (INSERT INTO scope_spend (app, scope, bucket, saved_nano) \
           VALUES ($1, $2, $3, $4) ON CONFLICT (app, scope, bucket) DO UPDATE SET \
           saved_nano = scope_spend.saved_nano + EXCLUDED.saved_nano RETURNING 1) \
         INSERT INTO app_spend (app, bucket, stripe, saved_nano) \
           SELECT $1, $3, $5, $4 FROM sp ON CONFLICT (app, bucket, stripe) DO UPDATE SET \
           saved_nano = app_spend.saved_nano + EXCLUDED.saved_nano",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(spend_bucket(now))
    .bind(saved)
    .bind(app_spend_stripe(scope.as_str()) as i32)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Inserts the task and returns it; `None` when the effect key was taken meanwhile.
/// With `activate`, a queued task's dispatch queue is activated in the same statement
/// (SPEC §14); batches activate theirs at the end instead, in lock order
/// ([`activate_queues`]).
pub(super) async fn insert_task(
    tx: &mut Tx,
    i: &InsertRow<'_>,
    activate: bool,
) -> StoreResult<Option<Task>> {
    let query = if activate {
        bind_insert(
            sqlx::query(concat!(
                "WITH t AS (",
                task_insert!(),
                ")",
                queue_activation!("$30", "$31"),
                "SELECT * FROM t"
            )),
            i,
        )
        .bind(i64::from(i.new.dispatch.weight))
        .bind(join_credit(i.new.dispatch.weight))
        .bind(stride(i.new.dispatch.weight))
    } else {
        bind_insert(sqlx::query(task_insert!()), i)
    };
    let row = query.fetch_optional(&mut **tx).await?;
    row.map(|r| TaskRow::from_row(&r).map_err(StoreError::from))
        .transpose()?
        .map(TaskRow::into_task)
        .transpose()
}

/// An unscoped application task (no cache, no admission: SPEC §3 steps 2 and 6) in ONE
/// statement, its own transaction: the shared lock of its (app, scope) (`$31`; owner
/// deletion, which takes it exclusive, cannot interleave), the database's "now"
/// (`$32`, the fixed clock when set), the insert (a taken effect key inserts nothing) and
/// the queue's activation (weight `$29`, joining credit `$30`, stride `$33`). The row's `now` is
/// [`Timestamp`]`(0)`, so [`bind_insert`]'s `$24` is unused and `$28` is the dispatch
/// key's offset from the creation time (`dispatch_key(t) = t + dispatch_key(0)`), added
/// to the statement's "now". `None`: the key was taken.
pub(super) async fn insert_app_task(
    store: &PostgresStore,
    i: &InsertRow<'_>,
    lock: i64,
) -> StoreResult<Option<Task>> {
    debug_assert_eq!(i.now, Timestamp(0), "the statement reads now itself");
    let row = bind_insert(
        sqlx::query(concat!(
            "WITH lock AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared($31) AS locked), \
             clock AS MATERIALIZED (SELECT ",
            now_sql!(32),
            " AS now FROM lock), t AS (",
            task_insert_into!(),
            "SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17, $18, $19, $20, $21, $22, $23, clock.now, $25, $26, $27, clock.now + $28 \
             FROM clock ON CONFLICT (app, effect_key) DO NOTHING RETURNING ",
            task_columns!(),
            ")",
            queue_activation!("$30", "$33"),
            "SELECT * FROM t"
        )),
        i,
    )
    .bind(i64::from(i.new.dispatch.weight))
    .bind(join_credit(i.new.dispatch.weight))
    .bind(lock)
    .bind(store.fixed_now())
    .bind(stride(i.new.dispatch.weight))
    .fetch_optional(&store.pool)
    .await?;
    row.map(|r| TaskRow::from_row(&r).map_err(StoreError::from))
        .transpose()?
        .map(TaskRow::into_task)
        .transpose()
}

/// SPEC §14 for a batch of creations: activates the dispatch queues of its queued tasks
/// as one creation after another would, in the order the batch names them (each queue
/// joins at the passes as the ones before it left them, as on SQLite), with the rows
/// held to the commit as [`queue_activation`] holds one task's.
///
/// One queue (the usual batch) is one statement. With several, the existing rows are
/// locked first in (app, scope) order (the lock order among queue rows), then each queue
/// is activated by the same statement in the batch's order; only queues that did not
/// exist yet are written in that order, so two batches creating the same new queues in
/// opposite orders can deadlock, which PostgreSQL ends by failing one of them
/// (`StoreError::Unavailable`: retryable, nothing written).
pub(super) async fn activate_queues(
    tx: &mut Tx,
    queues: &[(String, String, i64)],
) -> StoreResult<()> {
    // Each queue once, where the batch first names it.
    let mut seen = std::collections::HashSet::new();
    let ordered: Vec<&(String, String, i64)> = queues
        .iter()
        .filter(|q| seen.insert((q.0.as_str(), q.1.as_str())))
        .collect();
    if ordered.len() > 1 {
        let mut sorted = ordered.clone();
        sorted.sort();
        let apps: Vec<&str> = sorted.iter().map(|q| q.0.as_str()).collect();
        let scopes: Vec<&str> = sorted.iter().map(|q| q.1.as_str()).collect();
        sqlx::query(
            "SELECT 1 FROM dispatch_queues d \
             JOIN UNNEST($1::TEXT[], $2::TEXT[]) AS q(app, scope) \
             ON d.app = q.app AND d.scope = q.scope \
             ORDER BY d.app, d.scope FOR NO KEY UPDATE OF d",
        )
        .bind(&apps)
        .bind(&scopes)
        .execute(&mut **tx)
        .await?;
    }
    for (app, scope, weight) in ordered {
        let w = Weight::new(*weight).unwrap_or_default();
        sqlx::query(concat!(
            queue_join_insert!(),
            queue_join_select!(
                "SELECT $1::TEXT AS app, $2::TEXT AS scope, $3::BIGINT AS weight, \
                 $4::BIGINT AS credit, $5::BIGINT AS stride"
            ),
            queue_join_conflict!()
        ))
        .bind(app)
        .bind(scope)
        .bind(weight)
        .bind(join_credit(w))
        .bind(stride(w))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// An application's queued task of a batch, ready for [`insert_app_tasks`].
pub(super) struct AppInsert<'a> {
    pub(super) id: TaskId,
    pub(super) new: &'a NewTask,
    pub(super) scope: &'a ScopeId,
    pub(super) subject: Option<&'a Subject>,
    pub(super) config_hash: String,
    pub(super) model_ref: String,
}

/// Inserts a batch's unscoped application tasks (queued, no run, no cache, no
/// admission) in ONE statement, `$16` the creation time; returns the rows inserted. A
/// taken effect key (before the batch, or earlier in it) inserts nothing for that item
/// (`ON CONFLICT DO NOTHING`): the caller looks the taken ones up.
pub(super) async fn insert_app_tasks(
    tx: &mut Tx,
    items: &[AppInsert<'_>],
    now: Timestamp,
) -> StoreResult<Vec<Task>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let col = |f: &dyn Fn(&AppInsert<'_>) -> String| items.iter().map(f).collect::<Vec<_>>();
    let ids = col(&|i| i.id.to_string());
    let apps = col(&|i| i.new.owner.app().to_string());
    let keys = col(&|i| i.new.effect_key.to_string());
    let kinds = col(&|i| i.new.request.kind().as_str().to_owned());
    let steps = col(&|i| i.new.step.to_string());
    let scopes = col(&|i| i.scope.to_string());
    let subject_types: Vec<Option<&str>> = items
        .iter()
        .map(|i| i.subject.map(|s| s.kind.as_str()))
        .collect();
    let subject_ids: Vec<Option<&str>> = items
        .iter()
        .map(|i| i.subject.map(|s| s.id.as_str()))
        .collect();
    let models = col(&|i| i.new.model.to_string());
    let model_refs = col(&|i| i.model_ref.clone());
    let hashes = col(&|i| i.config_hash.clone());
    let requests: Vec<&str> = items.iter().map(|i| i.new.request.canonical()).collect();
    let inputs: Vec<&str> = items.iter().map(|i| i.new.request.input_hash()).collect();
    let priorities: Vec<i64> = items
        .iter()
        .map(|i| i64::from(i.new.dispatch.priority))
        .collect();
    let dispatch_keys: Vec<i64> = items.iter().map(|i| i.new.dispatch.key(now)).collect();
    let rows: Vec<TaskRow> = sqlx::query_as(concat!(
        "INSERT INTO tasks (id, app, effect_key, kind, step, run_id, scope, subject_type, \
         subject_id, source_id, source_revision, recompute, admitted, model_id, model_ref, \
         model_config_hash, request, input_hash, cache_key, status, cached_from, output, \
         usage, created_at, completed_at, reservation, priority, dispatch_key) \
         SELECT u.id, u.app, u.effect_key, u.kind, u.step, NULL, u.scope, u.subject_type, \
         u.subject_id, NULL, NULL, FALSE, FALSE, u.model_id, u.model_ref, u.config_hash, \
         u.request, u.input_hash, NULL, 'queued', NULL, NULL, NULL, $16, NULL, NULL, \
         u.priority, u.dispatch_key \
         FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], \
           $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[], $10::TEXT[], $11::TEXT[], \
           $12::TEXT[], $13::TEXT[], $14::BIGINT[], $15::BIGINT[]) WITH ORDINALITY \
           AS u(id, app, effect_key, kind, step, scope, subject_type, subject_id, model_id, \
                model_ref, config_hash, request, input_hash, priority, dispatch_key, ord) \
         ORDER BY u.ord \
         ON CONFLICT (app, effect_key) DO NOTHING RETURNING ",
        task_columns!()
    ))
    .bind(&ids)
    .bind(&apps)
    .bind(&keys)
    .bind(&kinds)
    .bind(&steps)
    .bind(&scopes)
    .bind(&subject_types)
    .bind(&subject_ids)
    .bind(&models)
    .bind(&model_refs)
    .bind(&hashes)
    .bind(&requests)
    .bind(&inputs)
    .bind(&priorities)
    .bind(&dispatch_keys)
    .bind(now.0)
    .fetch_all(&mut **tx)
    .await?;
    rows.into_iter().map(TaskRow::into_task).collect()
}
