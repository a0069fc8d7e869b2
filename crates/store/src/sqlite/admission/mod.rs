//! docs/conformance.md#creating-a-task, docs/conformance.md#admission on SQLite: task creation with idempotency, owner check, cache and
//! admission in one `BEGIN IMMEDIATE` transaction.
//!
//! Admission reads only what it needs, each bounded independently of the 24 h window's
//! size: the scope's row in `scope_state` (token bucket and distinct-source count),
//! one primary-key probe of `scope_sources`, the admission records of this one source,
//! and the partial index of active admitted tasks (at most the concurrency caps).
//! Expired sources of the scope are pruned on the way, each row once (amortized O(1)).
//!
//! Split along the steps: this module runs the creation (docs/conformance.md#create-transaction, batches)
//! and reads what it decides on (idempotency, owner, cache); [`snapshot`] reads the
//! admission facts, asks core and writes the admission; [`insert`] writes the task and
//! what follows it in one query.

mod insert;
mod snapshot;

use super::SqliteStore;
use crate::shared::admission::{InsertRow, model_columns};
use crate::shared::cost::encode_reservation;
use crate::shared::group::{Grouping, Groups, Together};
use crate::shared::rows::{CacheHitRow, TaskRow, task_columns};
use crate::{Created, StoreError, StoreResult};
use insert::insert_task;
use snapshot::{admit, reserve_unsourced};
use sqlx::SqliteConnection;
use tollgate_core::{
    AppId, ConfigHash, NewTask, Owner, RunState, ScopeId, Subject, TaskId, Timestamp, cache_key,
};

/// A single creation, made together with the others that wait for the writer while one
/// is in flight (docs/locking.md, "Creations made together": one write transaction and
/// one commit for all of them).
pub(super) async fn create_task(store: &SqliteStore, new: NewTask) -> StoreResult<Created> {
    crate::shared::group::create(store, (String::new(), String::new()), new).await
}

#[async_trait::async_trait]
impl Grouping for SqliteStore {
    fn groups(&self) -> &Groups {
        &self.groups
    }

    async fn alone(&self, new: NewTask) -> StoreResult<Created> {
        let mut tx = self.begin().await?;
        let now = self.now();
        match create_in(&mut tx, &new, now).await {
            Ok(created) => {
                tx.commit().await?;
                Ok(self.claimed(&new, created))
            }
            Err(e) => {
                tx.rollback().await?;
                Err(e)
            }
        }
    }

    /// As a batch ([`create_tasks`]): a replay in the group is answered in its place.
    async fn together(&self, news: &[&NewTask]) -> StoreResult<Together> {
        in_one_transaction(self, news).await.map(Together::Created)
    }
}

/// Many creations in ONE write transaction, each item in its own savepoint: an item
/// refused for its own reasons (invalid, admission, owner) is rolled back alone and
/// reported in its place; a database failure fails the whole batch with nothing written.
pub(super) async fn create_tasks(
    store: &SqliteStore,
    news: Vec<NewTask>,
) -> StoreResult<Vec<StoreResult<Created>>> {
    let news: Vec<&NewTask> = news.iter().collect();
    in_one_transaction(store, &news).await
}

/// [`create_tasks`] of borrowed creations.
async fn in_one_transaction(
    store: &SqliteStore,
    news: &[&NewTask],
) -> StoreResult<Vec<StoreResult<Created>>> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let mut out = Vec::with_capacity(news.len());
    for new in news {
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
    Ok(out
        .into_iter()
        .zip(news)
        .map(|(result, new)| result.map(|c| store.claimed(new, c)))
        .collect())
}

impl SqliteStore {
    /// After the commit: see [`QueueView::owe_creation_claim`](crate::shared::dispatch::QueueView::owe_creation_claim).
    fn claimed(&self, new: &NewTask, created: Created) -> Created {
        if created.created {
            self.queue_view.owe_creation_claim(new, &created.task);
        }
        created
    }
}

/// docs/conformance.md#create-transaction on a connection inside a `BEGIN IMMEDIATE` transaction (or a
/// savepoint of one). The caller commits on `Ok` and rolls back on `Err`.
async fn create_in(
    conn: &mut SqliteConnection,
    new: &NewTask,
    now: Timestamp,
) -> StoreResult<Created> {
    let (config_hash, model_ref) = model_columns(new)?;
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
        // An unscoped task with nothing to check (no source, no reservation) decides
        // nothing before its insert: a taken key inserts nothing there (`ON CONFLICT`),
        // and only then is the task of the key read (a hop fewer for every new one).
        Owner::Application { scope, subject, .. } if new.scope.is_none() && new.cost.is_none() => {
            (None, scope.clone(), subject.clone(), None, None)
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
    let owner = (run_id, scope, subject);
    let mut insert = InsertRow::new(id, new, owner, (config_hash.0.clone(), model_ref), now);

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
        insert.cache_key = Some(key.clone());
        if let Some(hit) = hit {
            insert.cached_from = Some(hit.id);
            insert.cached_output = Some(hit.output);
            insert.saved_nano = hit.charged_nano.unwrap_or(0);
        } else {
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
    let Some(task) = insert_task(conn, &insert, admission).await? else {
        // The key was taken: only an unchecked creation gets here (the others read it
        // first, under the same write lock).
        return match by_effect_key(conn, &app, new.effect_key.as_str()).await? {
            Some(task) => Ok(Created::existing(task)),
            None => Err(StoreError::Database(
                "the task insert returned no row".into(),
            )),
        };
    };
    if insert.cached_from.is_some() {
        // docs/webhooks.md, "The outbox": a cache hit is created succeeded.
        crate::shared::webhooks::record_task_events(conn, &[id.to_string()], now).await?;
    }
    Ok(Created::inserted(task).saving(insert.saved_nano))
}

/// docs/conformance.md#create-cache's key of a scoped task (`None` for an unscoped one).
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

/// docs/conformance.md#create-idempotency, docs/conformance.md#create-cache in one statement: whether `new`'s effect key is taken in its
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
