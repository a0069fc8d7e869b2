//! SPEC §3–4 on SQLite: task creation with idempotency, owner check, cache and
//! admission in one `BEGIN IMMEDIATE` transaction.
//!
//! Admission reads only what it needs, each bounded independently of the 24 h window's
//! size: the scope's row in `scope_state` (token bucket and distinct-source count),
//! one primary-key probe of `scope_sources`, the admission records of this one source,
//! and the partial index of active admitted tasks (at most the concurrency caps).
//! Expired sources of the scope are pruned on the way, each row once (amortized O(1)).

use super::SqliteStore;
use super::dispatch::queue_activation;
use crate::shared::admission::{AdmissionFacts, Refusal, UnsourcedFacts, cached_usage};
use crate::shared::cost::SpendDelta;
use crate::shared::rows::{CacheHitRow, TaskRow, task_columns};
use crate::{Created, StoreError, StoreResult};
use sqlx::{FromRow, SqliteConnection};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::cost::{
    app_spend_stripe, decide_app_spend, spend_bucket, spend_retry_after, window_first_bucket,
};
use tollgate_core::{
    AppId, BucketState, Budget, ConfigHash, CostRejection, NewTask, Owner, Reservation, RunState,
    ScopeId, SourceId, Subject, Task, TaskCost, TaskId, Timestamp, cache_key, join_credit, stride,
};

/// The upserts adding a delta to the scope's and the app's spend bucket, as a literal
/// for `concat!`: its 12 positional arguments as [`bind_spend`]
/// binds them.
macro_rules! spend_upserts {
    () => {
        "INSERT INTO scope_spend (app, scope, bucket, reserved_nano, reserved_tokens, saved_nano) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (app, scope, bucket) DO UPDATE SET \
         reserved_nano = reserved_nano + excluded.reserved_nano, \
         reserved_tokens = reserved_tokens + excluded.reserved_tokens, \
         saved_nano = saved_nano + excluded.saved_nano; \
         INSERT INTO app_spend (app, bucket, stripe, reserved_nano, reserved_tokens, saved_nano) \
         VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (app, bucket, stripe) DO UPDATE SET \
         reserved_nano = reserved_nano + excluded.reserved_nano, \
         reserved_tokens = reserved_tokens + excluded.reserved_tokens, \
         saved_nano = saved_nano + excluded.saved_nano"
    };
}

/// Everything inserted for a new task, resolved from [`NewTask`] and the owner.
struct Insert<'a> {
    id: TaskId,
    new: &'a NewTask,
    run_id: Option<String>,
    scope: ScopeId,
    subject: Option<Subject>,
    config_hash: String,
    model_ref: String,
    cache_key: Option<String>,
    admitted: bool,
    cached: Option<CacheHitRow>,
    now: Timestamp,
    /// SPEC §13: the reservation as stored (admitted tasks only).
    reservation: Option<String>,
}

pub(super) async fn create_task(store: &SqliteStore, new: NewTask) -> StoreResult<Created> {
    let mut tx = store.begin().await?;
    let now = store.now();
    match create_in(&mut tx, &new, now).await {
        Ok(created) => {
            tx.commit().await?;
            Ok(created)
        }
        Err(e) => {
            tx.rollback().await?;
            Err(e)
        }
    }
}

/// Many creations in ONE write transaction, each item in its own savepoint: an item
/// refused for its own reasons (invalid, admission, owner) is rolled back alone and
/// reported in its place; a database failure fails the whole batch with nothing written.
pub(super) async fn create_tasks(
    store: &SqliteStore,
    news: Vec<NewTask>,
) -> StoreResult<Vec<StoreResult<Created>>> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let mut out = Vec::with_capacity(news.len());
    for new in &news {
        let mut item = sqlx::Connection::begin(&mut *tx).await?;
        match create_in(&mut item, new, now).await {
            Ok(created) => {
                item.commit().await?;
                out.push(Ok(created));
            }
            Err(e) if e.is_per_item() => {
                item.rollback().await?;
                out.push(Err(e));
            }
            Err(e) => {
                item.rollback().await?;
                tx.rollback().await?;
                return Err(e);
            }
        }
    }
    tx.commit().await?;
    Ok(out)
}

/// SPEC §3 steps 2–6 on a connection inside a `BEGIN IMMEDIATE` transaction (or a
/// savepoint of one). The caller commits on `Ok` and rolls back on `Err`.
async fn create_in(
    conn: &mut SqliteConnection,
    new: &NewTask,
    now: Timestamp,
) -> StoreResult<Created> {
    let config_hash = new.model_ref.config_hash()?;
    let model_ref = serde_json::to_string(&new.model_ref)
        .map_err(|e| StoreError::Database(format!("cannot encode model ref: {e}")))?;
    let app = new.owner.app().clone();

    // Step 2: idempotency. The same key always names the same task, whatever its state.
    // Step 3: owner check; a run's scope and subject apply to its tasks. An application
    // task's scope is its own, so its key and its cache hit (step 4) are read in one
    // statement ([`probe`]); a run's task reads its key before the run, and its cache hit
    // after.
    let (run_id, scope, subject, key, hit) = match &new.owner {
        Owner::Run { run_id, .. } => {
            if let Some(task) = by_effect_key(conn, &app, new.effect_key.as_str()).await? {
                return Ok(Created::existing(task));
            }
            let Some(run) = super::runs::fetch_run(&mut *conn, &app, *run_id).await? else {
                return Err(StoreError::RunNotFound(run_id.to_string()));
            };
            if run.cancel_requested || run.state == RunState::Canceled {
                return Err(StoreError::RunCanceled(run_id.to_string()));
            }
            let key = scoped_cache_key(new, &config_hash, run.subject.as_ref());
            let hit = probe(conn, &app, new, &run.scope, key.as_deref())
                .await?
                .hit();
            (Some(run_id.to_string()), run.scope, run.subject, key, hit)
        }
        Owner::Application { scope, subject, .. } => {
            let key = scoped_cache_key(new, &config_hash, subject.as_ref());
            let probed = probe(conn, &app, new, scope, key.as_deref()).await?;
            if probed.taken
                && let Some(task) = by_effect_key(conn, &app, new.effect_key.as_str()).await?
            {
                return Ok(Created::existing(task));
            }
            (None, scope.clone(), subject.clone(), key, probed.hit())
        }
    };

    let id = TaskId::generate();
    let mut insert = Insert {
        id,
        new,
        run_id,
        scope,
        subject,
        config_hash: config_hash.0.clone(),
        model_ref,
        cache_key: None,
        admitted: false,
        cached: None,
        now,
        reservation: None,
    };

    let mut admission = None;
    if let (None, Some(cost)) = (&new.scope, &new.cost) {
        // A task without a source that can cost money: its reservation is checked
        // against the USD and token limits and recorded (docs/budgets.md, "Tasks without
        // a source"); it is not admitted (no admission record, no task-count limit).
        let reservation = reserve_unsourced(conn, &app, &insert.scope, cost, now)
            .await?
            .map_err(StoreError::from)?;
        insert.reservation = Some(encode_reservation(&reservation)?);
    }
    if let (Some(scoped), Some(key)) = (&new.scope, key) {
        // Step 4: cache. Same app and scope; the key covers source, revision, request,
        // model config and subject ([`probe`] read it, unless the task recomputes).
        insert.cached = hit;
        insert.cache_key = Some(key.clone());
        if insert.cached.is_none() {
            // Step 5: admission. The logical key is the cache key, or the task's own id
            // for a recompute.
            let logical_key = if scoped.recompute {
                id.to_string()
            } else {
                key
            };
            let reservation = admit(
                conn,
                &app,
                &insert.scope,
                &scoped.source_id,
                &logical_key,
                &scoped.budget,
                &scoped.reservation,
                now,
            )
            .await?
            .map_err(StoreError::from)?;
            insert.reservation = Some(encode_reservation(&reservation)?);
            insert.admitted = true;
            admission = Some((&scoped.source_id, logical_key));
        }
    }

    // Step 6: insert, with what follows it in the same query: a hit's saving, or a
    // queued task's queue activation and admission record.
    let saved = insert
        .cached
        .as_ref()
        .and_then(|h| h.charged_nano)
        .unwrap_or(0);
    let task = insert_task(conn, &insert, saved, admission).await?;
    Ok(Created::inserted(task).saving(saved))
}

/// A reservation as the task row keeps it.
fn encode_reservation(r: &Reservation) -> StoreResult<String> {
    serde_json::to_string(r)
        .map_err(|e| StoreError::Database(format!("cannot encode reservation: {e}")))
}

/// SPEC §3 step 4's key of a scoped task (`None` for an unscoped one).
fn scoped_cache_key(
    new: &NewTask,
    config_hash: &ConfigHash,
    subject: Option<&Subject>,
) -> Option<String> {
    new.scope.as_ref().map(|scoped| {
        cache_key(
            &scoped.source_id,
            &scoped.source_revision,
            &new.request,
            config_hash,
            subject,
        )
    })
}

/// Whether an effect key is taken, and the newest cache hit of a key, read together.
#[derive(sqlx::FromRow)]
struct Probe {
    taken: bool,
    hit_id: Option<String>,
    hit_output: Option<String>,
    hit_charged_nano: Option<i64>,
}

impl Probe {
    fn hit(self) -> Option<CacheHitRow> {
        Some(CacheHitRow {
            id: self.hit_id?,
            output: self.hit_output?,
            charged_nano: self.hit_charged_nano,
        })
    }
}

/// SPEC §3 steps 2 and 4 in one statement: whether `new`'s effect key is taken in its
/// app, and the newest success under `cache_key` in (app, scope) unless there is no key
/// or the task recomputes.
async fn probe(
    conn: &mut SqliteConnection,
    app: &AppId,
    new: &NewTask,
    scope: &ScopeId,
    cache_key: Option<&str>,
) -> StoreResult<Probe> {
    let read_cache = cache_key.is_some() && new.scope.as_ref().is_some_and(|s| !s.recompute);
    Ok(sqlx::query_as(
        "SELECT EXISTS (SELECT 1 FROM tasks WHERE app = ?1 AND effect_key = ?2) AS taken, \
         hit.id AS hit_id, hit.output AS hit_output, hit.charged_nano AS hit_charged_nano \
         FROM (SELECT 1) LEFT JOIN (SELECT id, output, charged_nano FROM tasks \
           WHERE ?5 AND app = ?1 AND scope = ?3 AND cache_key = ?4 AND status = 'succeeded' \
           AND cache_key IS NOT NULL \
           ORDER BY completed_at DESC, id DESC LIMIT 1) AS hit ON 1",
    )
    .bind(app.as_str())
    .bind(new.effect_key.as_str())
    .bind(scope.as_str())
    .bind(cache_key)
    .bind(read_cache)
    .fetch_one(&mut *conn)
    .await?)
}

async fn by_effect_key(
    conn: &mut SqliteConnection,
    app: &AppId,
    key: &str,
) -> StoreResult<Option<tollgate_core::Task>> {
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE app = ? AND effect_key = ?"
    ))
    .bind(app.as_str())
    .bind(key)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(TaskRow::into_task).transpose()
}

/// The task insert, as a literal for `concat!`: 28 positional arguments, in
/// [`insert_task`]'s order.
macro_rules! task_insert {
    () => {
        concat!(
            "INSERT INTO tasks (id, app, effect_key, kind, step, run_id, scope, subject_type, \
             subject_id, source_id, source_revision, recompute, admitted, model_id, model_ref, \
             model_config_hash, request, input_hash, cache_key, status, cached_from, output, \
             usage, created_at, completed_at, reservation, priority, dispatch_key) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, \
             ?, ?) RETURNING ",
            task_columns!()
        )
    };
}

/// An admitted task's admission record, as a literal for `concat!`.
macro_rules! admission_record {
    () => {
        "INSERT INTO admissions (app, scope, source_id, task_id, logical_key, admitted_at) \
         VALUES (?, ?, ?, ?, ?, ?)"
    };
}

/// Inserts the task and, in the same query (one hop to the connection's thread), what
/// follows it: a cache hit's `saved` nano-dollars in the spend buckets (SPEC §13), or a
/// queued task's queue activation (SPEC §14) and `admission` record. The write lock is
/// held and step 2 found the effect key free in this transaction, so the insert cannot
/// conflict; the unique key refuses it if it somehow did, and the caller rolls back.
async fn insert_task(
    conn: &mut SqliteConnection,
    i: &Insert<'_>,
    saved: i64,
    admission: Option<(&SourceId, String)>,
) -> StoreResult<Task> {
    let new = i.new;
    let (status, output, usage, completed_at, cached_from) = match &i.cached {
        Some(hit) => (
            "succeeded",
            Some(hit.output.as_str()),
            Some(cached_usage()),
            Some(i.now.0),
            Some(hit.id.as_str()),
        ),
        None => ("queued", None, None, None, None),
    };
    let sql = match (&i.cached, &admission) {
        (Some(_), _) if saved > 0 => concat!(task_insert!(), "; ", spend_upserts!()),
        (Some(_), _) => task_insert!(),
        (None, None) => concat!(task_insert!(), "; ", queue_activation!()),
        (None, Some(_)) => concat!(
            task_insert!(),
            "; ",
            queue_activation!(),
            "; ",
            admission_record!()
        ),
    };
    let scoped = new.scope.as_ref();
    let app = new.owner.app();
    let mut query = sqlx::query(sql)
        .bind(i.id.to_string())
        .bind(app.as_str())
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
        .bind(status)
        .bind(cached_from)
        .bind(output)
        .bind(usage)
        .bind(i.now.0)
        .bind(completed_at)
        .bind(i.reservation.as_deref())
        .bind(i64::from(new.dispatch.priority))
        .bind(new.dispatch.key(i.now));
    if i.cached.is_some() {
        if saved > 0 {
            let delta = SpendDelta {
                saved_nano: saved,
                ..SpendDelta::default()
            };
            query = bind_spend(query, app, &i.scope, i.now, delta);
        }
    } else {
        query = query
            .bind(app.as_str())
            .bind(i.scope.as_str())
            .bind(i64::from(new.dispatch.weight))
            .bind(join_credit(new.dispatch.weight))
            .bind(stride(new.dispatch.weight));
        if let Some((source, logical_key)) = admission {
            query = query
                .bind(app.as_str())
                .bind(i.scope.as_str())
                .bind(source.as_str())
                .bind(i.id.to_string())
                .bind(logical_key)
                .bind(i.now.0);
        }
    }
    // The insert's row comes first; the statements after it return none.
    let rows = query.fetch_all(&mut *conn).await?;
    let row = rows
        .first()
        .ok_or_else(|| StoreError::Database("the task insert returned no row".into()))?;
    TaskRow::from_row(row)?.into_task()
}

/// SPEC §4 and §13 under the write lock: gathers the snapshot, asks core's [`decide`]
/// and cost checks (the app's spend last), and on admission stores the buckets, the
/// reservation in the spend buckets and the source's sighting. Returns the reservation
/// as stored. The admission record itself is inserted by the caller once the task row
/// exists.
#[allow(clippy::too_many_arguments)]
async fn admit(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    source: &SourceId,
    logical_key: &str,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<Reservation, Refusal>> {
    let first = window_first_bucket(now);
    let cutoff = now.minus(ADMISSION_WINDOW).0;
    let pruned = sqlx::query(
        "DELETE FROM scope_sources WHERE app = ? AND scope = ? AND last_admitted_at <= ?",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(cutoff)
    .execute(&mut *tx)
    .await?
    .rows_affected() as i64;
    // The scope's spend window is read only under a USD limit, in the same statement
    // (no scope row: never admitted into, so nothing in its buckets counts).
    let state = scope_state(tx, app, scope, budget, first).await?;
    let seen: Option<i64> = sqlx::query_scalar(
        "SELECT 1 FROM scope_sources WHERE app = ? AND scope = ? AND source_id = ? \
         AND last_admitted_at > ?",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.as_str())
    .bind(cutoff)
    .fetch_optional(&mut *tx)
    .await?;
    let steps: SourceStepsRow = sqlx::query_as(
        "SELECT COUNT(DISTINCT logical_key) AS steps, \
         COALESCE(MAX(logical_key = ?), 0) AS counted FROM admissions \
         WHERE app = ? AND scope = ? AND source_id = ? AND admitted_at > ? \
         AND logical_key IS NOT NULL",
    )
    .bind(logical_key)
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.as_str())
    .bind(cutoff)
    .fetch_one(&mut *tx)
    .await?;
    let global_active: i64 = sqlx::query_scalar(
        "SELECT (SELECT admitted FROM global_admission WHERE id = 1) \
         - (SELECT COALESCE(SUM(finished), 0) FROM global_finished)",
    )
    .fetch_one(&mut *tx)
    .await?;
    // docs/budgets.md, "Each app's share of the global capacity": the app's active
    // admitted tasks and the slots all apps hold beyond their shares.
    let (app_active, borrowed): (i64, i64) = sqlx::query_as(
        "SELECT COALESCE((SELECT active FROM app_slots WHERE app = ?), 0), \
         COALESCE((SELECT SUM(MAX(active - share, 0)) FROM app_slots), 0)",
    )
    .bind(app.as_str())
    .fetch_one(&mut *tx)
    .await?;
    let facts = AdmissionFacts {
        app_active,
        borrowed,
        pruned,
        bucket_units: state.bucket_units,
        bucket_at: state.bucket_at,
        sources_in_window: state.sources_in_window,
        active: state.active,
        seen: seen.is_some(),
        steps: steps.steps,
        counted: steps.counted != 0,
        global_active,
        token_units: state.token_units,
        token_at: state.token_at,
        scope_window_nano: state.scope_window_nano,
    };
    let update = match facts.decide(budget, reservation, now) {
        Ok(update) => update,
        Err(refusal) => {
            return Ok(Err(with_spend_retry(
                tx,
                app,
                scope,
                budget,
                reservation,
                refusal,
                now,
            )
            .await?));
        }
    };
    if let Err(refusal) = check_app_spend(tx, app, budget, reservation, now).await? {
        return Ok(Err(refusal));
    }
    let (bucket, sources_delta) = (update.bucket, update.sources_delta);
    let token = update.token_bucket;
    let stored = Reservation {
        from_token_bucket: token.is_some(),
        // docs/budgets.md, "The reservation": each re-ask is checked against these.
        limits: Some(budget.cost),
        ..*reservation
    };
    // Every write of the admission in one query (one hop to the connection's thread):
    // the reservation in the spend buckets, the scope's counters, the source's sighting
    // and the global count.
    let query = sqlx::query(concat!(
        spend_upserts!(),
        "; INSERT INTO scope_state (app, scope, bucket_units, bucket_at, sources_in_window, \
         active, token_units, token_at, token_capacity) \
         VALUES (?, ?, ?, ?, MAX(?, 0), 1, ?, ?, ?) \
         ON CONFLICT (app, scope) DO UPDATE SET bucket_units = excluded.bucket_units, \
         bucket_at = excluded.bucket_at, \
         sources_in_window = scope_state.sources_in_window + ?, \
         active = scope_state.active + 1, \
         token_units = COALESCE(excluded.token_units, scope_state.token_units), \
         token_at = COALESCE(excluded.token_at, scope_state.token_at), \
         token_capacity = COALESCE(excluded.token_capacity, scope_state.token_capacity); \
         INSERT INTO scope_sources (app, scope, source_id, last_admitted_at) \
         VALUES (?, ?, ?, ?) \
         ON CONFLICT (app, scope, source_id) DO UPDATE SET \
         last_admitted_at = MAX(last_admitted_at, excluded.last_admitted_at); \
         INSERT INTO app_slots (app, active, share) VALUES (?, 1, ?) \
         ON CONFLICT (app) DO UPDATE SET active = app_slots.active + 1, \
         share = excluded.share; \
         UPDATE global_admission SET admitted = admitted + 1 WHERE id = 1"
    ));
    bind_spend(query, app, scope, now, SpendDelta::reserve(&stored))
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(bucket.units)
        .bind(bucket.at.0)
        .bind(sources_delta)
        .bind(token.map(|(b, _)| b.units))
        .bind(token.map(|(b, _)| b.at.0))
        .bind(token.map(|(_, capacity)| capacity))
        .bind(sources_delta)
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(source.as_str())
        .bind(now.0)
        .bind(app.as_str())
        .bind(budget.global_share.map_or(0, |s| i64::from(s.share)))
        .execute(&mut *tx)
        .await?;
    Ok(Ok(stored))
}

/// docs/budgets.md, "Tasks without a source": the cost checks of a task without a
/// source under the write lock — SPEC §13's in order (output bound, the scope's spend,
/// the scope's token bucket, the app's spend), none of SPEC §4's — then its reservation
/// in the spend buckets and the token bucket taken. Returns the reservation as stored.
async fn reserve_unsourced(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    cost: &TaskCost,
    now: Timestamp,
) -> StoreResult<Result<Reservation, Refusal>> {
    let (budget, reservation) = (&cost.budget, &cost.reservation);
    let mut token = None;
    if cost.limited() {
        let first = window_first_bucket(now);
        let state = scope_state(tx, app, scope, budget, first).await?;
        let facts = UnsourcedFacts {
            token_units: state.token_units,
            token_at: state.token_at,
            scope_window_nano: state.scope_window_nano,
        };
        token = match facts.decide(budget, reservation, now) {
            Ok(token) => token,
            Err(refusal) => {
                return Ok(Err(with_spend_retry(
                    tx,
                    app,
                    scope,
                    budget,
                    reservation,
                    refusal,
                    now,
                )
                .await?));
            }
        };
        if let Err(refusal) = check_app_spend(tx, app, budget, reservation, now).await? {
            return Ok(Err(refusal));
        }
    }
    let stored = Reservation {
        from_token_bucket: token.is_some(),
        // docs/budgets.md, "The reservation": each re-ask is checked against these.
        limits: Some(budget.cost),
        ..*reservation
    };
    let spend = bind_spend(
        sqlx::query(spend_upserts!()),
        app,
        scope,
        now,
        SpendDelta::reserve(&stored),
    );
    spend.execute(&mut *tx).await?;
    if let Some((bucket, capacity)) = token {
        // The scope's row may not exist yet: a task bucket that was never used is full.
        let tasks = BucketState::full(budget.burst.get(), now);
        sqlx::query(
            "INSERT INTO scope_state (app, scope, bucket_units, bucket_at, token_units, \
             token_at, token_capacity) VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (app, scope) DO UPDATE SET token_units = excluded.token_units, \
             token_at = excluded.token_at, token_capacity = excluded.token_capacity",
        )
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(tasks.units)
        .bind(tasks.at.0)
        .bind(bucket.units)
        .bind(bucket.at.0)
        .bind(capacity)
        .execute(&mut *tx)
        .await?;
    }
    Ok(Ok(stored))
}

/// A scope's counters and its spend window (read only under a scope USD limit), whether
/// or not the scope has a counters row: a task without a source may have reserved in
/// its buckets before any admission.
async fn scope_state(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    budget: &Budget,
    first: i64,
) -> StoreResult<ScopeStateRow> {
    Ok(sqlx::query_as(
        "SELECT s.bucket_units, s.bucket_at, s.sources_in_window, s.active, s.token_units, \
         s.token_at, CASE WHEN ?3 THEN (SELECT COALESCE(SUM(reserved_nano + settled_nano), 0) \
           FROM scope_spend WHERE app = ?1 AND scope = ?2 AND bucket >= ?4) ELSE 0 END \
           AS scope_window_nano \
         FROM (SELECT 1) LEFT JOIN scope_state s ON s.app = ?1 AND s.scope = ?2",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(budget.cost.scope_nano_per_24_hours.is_some())
    .bind(first)
    .fetch_one(&mut *tx)
    .await?)
}

/// A refusal as reported: a scope-spend refusal with when to retry (from the scope's
/// buckets), any other as it is.
async fn with_spend_retry(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: &ScopeId,
    budget: &Budget,
    reservation: &Reservation,
    refusal: Refusal,
    now: Timestamp,
) -> StoreResult<Refusal> {
    let Refusal::Cost(c @ CostRejection::ScopeSpend { .. }) = refusal else {
        return Ok(refusal);
    };
    let buckets = spend_buckets(tx, app, Some(scope), window_first_bucket(now)).await?;
    let wait = budget
        .cost
        .scope_nano_per_24_hours
        .and_then(|l| spend_retry_after(&buckets, reservation.nano_usd, l, now));
    Ok(Refusal::Cost(c.with_retry_after(wait)))
}

/// SPEC §13's last check: the app's spend, for an app with a limit (under the write lock).
async fn check_app_spend(
    tx: &mut SqliteConnection,
    app: &AppId,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
) -> StoreResult<Result<(), Refusal>> {
    let Some(limit) = budget.cost.app_nano_per_24_hours else {
        return Ok(Ok(()));
    };
    let first = window_first_bucket(now);
    let window = window_sum(tx, app, None, first).await?;
    if let Err(c) = decide_app_spend(&budget.cost, reservation, window) {
        let buckets = spend_buckets(tx, app, None, first).await?;
        let wait = spend_retry_after(&buckets, reservation.nano_usd, limit, now);
        return Ok(Err(Refusal::Cost(c.with_retry_after(wait))));
    }
    Ok(Ok(()))
}

/// SPEC §13: settled + reserved nano-dollars of a scope's (or, `None`, the app's) window.
async fn window_sum(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: Option<&ScopeId>,
    first: i64,
) -> StoreResult<i64> {
    let sum: i64 = match scope {
        Some(scope) => {
            sqlx::query_scalar(
                "SELECT COALESCE(SUM(reserved_nano + settled_nano), 0) FROM scope_spend \
                 WHERE app = ? AND scope = ? AND bucket >= ?",
            )
            .bind(app.as_str())
            .bind(scope.as_str())
            .bind(first)
            .fetch_one(&mut *tx)
            .await?
        }
        None => {
            sqlx::query_scalar(
                "SELECT COALESCE(SUM(reserved_nano + settled_nano), 0) FROM app_spend \
                 WHERE app = ? AND bucket >= ?",
            )
            .bind(app.as_str())
            .bind(first)
            .fetch_one(&mut *tx)
            .await?
        }
    };
    Ok(sum)
}

/// A window's buckets `(bucket, settled + reserved)` of a scope or (`None`) the app.
async fn spend_buckets(
    tx: &mut SqliteConnection,
    app: &AppId,
    scope: Option<&ScopeId>,
    first: i64,
) -> StoreResult<Vec<(i64, i64)>> {
    let rows: Vec<(i64, i64)> = match scope {
        Some(scope) => {
            sqlx::query_as(
                "SELECT bucket, reserved_nano + settled_nano FROM scope_spend \
                 WHERE app = ? AND scope = ? AND bucket >= ?",
            )
            .bind(app.as_str())
            .bind(scope.as_str())
            .bind(first)
            .fetch_all(&mut *tx)
            .await?
        }
        None => {
            sqlx::query_as(
                "SELECT bucket, SUM(reserved_nano + settled_nano) FROM app_spend \
                 WHERE app = ? AND bucket >= ? GROUP BY bucket",
            )
            .bind(app.as_str())
            .bind(first)
            .fetch_all(&mut *tx)
            .await?
        }
    };
    Ok(rows)
}

/// Binds [`spend_upserts`]'s arguments onto `query`. A query of several statements runs
/// in one hop to the connection's thread, its positional arguments taken in order across
/// them.
fn bind_spend<'q>(
    query: SqliteQuery<'q>,
    app: &'q AppId,
    scope: &'q ScopeId,
    at: Timestamp,
    d: SpendDelta,
) -> SqliteQuery<'q> {
    let bucket = spend_bucket(at);
    query
        .bind(app.as_str())
        .bind(scope.as_str())
        .bind(bucket)
        .bind(d.reserved_nano)
        .bind(d.reserved_tokens)
        .bind(d.saved_nano)
        .bind(app.as_str())
        .bind(bucket)
        .bind(app_spend_stripe(scope.as_str()))
        .bind(d.reserved_nano)
        .bind(d.reserved_tokens)
        .bind(d.saved_nano)
}

/// A query on SQLite with its arguments.
type SqliteQuery<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments>;

/// A scope's counters row (`None`s: no row yet) and its spend window.
#[derive(sqlx::FromRow)]
struct ScopeStateRow {
    bucket_units: Option<i64>,
    bucket_at: Option<i64>,
    sources_in_window: Option<i64>,
    active: Option<i64>,
    token_units: Option<i64>,
    token_at: Option<i64>,
    scope_window_nano: i64,
}

/// A source's distinct steps within the window, and whether this logical key is one.
#[derive(sqlx::FromRow)]
struct SourceStepsRow {
    steps: i64,
    counted: i64,
}
