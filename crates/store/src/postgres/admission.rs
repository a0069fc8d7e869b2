//! SPEC §3–4 on PostgreSQL: task creation with idempotency, owner check, cache and
//! admission in one short transaction, correct with any number of replicas.
//!
//! A scoped creation holds the exclusive advisory lock of its (app, scope): admissions of
//! one scope are serialized, different scopes run in parallel. The admission snapshot is
//! one statement reading only bounded things (the scope's counters row, one sighting
//! probe, this source's records, the global counters); the writes are one statement
//! ending with the conditional global increment, so the global row is locked only from
//! that statement to the commit.

use super::{PostgresStore, Tx, now_sql};
use crate::rows::{TaskRow, task_columns};
use crate::{Created, StoreError, StoreResult};
use sqlx::{FromRow, Row};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::canonical::sha256_hex;
use tollgate_core::{
    AdmissionRejection, AdmissionSnapshot, AppId, BucketState, Budget, NewTask, Owner, RunId,
    RunState, ScopeId, SourceId, Subject, SubjectKind, Task, TaskId, Timestamp, Usage, cache_key,
    decide,
};

/// The advisory lock key of an (app, scope): the first 8 bytes of SHA-256 of both, with a
/// separator no identifier may contain.
pub(super) fn scope_lock_key(app: &AppId, scope: &ScopeId) -> i64 {
    let hex = sha256_hex(format!("tollgate-scope\u{1f}{app}\u{1f}{scope}").as_bytes());
    u64::from_str_radix(&hex[..16], 16).unwrap_or(0) as i64
}

/// Takes the (app, scope) advisory lock for this transaction.
pub(super) async fn lock_scope(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    exclusive: bool,
) -> StoreResult<()> {
    let sql = if exclusive {
        "SELECT pg_advisory_xact_lock($1)"
    } else {
        "SELECT pg_advisory_xact_lock_shared($1)"
    };
    sqlx::query(sql)
        .bind(scope_lock_key(app, scope))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// What a creation reads once its owner is settled: whether its effect key is taken,
/// the newest cache hit, and "now".
struct Probe {
    taken: bool,
    hit_id: Option<String>,
    hit_output: Option<String>,
    now: Timestamp,
}

/// Reads the [`Probe`], taking the scope's advisory lock first in the same statement
/// when `lock` is `(key, exclusive)`: one round trip. The lock is taken in the FROM
/// subquery (volatile, so never flattened) before the outer select reads the clock; the
/// statement's snapshot is older than the lock, so an effect key taken by a creation that
/// committed while this one waited may be missed here — the task insert's `ON CONFLICT`
/// finds it, and an admission rejection re-checks the key before it is reported.
#[allow(clippy::too_many_arguments)]
async fn probe(
    store: &PostgresStore,
    tx: &mut Tx,
    app: &AppId,
    new: &NewTask,
    scope: &ScopeId,
    cache_key: Option<&str>,
    probe_cache: bool,
    lock: Option<(i64, bool)>,
) -> StoreResult<Probe> {
    macro_rules! probe_sql {
        ($from:literal) => {
            concat!(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE app = $1 AND effect_key = $2), \
                 hit.id, hit.output, ",
                now_sql!("6"),
                " FROM ",
                $from,
                " LEFT JOIN LATERAL (SELECT id, output FROM tasks \
                   WHERE $5 AND app = $1 AND scope = $3 AND cache_key = $4 \
                   AND status = 'succeeded' \
                   ORDER BY completed_at DESC, id DESC LIMIT 1) AS hit ON true"
            )
        };
    }
    let sql = match lock {
        None => probe_sql!("(SELECT $7::BIGINT) AS unlocked"),
        Some((_, true)) => probe_sql!("(SELECT pg_advisory_xact_lock($7)) AS locked"),
        Some((_, false)) => probe_sql!("(SELECT pg_advisory_xact_lock_shared($7)) AS locked"),
    };
    let (taken, hit_id, hit_output, ms): (bool, Option<String>, Option<String>, i64) =
        sqlx::query_as(sql)
            .bind(app.as_str())
            .bind(new.effect_key.as_str())
            .bind(scope.as_str())
            .bind(cache_key.unwrap_or(""))
            .bind(probe_cache)
            .bind(store.fixed_now())
            .bind(lock.map_or(0, |(key, _)| key))
            .fetch_one(&mut **tx)
            .await?;
    Ok(Probe {
        taken,
        hit_id,
        hit_output,
        now: Timestamp(ms),
    })
}

pub(super) async fn create_task(store: &PostgresStore, new: NewTask) -> StoreResult<Created> {
    match attempt_create(store, &new, SlotPath::Fast).await? {
        Some(created) => Ok(created),
        // The fast path found its stripe without allowance and rolled back: again, with
        // the exact recount (which always decides).
        None => attempt_create(store, &new, SlotPath::Rebalance)
            .await?
            .ok_or_else(|| StoreError::Database("the rebalancing admission did not decide".into())),
    }
}

/// How an admission takes its global slot (see [`take_slot_rebalancing`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotPath {
    /// One stripe's allowance; `None` from [`attempt_create`] when it has none left.
    Fast,
    /// Every stripe locked in order, the global count recounted exactly.
    Rebalance,
}

/// One transaction of SPEC §3 steps 2–6. `Ok(None)`: the fast slot path found no
/// allowance; nothing was written.
async fn attempt_create(
    store: &PostgresStore,
    new: &NewTask,
    path: SlotPath,
) -> StoreResult<Option<Created>> {
    let config_hash = new.model_ref.config_hash()?;
    let model_ref = serde_json::to_string(&new.model_ref)
        .map_err(|e| StoreError::Database(format!("cannot encode model ref: {e}")))?;
    let app = new.owner.app().clone();
    let mut tx = store.begin().await?;

    // Step 2: idempotency, before any lock: a replay costs one indexed read.
    if let Some(task) = by_effect_key(&mut tx, &app, new.effect_key.as_str()).await? {
        tx.rollback().await?;
        return Ok(Some(Created {
            task,
            created: false,
        }));
    }

    // Step 3: owner check; a run's scope and subject apply to its tasks. Then step 2 again
    // under the lock (a racing creation of the same key that held the lock first has
    // committed by now, and its replay must not be judged by admission) and step 4 (the
    // cache: newest success first, same app and scope), read in one statement.
    let cache_key_for = |subject: Option<&Subject>| {
        new.scope.as_ref().map(|scoped| {
            cache_key(
                &scoped.source_id,
                &scoped.source_revision,
                &new.request,
                &config_hash,
                subject,
            )
        })
    };
    let probe_cache = new.scope.as_ref().is_some_and(|scoped| !scoped.recompute);
    let (run_id, scope, subject, key, probe) = match &new.owner {
        Owner::Run { run_id, .. } => {
            let (scope, subject) = run_owner(&mut tx, &app, *run_id, new.scope.is_some()).await?;
            let key = cache_key_for(subject.as_ref());
            let probe = probe(
                store,
                &mut tx,
                &app,
                new,
                &scope,
                key.as_deref(),
                probe_cache,
                None,
            )
            .await?;
            (Some(run_id.to_string()), scope, subject, key, probe)
        }
        Owner::Application { scope, subject, .. } => {
            // Exclusive for admission; shared otherwise, which only keeps owner deletion
            // (exclusive) from interleaving with this creation.
            let key = cache_key_for(subject.as_ref());
            let lock = (scope_lock_key(&app, scope), new.scope.is_some());
            let probe = probe(
                store,
                &mut tx,
                &app,
                new,
                scope,
                key.as_deref(),
                probe_cache,
                Some(lock),
            )
            .await?;
            (None, scope.clone(), subject.clone(), key, probe)
        }
    };
    if probe.taken
        && let Some(task) = by_effect_key(&mut tx, &app, new.effect_key.as_str()).await?
    {
        tx.rollback().await?;
        return Ok(Some(Created {
            task,
            created: false,
        }));
    }
    let (hit_id, hit_output, now) = (probe.hit_id, probe.hit_output, probe.now);
    let id = TaskId::generate();
    let mut row = InsertRow {
        id,
        new,
        run_id,
        scope,
        subject,
        config_hash: config_hash.0.clone(),
        model_ref,
        cache_key: None,
        admitted: false,
        cached_from: None,
        cached_output: None,
        now,
    };

    let Some(scoped) = &new.scope else {
        return insert_and_commit(store, tx, &row, &app, None, path).await;
    };
    let key = key.unwrap_or_default();
    row.cache_key = Some(key.clone());
    if let (Some(from), Some(output)) = (hit_id, hit_output) {
        row.cached_from = Some(from);
        row.cached_output = Some(output);
        return insert_and_commit(store, tx, &row, &app, None, path).await;
    }
    // Step 5: admission.
    let logical_key = if scoped.recompute {
        id.to_string()
    } else {
        key
    };
    let update = admit(
        &mut tx,
        &app,
        &row.scope,
        &scoped.source_id,
        &logical_key,
        &scoped.budget,
        now,
    )
    .await?;
    let update = match update {
        Ok(update) => update,
        Err(rejection) => {
            // A replay is never judged by admission: the probe's snapshot may predate a
            // creation of this key that committed while this one waited for the lock.
            let replay = by_effect_key(&mut tx, &app, new.effect_key.as_str()).await?;
            tx.rollback().await?;
            return match replay {
                Some(task) => Ok(Some(Created {
                    task,
                    created: false,
                })),
                None => Err(StoreError::Admission(rejection)),
            };
        }
    };
    row.admitted = true;
    let record = AdmissionRecord {
        source: &scoped.source_id,
        logical_key: &logical_key,
        budget: &scoped.budget,
        update,
    };
    insert_and_commit(store, tx, &row, &app, Some(record), path).await
}

/// SPEC §3 step 3 for a run's task: the run exists in the app and is not canceled; its
/// scope and subject apply. With `lock_for_admission`, the run's scope lock is taken
/// (exclusive) before the run row (the lock order).
async fn run_owner(
    tx: &mut Tx,
    app: &AppId,
    run_id: RunId,
    lock_for_admission: bool,
) -> StoreResult<(ScopeId, Option<Subject>)> {
    let scope: Option<String> =
        sqlx::query_scalar("SELECT scope FROM runs WHERE id = $1 AND app = $2")
            .bind(run_id.to_string())
            .bind(app.as_str())
            .fetch_optional(&mut **tx)
            .await?;
    let Some(scope) = scope else {
        return Err(StoreError::RunNotFound(run_id.to_string()));
    };
    let scope = ScopeId::new(scope).map_err(|e| StoreError::Corrupt(format!("run scope: {e}")))?;
    if lock_for_admission {
        lock_scope(tx, app, &scope, true).await?;
    }
    // FOR SHARE: a concurrent cancel of the run either commits first (and we see it) or
    // waits for us (and its cascade sees the new task).
    let row: Option<(String, bool, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT state, cancel_requested, subject_type, subject_id FROM runs \
         WHERE id = $1 AND app = $2 FOR SHARE",
    )
    .bind(run_id.to_string())
    .bind(app.as_str())
    .fetch_optional(&mut **tx)
    .await?;
    let Some((state, cancel, kind, sid)) = row else {
        return Err(StoreError::RunNotFound(run_id.to_string()));
    };
    if cancel || state == RunState::Canceled.as_str() {
        return Err(StoreError::RunCanceled(run_id.to_string()));
    }
    let subject = match (kind, sid) {
        (Some(k), Some(id)) => Some(Subject {
            kind: SubjectKind::parse(&k)
                .ok_or_else(|| StoreError::Corrupt(format!("subject_type {k}")))?,
            id,
        }),
        _ => None,
    };
    Ok((scope, subject))
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
        if new.scope.is_none() {
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
    let mut out = Vec::with_capacity(news.len());
    for new in &news {
        match create_unscoped_in(&mut tx, new, now).await {
            Err(e) if !e.is_per_item() => {
                tx.rollback().await?;
                return Err(e);
            }
            result => out.push(result),
        }
    }
    tx.commit().await?;
    Ok(out)
}

async fn create_unscoped_in(tx: &mut Tx, new: &NewTask, now: Timestamp) -> StoreResult<Created> {
    let config_hash = new.model_ref.config_hash()?;
    let model_ref = serde_json::to_string(&new.model_ref)
        .map_err(|e| StoreError::Database(format!("cannot encode model ref: {e}")))?;
    let app = new.owner.app().clone();
    // A run's task replays before its run is checked (a replay answers even once the run
    // is canceled). An application's task needs no read first: the insert below finds a
    // taken key itself (ON CONFLICT), so a new task costs one round trip.
    if matches!(new.owner, Owner::Run { .. })
        && let Some(task) = by_effect_key(tx, &app, new.effect_key.as_str()).await?
    {
        return Ok(Created {
            task,
            created: false,
        });
    }
    let (run_id, scope, subject) = match &new.owner {
        Owner::Run { run_id, .. } => {
            let (scope, subject) = run_owner(tx, &app, *run_id, false).await?;
            (Some(run_id.to_string()), scope, subject)
        }
        Owner::Application { scope, subject, .. } => (None, scope.clone(), subject.clone()),
    };
    let row = InsertRow {
        id: TaskId::generate(),
        new,
        run_id,
        scope,
        subject,
        config_hash: config_hash.0,
        model_ref,
        cache_key: None,
        admitted: false,
        cached_from: None,
        cached_output: None,
        now,
    };
    match insert_task(tx, &row).await? {
        Some(task) => Ok(Created {
            task,
            created: true,
        }),
        // The key is taken: before this call, or by a transaction that committed
        // meanwhile (the insert waited for it).
        None => by_effect_key(tx, &app, new.effect_key.as_str())
            .await?
            .map(|task| Created {
                task,
                created: false,
            })
            .ok_or_else(|| {
                StoreError::Unavailable(
                    "effect key taken by a transaction that rolled back; retry".into(),
                )
            }),
    }
}

/// The task insert (`$1`–`$25`, bound by [`bind_insert`]); a taken effect key inserts
/// nothing (`ON CONFLICT DO NOTHING`) and returns no row.
macro_rules! task_insert {
    () => {
        concat!(
            "INSERT INTO tasks (id, app, effect_key, kind, step, run_id, scope, subject_type, \
             subject_id, source_id, source_revision, recompute, admitted, model_id, model_ref, \
             model_config_hash, request, input_hash, cache_key, status, cached_from, output, \
             usage, created_at, completed_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
             $17, $18, $19, $20, $21, $22, $23, $24, $25) \
             ON CONFLICT (app, effect_key) DO NOTHING RETURNING ",
            task_columns!()
        )
    };
}

type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// Binds [`task_insert`]'s `$1`–`$25`.
fn bind_insert<'q>(q: PgQuery<'q>, i: &'q InsertRow<'_>) -> PgQuery<'q> {
    let new = i.new;
    let cached = i.cached_from.is_some();
    let scoped = new.scope.as_ref();
    let usage = cached.then(|| serde_json::to_string(&Usage::default()).unwrap_or_default());
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
}

struct InsertRow<'a> {
    id: TaskId,
    new: &'a NewTask,
    run_id: Option<String>,
    scope: ScopeId,
    subject: Option<Subject>,
    config_hash: String,
    model_ref: String,
    cache_key: Option<String>,
    admitted: bool,
    cached_from: Option<String>,
    cached_output: Option<String>,
    now: Timestamp,
}

struct AdmissionRecord<'a> {
    source: &'a SourceId,
    logical_key: &'a str,
    budget: &'a Budget,
    update: ScopeUpdate,
}

/// What an admission writes to its scope's row: the bucket after taking a token and the
/// change in distinct sources (a new source, minus the expired sightings pruned).
struct ScopeUpdate {
    bucket: BucketState,
    sources_delta: i64,
}

/// The writes of an admission after its task insert, as CTEs of its final statement:
/// the scope's row (bucket, sources, active), the source's sighting, and the admission
/// record — only when the task row was inserted (`t`). Parameters follow the task
/// insert's: `$26` source, `$27` logical key, `$28` bucket units, `$29` bucket time,
/// `$30` sources delta (app, scope, task id and now are the insert's `$2`, `$7`, `$1`,
/// `$24`).
macro_rules! admission_writes {
    () => {
        ", st AS (INSERT INTO scope_state \
           (app, scope, bucket_units, bucket_at, sources_in_window, active) \
           SELECT $2, $7, $28, $29, GREATEST($30, 0), 1 FROM t \
           ON CONFLICT (app, scope) DO UPDATE SET bucket_units = EXCLUDED.bucket_units, \
           bucket_at = EXCLUDED.bucket_at, \
           sources_in_window = scope_state.sources_in_window + $30, \
           active = scope_state.active + 1), \
         ss AS (INSERT INTO scope_sources (app, scope, source_id, last_admitted_at) \
           SELECT $2, $7, $26, $24 FROM t \
           ON CONFLICT (app, scope, source_id) DO UPDATE SET \
           last_admitted_at = GREATEST(scope_sources.last_admitted_at, \
                                       EXCLUDED.last_admitted_at)), \
         rec AS (INSERT INTO admissions \
           (app, scope, source_id, task_id, logical_key, admitted_at) \
           SELECT $2, $7, $26, $1, $27, $24 FROM t) "
    };
}

/// Step 6: insert the task; for an admitted task, then record the admission and take the
/// global slot in one final statement; commit.
async fn insert_and_commit(
    store: &PostgresStore,
    mut tx: Tx,
    row: &InsertRow<'_>,
    app: &AppId,
    admission: Option<AdmissionRecord<'_>>,
    path: SlotPath,
) -> StoreResult<Option<Created>> {
    let Some(record) = admission else {
        let Some(task) = insert_task(&mut tx, row).await? else {
            // Another replica inserted the same effect key first: keep nothing of ours.
            tx.rollback().await?;
            return lost_race(store, app, row.new).await.map(Some);
        };
        tx.commit().await?;
        return Ok(Some(Created {
            task,
            created: true,
        }));
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
            admission_writes!(),
            ", slot AS (UPDATE global_slots SET admitted = admitted + 1 \
               WHERE stripe = $31 AND admitted < capacity AND cap_for = $32 \
               AND EXISTS (SELECT 1 FROM t) RETURNING admitted) \
             SELECT t.*, (SELECT admitted FROM slot) AS took FROM t"
        ),
        SlotPath::Rebalance => concat!(
            "WITH t AS (",
            task_insert!(),
            ")",
            admission_writes!(),
            "SELECT t.*, 0::BIGINT AS took FROM t"
        ),
    };
    let inserted = bind_insert(sqlx::query(sql), row)
        .bind(record.source.as_str())
        .bind(record.logical_key)
        .bind(record.update.bucket.units)
        .bind(record.update.bucket.at.0)
        .bind(record.update.sources_delta)
        .bind(stripe)
        .bind(cap)
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
        SlotPath::Rebalance => take_slot_rebalancing(&mut tx, stripe, cap).await?,
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
    Ok(Some(Created {
        task,
        created: true,
    }))
}

/// Number of `global_slots` stripes (migration 0004).
const SLOT_STRIPES: i64 = 16;

/// The slot stripe an admission tries first: spread by the new task's random id.
fn slot_stripe(id: TaskId) -> i64 {
    let h = id
        .to_string()
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    (h % SLOT_STRIPES as u64) as i64
}

/// Slow path of the global cap, when the chosen stripe has no allowance left (or its
/// allowance was computed for another `global_concurrent`): lock every stripe in order,
/// count the service's active admitted tasks exactly (`Σ admitted − Σ finished`), and if
/// one more fits, take it on `stripe` and hand the rest of the free capacity out again
/// as allowances spread over the stripes.
///
/// Why the cap holds: a rebalance at a moment with `A₀ = Σ admitted` and `F₀` finished
/// (a read that can only lag, so `A₀ − F₀` is at least the true count) sets
/// `Σ capacity = A₀ + (cap − (A₀ − F₀))`. Fast-path admissions never take a stripe past
/// its capacity, so afterwards `Σ admitted ≤ cap + F₀ ≤ cap + F_now`: the active count
/// never exceeds the cap. Allowances are only used with the cap they were computed for.
/// Returns whether the slot was taken.
async fn take_slot_rebalancing(tx: &mut Tx, stripe: i64, cap: i64) -> StoreResult<bool> {
    let rows: Vec<(i32, i64, i64)> = sqlx::query_as(
        "SELECT stripe, admitted, \
         (SELECT COALESCE(SUM(finished), 0)::BIGINT FROM global_finished) \
         FROM global_slots ORDER BY stripe FOR UPDATE",
    )
    .fetch_all(&mut **tx)
    .await?;
    let admitted: i64 = rows.iter().map(|r| r.1).sum();
    let finished = rows.first().map_or(0, |r| r.2);
    let active = admitted - finished;
    if active >= cap {
        return Ok(false);
    }
    let free = cap - active - 1;
    let share = free / SLOT_STRIPES;
    let rest = free % SLOT_STRIPES;
    sqlx::query(
        "UPDATE global_slots SET \
           admitted = admitted + CASE WHEN stripe = $1 THEN 1 ELSE 0 END, \
           capacity = admitted + CASE WHEN stripe = $1 THEN 1 + $3 ELSE 0 END + $2, \
           cap_for = $4",
    )
    .bind(stripe as i32)
    .bind(share)
    .bind(rest)
    .bind(cap)
    .execute(&mut **tx)
    .await?;
    Ok(true)
}

async fn lost_race(store: &PostgresStore, app: &AppId, new: &NewTask) -> StoreResult<Created> {
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
    Ok(Created {
        task,
        created: false,
    })
}

async fn by_effect_key(tx: &mut Tx, app: &AppId, key: &str) -> StoreResult<Option<Task>> {
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE app = $1 AND effect_key = $2"
    ))
    .bind(app.as_str())
    .bind(key)
    .fetch_optional(&mut **tx)
    .await?;
    row.map(TaskRow::into_task).transpose()
}

/// Inserts the task and returns it; `None` when the effect key was taken meanwhile.
async fn insert_task(tx: &mut Tx, i: &InsertRow<'_>) -> StoreResult<Option<Task>> {
    let row = bind_insert(sqlx::query(task_insert!()), i)
        .fetch_optional(&mut **tx)
        .await?;
    row.map(|r| TaskRow::from_row(&r).map_err(StoreError::from))
        .transpose()?
        .map(TaskRow::into_task)
        .transpose()
}

/// The snapshot of SPEC §4 in one statement, under the scope's advisory lock.
type SnapshotRow = (
    i64,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    Option<i64>,
    bool,
    i64,
    bool,
    i64,
);

/// SPEC §4 under the scope lock: prunes the scope's expired sightings, reads the
/// snapshot, asks core's [`decide`], and on admission stores the bucket, the counters and
/// the sighting. The global cap is enforced again by the final conditional increment.
async fn admit(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    source: &SourceId,
    logical_key: &str,
    budget: &Budget,
    now: Timestamp,
) -> StoreResult<Result<ScopeUpdate, AdmissionRejection>> {
    let cutoff = now.minus(ADMISSION_WINDOW).0;
    // The prune and the snapshot are one statement: the snapshot sees the sightings as
    // they were before the prune, and counts only those newer than the cutoff anyway.
    let (pruned, units, at, sources, active, seen, steps, counted, global): SnapshotRow =
        sqlx::query_as(
            "WITH pruned AS (DELETE FROM scope_sources \
           WHERE app = $1 AND scope = $2 AND last_admitted_at <= $4 RETURNING 1) \
         SELECT (SELECT COUNT(*) FROM pruned)::BIGINT, \
         s.bucket_units, s.bucket_at, s.sources_in_window, s.active, \
         EXISTS (SELECT 1 FROM scope_sources WHERE app = $1 AND scope = $2 AND source_id = $3 \
                 AND last_admitted_at > $4), \
         (SELECT COUNT(DISTINCT logical_key) FROM admissions WHERE app = $1 AND scope = $2 \
                 AND source_id = $3 AND admitted_at > $4 AND logical_key IS NOT NULL), \
         EXISTS (SELECT 1 FROM admissions WHERE app = $1 AND scope = $2 AND source_id = $3 \
                 AND admitted_at > $4 AND logical_key = $5), \
         (SELECT COALESCE(SUM(admitted), 0)::BIGINT FROM global_slots) \
           - (SELECT COALESCE(SUM(finished), 0)::BIGINT FROM global_finished) \
         FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = $1 AND s.scope = $2",
        )
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(source.as_str())
        .bind(cutoff)
        .bind(logical_key)
        .fetch_one(&mut **tx)
        .await?;
    let snapshot = AdmissionSnapshot {
        source_steps: steps.max(0) as u64,
        step_already_counted: counted,
        sources_in_window: sources.unwrap_or(0).saturating_sub(pruned).max(0) as u64,
        source_already_seen: seen,
        scope_active: active.unwrap_or(0).max(0) as u64,
        global_active: global.max(0) as u64,
    };
    let bucket = match (units, at) {
        (Some(units), Some(at)) => Some(BucketState {
            units,
            at: Timestamp(at),
        }),
        _ => None,
    };
    let bucket = match decide(budget, &snapshot, bucket, now) {
        Ok(b) => b,
        Err(rejection) => return Ok(Err(rejection)),
    };
    // Relative updates: whoever deletes an expired sighting subtracts it, exactly once.
    Ok(Ok(ScopeUpdate {
        bucket,
        sources_delta: i64::from(!seen) - pruned,
    }))
}
