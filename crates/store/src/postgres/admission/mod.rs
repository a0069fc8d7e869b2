//! docs/conformance.md#creating-a-task, docs/conformance.md#admission on PostgreSQL: task creation with idempotency, owner check, cache and
//! admission in one short transaction, correct with any number of replicas.
//!
//! A scoped creation holds the exclusive advisory lock of its (app, scope): admissions of
//! one scope are serialized, different scopes run in parallel. The admission snapshot is
//! one statement reading only bounded things (the scope's counters row, one sighting
//! probe, this source's records, the global counters); the writes are one statement
//! ending with the conditional global increment, so the global row is locked only from
//! that statement to the commit.
//!
//! Split along the steps: this module runs the creation (docs/conformance.md#create-transaction, batches);
//! [`probe`] reads what a creation decides on (owner, scope lock, idempotency, cache);
//! [`snapshot`] reads the admission facts and asks core; [`insert`] writes the task and
//! the admission in one statement; [`slots`] holds the striped global cap; [`group`]
//! creates one scope's concurrent tasks without a source in one transaction;
//! [`optimistic`] creates a lone one in one statement of its own when its decision holds.

mod group;
mod insert;
mod optimistic;
mod probe;
mod slots;
mod snapshot;

pub(super) use optimistic::OneStatement;
pub(super) use probe::{lock_scope, scope_lock_key};

use super::{PostgresStore, Tx};
use crate::shared::admission::{Refusal, model_columns, reserved};
use crate::shared::cost::SettlementPlan;
use crate::shared::rows::{TaskRow, task_columns};
use crate::shared::terminal::TerminalStatements;
use crate::{Created, StoreError, StoreResult};
use insert::{
    AdmissionRecord, InsertRow, activate_queues, insert_and_commit, insert_reserved_and_commit,
    insert_task,
};
use probe::{Asked, Facts, ReadsLock, reads, run_owner};
use snapshot::{admit, check_unsourced};
use tollgate_core::cost::spend_bucket;
use tollgate_core::{AppId, NewTask, Owner, Subject, Task, TaskCost, TaskId, Timestamp, cache_key};

pub(super) async fn create_task(store: &PostgresStore, new: NewTask) -> StoreResult<Created> {
    match group::group_of(&new) {
        Some(key) => crate::shared::group::create(store, key, new).await,
        None => create_alone(store, new).await,
    }
}

/// One creation in transactions of its own (a group's creations run here when they
/// cannot be made together: [`group`]).
async fn create_alone(store: &PostgresStore, new: NewTask) -> StoreResult<Created> {
    // docs/budgets.md, "Tasks without a source": a cost under no limit is only recorded.
    if new.scope.is_none()
        && !new.cost.as_ref().is_some_and(TaskCost::limited)
        && let Owner::Application {
            app,
            scope,
            subject,
        } = &new.owner
    {
        return create_app_task(store, &new, app, scope, subject.as_ref()).await;
    }
    // docs/locking.md, "A creation in one statement": a lone creation of a task without
    // a source under a USD or token limit, when its decision holds; otherwise the
    // transaction below.
    if let Some(created) = optimistic::create(store, &new).await? {
        return Ok(created);
    }
    match attempt_create(store, &new, SlotPath::Fast).await? {
        Some(created) => Ok(created),
        // The fast path found its stripe without allowance and rolled back: again, with
        // the exact recount (which always decides).
        None => attempt_create(store, &new, SlotPath::Rebalance)
            .await?
            .ok_or_else(|| StoreError::Database("the rebalancing admission did not decide".into())),
    }
}

/// An unscoped application task: no cache, no admission, no run to check, no limit to
/// check its cost against (a cost is only recorded), so one statement
/// ([`insert::insert_app_task`]); a taken effect key is then read as the idempotent
/// answer (a replay costs that read too).
async fn create_app_task(
    store: &PostgresStore,
    new: &NewTask,
    app: &AppId,
    scope: &tollgate_core::ScopeId,
    subject: Option<&Subject>,
) -> StoreResult<Created> {
    let item = app_insert(new, scope, subject)?;
    let owner = (None, scope.clone(), subject.cloned());
    let model = (item.config_hash, item.model_ref);
    let mut row = InsertRow::new(item.id, new, owner, model, Timestamp(0));
    let reserve = item.reservation.map(|(stored, delta)| {
        row.reservation = Some(stored);
        delta
    });
    match insert::insert_app_task(store, &row, scope_lock_key(app, scope), reserve).await? {
        Some(task) => {
            // Created claimed (docs/engine.md, "Tasks claimed at creation"): its claim's
            // move is owed, as a fair claim's.
            store.queue_view.owe_creation_claim(new, &task);
            Ok(Created::inserted(task))
        }
        None => insert::lost_race(store, app, new).await,
    }
}

/// How an admission takes its global slot (see [`take_slot_rebalancing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SlotPath {
    /// One stripe's allowance; `None` from [`attempt_create`] when it has none left.
    Fast,
    /// Every stripe locked in order, the global count recounted exactly.
    Rebalance,
}

/// One transaction of docs/conformance.md#create-transaction. `Ok(None)`: the fast slot path found no
/// allowance; nothing was written.
async fn attempt_create(
    store: &PostgresStore,
    new: &NewTask,
    path: SlotPath,
) -> StoreResult<Option<Created>> {
    let (config_hash, model_ref) = model_columns(new)?;
    let app = new.owner.app().clone();
    let mut tx = store.begin().await?;
    // Admission, and the cost checks of a task without a source under a USD or token
    // limit, hold the scope's lock exclusively.
    let checked = new.scope.is_some() || new.cost.as_ref().is_some_and(TaskCost::limited);

    // Step 2: idempotency, before any lock that can wait: a replay costs one indexed
    // read, and never waits for the scope's admissions. A run's task replays before its
    // run is checked. An application's task under admission or a cost check has its key
    // looked up first by its reads below, in their round trip; one that takes only the
    // scope's shared lock (nothing to admit or check) has it looked up after the lock,
    // in the same round trip.
    if matches!(new.owner, Owner::Run { .. })
        && let Some(task) = by_effect_key(&mut tx, &app, new.effect_key.as_str()).await?
    {
        tx.rollback().await?;
        return Ok(Some(Created::existing(task)));
    }

    // Step 3: owner check; a run's scope and subject apply to its tasks. Then step 2 again
    // under the lock (a racing creation of the same key that held the lock first has
    // committed by now, and its replay must not be judged by admission), step 4 (the
    // cache: newest success first, same app and scope) and step 5's facts, read in one
    // round trip.
    let id = TaskId::generate();
    let (run_id, scope, subject, mut lock) = match &new.owner {
        Owner::Run { run_id, .. } => {
            let (scope, subject) = run_owner(&mut tx, &app, *run_id, checked).await?;
            // The run's scope lock is held already (before its run row: the lock order).
            let lock = ReadsLock {
                lock: None,
                replay_first: false,
            };
            (Some(run_id.to_string()), scope, subject, lock)
        }
        // Exclusive for admission; shared otherwise, which only keeps owner deletion
        // (exclusive) from interleaving with this creation.
        Owner::Application { scope, subject, .. } => {
            let lock = ReadsLock {
                lock: Some((scope_lock_key(&app, scope), checked)),
                replay_first: checked,
            };
            (None, scope.clone(), subject.clone(), lock)
        }
    };
    let key = new.scope.as_ref().map(|scoped| {
        cache_key(
            &scoped.source_id,
            &scoped.source_revision,
            &new.request,
            &config_hash,
            subject.as_ref(),
        )
    });
    // Step 5's logical key: the cache key, or for a recomputation the task's own id.
    let logical_key = match &new.scope {
        Some(scoped) if scoped.recompute => Some(id.to_string()),
        Some(_) => key.clone(),
        None => None,
    };
    let asked = Asked {
        app: &app,
        new,
        scope: &scope,
        cache_key: key.as_deref(),
        probe_cache: new.scope.as_ref().is_some_and(|scoped| !scoped.recompute),
        facts: facts_for(new, logical_key.as_deref()),
    };
    let reads = loop {
        let got = reads(store, &mut tx, &asked, &lock).await?;
        if got.probe.taken
            && let Some(task) = by_effect_key(&mut tx, &app, new.effect_key.as_str()).await?
        {
            tx.rollback().await?;
            return Ok(Some(Created::existing(task)));
        }
        if !got.probe.early {
            break got;
        }
        // Found taken before the lock, its task gone by the read (owner deletion): read
        // again, this time under the lock.
        lock.replay_first = false;
    };
    let probe = &reads.probe;
    let (hit_id, hit_output) = (probe.hit_id.clone(), probe.hit_output.clone());
    let now = Timestamp(probe.now);
    let hit_charged = probe.hit_charged_nano;
    let owner = (run_id, scope, subject);
    let mut row = InsertRow::new(id, new, owner, (config_hash.0.clone(), model_ref), now);

    let Some(scoped) = &new.scope else {
        let Some(cost) = &new.cost else {
            return insert_and_commit(store, tx, &row, &app, None, path).await;
        };
        // docs/budgets.md, "Tasks without a source": the cost checks under a limit, then
        // the reservation recorded; never admitted (no task-count limit applies).
        let (budget, reservation) = (&cost.budget, &cost.reservation);
        let token = if cost.limited() {
            let facts = reads.facts()?;
            match check_unsourced(&mut tx, &app, &row.scope, &facts, budget, reservation, now)
                .await?
            {
                Ok(token) => token,
                Err(rejection) => return refused(tx, &app, new, rejection).await,
            }
        } else {
            None
        };
        let reserve = row.reserve(reservation, budget, token.is_some())?;
        return insert_reserved_and_commit(store, tx, &row, &app, budget, token, reserve).await;
    };
    let key = key.unwrap_or_default();
    row.cache_key = Some(key.clone());
    if let (Some(from), Some(output)) = (hit_id, hit_output) {
        row.cached_from = Some(from);
        row.cached_output = Some(output);
        row.saved_nano = hit_charged.unwrap_or(0);
        return insert_and_commit(store, tx, &row, &app, None, path).await;
    }
    // Step 5: admission, on the facts read under the lock.
    let facts = reads.facts()?;
    let Some(logical_key) = logical_key else {
        return Err(StoreError::Database(
            "a scoped task without a logical key".into(),
        ));
    };
    let update = admit(
        &mut tx,
        &app,
        &row.scope,
        &facts,
        &scoped.budget,
        &scoped.reservation,
        now,
    )
    .await?;
    let update = match update {
        Ok(update) => update,
        Err(rejection) => return refused(tx, &app, new, rejection).await,
    };
    let record = AdmissionRecord::admitted(&mut row, scoped, &logical_key, update)?;
    insert_and_commit(store, tx, &row, &app, Some(record), path).await
}

/// The facts a creation's decision needs: a scoped task's admission (for its logical
/// step), or the cost checks of one without a source under a USD or token limit.
fn facts_for<'a>(new: &'a NewTask, logical_key: Option<&'a str>) -> Facts<'a> {
    match (&new.scope, logical_key) {
        (Some(scoped), Some(logical_key)) => Facts::Admission {
            source: &scoped.source_id,
            logical_key,
        },
        _ if new.cost.as_ref().is_some_and(TaskCost::limited) => Facts::Cost,
        _ => Facts::None,
    }
}

/// A refused creation: rolled back, and answered with the task of its effect key if one
/// exists by now (a replay is never judged by admission: the probe's snapshot may
/// predate a creation of this key that committed while this one waited for the lock).
async fn refused(
    mut tx: Tx,
    app: &AppId,
    new: &NewTask,
    rejection: Refusal,
) -> StoreResult<Option<Created>> {
    let replay = by_effect_key(&mut tx, app, new.effect_key.as_str()).await?;
    tx.rollback().await?;
    match replay {
        Some(task) => Ok(Some(Created::existing(task))),
        None => Err(rejection.into()),
    }
}

/// Many creations with as few transactions as correctness allows: consecutive unscoped
/// items (no cache, no admission) share one transaction; each scoped item is its own
/// short admission transaction, so no scope or global lock is ever held across a batch.
/// Items are processed in order, so a repeated effect key is a replay of its first
/// occurrence.
pub(super) async fn create_tasks(
    store: &PostgresStore,
    news: Vec<NewTask>,
) -> StoreResult<Vec<StoreResult<Created>>> {
    let mut out = Vec::with_capacity(news.len());
    let mut pending: Vec<NewTask> = Vec::new();
    for new in news {
        // A task without a source joins the batch's one transaction unless a USD or token
        // limit applies to it (docs/budgets.md, "Tasks without a source": then its
        // reservation is checked under the scope's lock, in a short transaction of its own,
        // as a scoped task's admission); an unlimited one's reservation is only recorded
        // (with the batch's). A run's task that can cost money is checked against its run
        // one by one, as before.
        if batched_unscoped(&new) {
            pending.push(new);
            continue;
        }
        if !pending.is_empty() {
            out.extend(create_unscoped(store, std::mem::take(&mut pending)).await?);
        }
        match create_task(store, new).await {
            Err(e) if !e.is_per_item() => return Err(e),
            result => out.push(result),
        }
    }
    if !pending.is_empty() {
        out.extend(create_unscoped(store, pending).await?);
    }
    Ok(out)
}

/// Whether a creation of a batch joins its shared transaction ([`create_unscoped`]): no
/// source, not asked claimed, and no cost, or a cost under no USD or token limit on an
/// application's task.
fn batched_unscoped(new: &NewTask) -> bool {
    new.scope.is_none()
        && new.claim_by.is_none()
        && match &new.cost {
            None => true,
            Some(cost) => !cost.limited() && matches!(new.owner, Owner::Application { .. }),
        }
}

/// Unscoped creations in one transaction. Every refusal of an item (invalid model
/// configuration, missing or canceled run) happens before that item writes anything, so
/// no savepoint is needed; a database failure fails them all with nothing written.
async fn create_unscoped(
    store: &PostgresStore,
    news: Vec<NewTask>,
) -> StoreResult<Vec<StoreResult<Created>>> {
    let mut tx = store.begin().await?;
    // Shared scope locks of the application owners, in key order (the lock order): owner
    // deletion cannot interleave, and these creations never wait on each other.
    let mut keys: Vec<i64> = news
        .iter()
        .filter_map(|n| match &n.owner {
            Owner::Application { app, scope, .. } => Some(scope_lock_key(app, scope)),
            Owner::Run { .. } => None,
        })
        .collect();
    keys.sort_unstable();
    keys.dedup();
    for key in keys {
        sqlx::query("SELECT pg_advisory_xact_lock_shared($1)")
            .bind(key)
            .execute(&mut *tx)
            .await?;
    }
    let now = store.now(&mut tx).await?;
    let mut out: Vec<Option<StoreResult<Created>>> = Vec::with_capacity(news.len());
    let mut queues: Vec<(String, String, i64)> = Vec::new();
    // Application tasks go in one statement; run tasks (checked against their run) one
    // by one, as before.
    let mut app_items: Vec<insert::AppInsert<'_>> = Vec::new();
    let mut app_slots: Vec<usize> = Vec::new();
    for (n, new) in news.iter().enumerate() {
        let prepared = match &new.owner {
            Owner::Application { scope, subject, .. } => {
                Some(app_insert(new, scope, subject.as_ref()))
            }
            Owner::Run { .. } => None,
        };
        match prepared {
            Some(Ok(item)) => {
                app_items.push(item);
                app_slots.push(n);
                out.push(None);
                continue;
            }
            Some(Err(e)) => {
                out.push(Some(Err(e)));
                continue;
            }
            None => {}
        }
        match create_unscoped_in(&mut tx, new, now).await {
            Err(e) if !e.is_per_item() => {
                tx.rollback().await?;
                return Err(e);
            }
            result => {
                if let Ok(c) = &result
                    && c.created
                {
                    queues.push((
                        c.task.app.to_string(),
                        c.task.scope.to_string(),
                        i64::from(new.dispatch.weight),
                    ));
                }
                out.push(Some(result))
            }
        }
    }
    let inserted = insert::insert_app_tasks(&mut tx, &app_items, now).await?;
    let mut by_id: std::collections::HashMap<TaskId, Task> =
        inserted.into_iter().map(|t| (t.id, t)).collect();
    let mut spend = SettlementPlan::default();
    let bucket = spend_bucket(now);
    for (n, item) in app_slots.iter().zip(&app_items) {
        let result = match by_id.remove(&item.id) {
            Some(task) => {
                if let Some((_, delta)) = &item.reservation {
                    spend.add_spend(task.app.as_str(), task.scope.as_str(), bucket, *delta);
                }
                queues.push((
                    task.app.to_string(),
                    task.scope.to_string(),
                    i64::from(item.new.dispatch.weight),
                ));
                Ok(Created::inserted(task))
            }
            // The key was taken: before this batch, earlier in it, or by a transaction
            // that committed meanwhile (the insert waited for it).
            None => taken_key(&mut tx, item.new).await,
        };
        out[*n] = Some(result);
    }
    // docs/conformance.md#fair-share: the batch's queues, in lock order, held to the commit.
    activate_queues(&mut tx, &queues).await?;
    // docs/budgets.md, "Tasks without a source": the reservations of the tasks inserted,
    // summed per spend bucket, after the queues (the single creation's lock order: task,
    // queue, scope bucket, app bucket).
    if !spend.scope.is_empty() {
        tx.apply_spend(&spend).await?;
    }
    tx.commit().await?;
    Ok(out
        .into_iter()
        .map(|r| r.expect("every item has its result"))
        .collect())
}

/// An application task of a batch, ready for the one-statement insert, or the item's own
/// refusal (its model configuration).
fn app_insert<'a>(
    new: &'a NewTask,
    scope: &'a tollgate_core::ScopeId,
    subject: Option<&'a Subject>,
) -> StoreResult<insert::AppInsert<'a>> {
    let (config_hash, model_ref) = model_columns(new)?;
    // docs/budgets.md, "Tasks without a source": a cost under no limit is recorded as
    // the single path records it (no token bucket taken).
    let reservation = new
        .cost
        .as_ref()
        .map(|cost| reserved(&cost.reservation, &cost.budget, false))
        .transpose()?;
    Ok(insert::AppInsert {
        id: TaskId::generate(),
        new,
        scope,
        subject,
        config_hash: config_hash.0,
        model_ref,
        reservation,
    })
}

/// The task holding a taken effect key, as an idempotent answer.
async fn taken_key(tx: &mut Tx, new: &NewTask) -> StoreResult<Created> {
    by_effect_key(tx, new.owner.app(), new.effect_key.as_str())
        .await?
        .map(Created::existing)
        .ok_or_else(|| {
            StoreError::Unavailable(
                "effect key taken by a transaction that rolled back; retry".into(),
            )
        })
}

async fn create_unscoped_in(tx: &mut Tx, new: &NewTask, now: Timestamp) -> StoreResult<Created> {
    let (config_hash, model_ref) = model_columns(new)?;
    let app = new.owner.app().clone();
    // A run's task replays before its run is checked (a replay answers even once the run
    // is canceled). An application's task needs no read first: the insert below finds a
    // taken key itself (ON CONFLICT), so a new task costs one round trip.
    if matches!(new.owner, Owner::Run { .. })
        && let Some(task) = by_effect_key(tx, &app, new.effect_key.as_str()).await?
    {
        return Ok(Created::existing(task));
    }
    let (run_id, scope, subject) = match &new.owner {
        Owner::Run { run_id, .. } => {
            let (scope, subject) = run_owner(tx, &app, *run_id, false).await?;
            (Some(run_id.to_string()), scope, subject)
        }
        Owner::Application { scope, subject, .. } => (None, scope.clone(), subject.clone()),
    };
    let owner = (run_id, scope, subject);
    let row = InsertRow::new(
        TaskId::generate(),
        new,
        owner,
        (config_hash.0, model_ref),
        now,
    );
    match insert_task(tx, &row, false).await? {
        Some(task) => Ok(Created::inserted(task)),
        // The key is taken: before this call, or by a transaction that committed
        // meanwhile (the insert waited for it).
        None => taken_key(tx, new).await,
    }
}

async fn by_effect_key(
    conn: &mut sqlx::PgConnection,
    app: &AppId,
    key: &str,
) -> StoreResult<Option<Task>> {
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE app = $1 AND effect_key = $2"
    ))
    .bind(app.as_str())
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(TaskRow::into_task).transpose()
}
