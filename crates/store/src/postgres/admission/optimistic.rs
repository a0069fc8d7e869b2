//! A lone creation in one statement (docs/locking.md, "A creation in one statement"): an
//! application's task without a source under a USD or token limit (an OpenAI door call
//! under a metered policy) that no other creation of its scope on this instance is in
//! flight with ([`super::group`]'s leader), created without a transaction of its own.
//!
//! Its scope's cost facts are read without the scope's lock (one plain autocommit
//! statement, [`super::probe::cost_reads`]), core decides on them, and the task and its
//! reservation are written by the locked path's statement behind a guard
//! (`tollgate_cost_facts_hold`, migration 0030): the scope's lock taken inside the
//! statement, the facts read again after it was granted, nothing written unless they
//! are the ones decided on. Two round trips instead of four
//! (`BEGIN`, the reads, the insert, `COMMIT`), and the scope's lock held only for the
//! statement's own work. Whenever this path cannot decide — the facts changed, core
//! refused (a refusal is judged under the lock, with its retry time), the app has a
//! spend limit (checked under the app's lock) — the creation runs the locked path.
//!
//! A lone scoped creation of an application (docs/locking.md, "A scoped creation in one
//! statement", migration 0031) takes the same shape: one plain read
//! ([`super::probe::scoped_reads`]: the key, the newest cache hit, the scope's admission
//! facts), then its cache hit in one statement of its own, or its admission by the
//! locked path's statement behind `tollgate_admission_facts_hold`, on the fast slot
//! path only.

use super::super::PostgresStore;
use super::by_effect_key;
use super::insert::{
    AdmissionRecord, InsertRow, SeenAdmission, guarded_admit, guarded_reserve,
    hit_in_one_statement, unsourced_row,
};
use super::probe::{cost_reads, scope_lock_key, scoped_reads};
use crate::shared::admission::model_columns;
use crate::{Created, StoreResult};
use std::sync::atomic::{AtomicU64, Ordering};
use tollgate_core::{
    AppId, NewTask, Owner, ScopeId, Subject, TaskCost, TaskId, TaskScope, Timestamp, cache_key,
};

/// Creates `new` in one statement, or `None` when this path does not decide it (nothing
/// written; the caller runs the locked path).
pub(super) async fn create(store: &PostgresStore, new: &NewTask) -> StoreResult<Option<Created>> {
    let Owner::Application {
        app,
        scope,
        subject,
    } = &new.owner
    else {
        return Ok(None);
    };
    let owner = (app, scope, subject.as_ref());
    let kind = match (&new.scope, &new.cost) {
        (Some(scoped), _)
            if new.claim_by.is_none() && scoped.budget.cost.app_nano_per_24_hours.is_none() =>
        {
            Kind::Scoped(scoped)
        }
        (None, Some(cost))
            if cost.limited() && cost.budget.cost.app_nano_per_24_hours.is_none() =>
        {
            Kind::Metered(cost)
        }
        _ => return Ok(None),
    };
    let mut lone = store.hot.lone().await?;
    let created = match kind {
        Kind::Scoped(scoped) => admit_and_write(store, lone.conn(), new, owner, scoped).await,
        Kind::Metered(cost) => decide_and_write(store, lone.conn(), new, owner, cost).await,
    };
    lone.done(&created);
    created
}

/// The creations [`create`] makes in one statement.
enum Kind<'a> {
    /// An application's scoped task: its admission or its cache hit.
    Scoped(&'a TaskScope),
    /// An application's task without a source under a USD or token limit.
    Metered(&'a TaskCost),
}

/// [`create`]'s two statements on `conn` for a scoped task `new` of `owner` (app, scope,
/// subject): its reads, then its cache hit ([`hit_in_one_statement`]) or its admission
/// ([`guarded_admit`]) when core admits it on the facts read and none of the scope's
/// sightings expired (the locked path prunes those).
async fn admit_and_write(
    store: &PostgresStore,
    conn: &mut sqlx::PgConnection,
    new: &NewTask,
    (app, scope, subject): (&AppId, &ScopeId, Option<&Subject>),
    scoped: &TaskScope,
) -> StoreResult<Option<Created>> {
    let (config_hash, model_ref) = model_columns(new)?;
    let id = TaskId::generate();
    let key = cache_key(
        &scoped.source_id,
        &scoped.source_revision,
        &new.request,
        &config_hash,
        subject,
    );
    // The logical step: the cache key, or for a recomputation the task's own id (and no
    // hit is looked for).
    let (logical_key, probe) = if scoped.recompute {
        (id.to_string(), None)
    } else {
        (key.clone(), Some(key.as_str()))
    };
    let step = (&scoped.source_id, logical_key.as_str());
    let read = scoped_reads(store, conn, (app, scope), new, step, probe).await?;
    if read.read.taken {
        // A replay; its task gone meanwhile (owner deletion): the locked path.
        // Read on this connection: taking a second one from the pool while holding
        // this one can wait for ever when every connection is held so.
        return Ok(by_effect_key(conn, app, new.effect_key.as_str())
            .await?
            .map(Created::existing));
    }
    let now = Timestamp(read.read.now);
    let owner = (None, scope.clone(), subject.cloned());
    let mut row = InsertRow::new(id, new, owner, (config_hash.0, model_ref), now);
    row.cache_key = Some(key);
    let lock = scope_lock_key(app, scope);
    if let (Some(from), Some(output)) = (&read.read.hit_id, &read.read.hit_output) {
        row.cached_from = Some(from.clone());
        row.cached_output = Some(output.clone());
        row.saved_nano = read.read.hit_charged_nano.unwrap_or(0);
        let made = hit_in_one_statement(conn, &row, lock).await?;
        store.one_statement.count(made.is_some());
        return Ok(made);
    }
    let Some(facts) = read.facts()? else {
        return Ok(None);
    };
    if read.read.expired != Some(0) {
        return Ok(None);
    }
    let Ok(update) = facts.decide(&scoped.budget, &scoped.reservation, now) else {
        return Ok(None);
    };
    let record = AdmissionRecord::admitted(&mut row, scoped, &logical_key, update)?;
    let seen = SeenAdmission {
        lock,
        facts: &facts,
    };
    let made = guarded_admit(store, conn, &row, seen, &record).await?;
    store.one_statement.count(made.is_some());
    Ok(made)
}

/// [`create`]'s two statements on `conn`, for `new` of `owner` (app, scope, subject)
/// under `cost`.
async fn decide_and_write(
    store: &PostgresStore,
    conn: &mut sqlx::PgConnection,
    new: &NewTask,
    (app, scope, subject): (&AppId, &ScopeId, Option<&Subject>),
    cost: &TaskCost,
) -> StoreResult<Option<Created>> {
    let (config_hash, model_ref) = model_columns(new)?;
    let read = cost_reads(store, conn, app, new, scope).await?;
    if read.taken {
        // A replay; its task gone meanwhile (owner deletion): the locked path.
        // Read on this connection: taking a second one from the pool while holding
        // this one can wait for ever when every connection is held so.
        return Ok(by_effect_key(conn, app, new.effect_key.as_str())
            .await?
            .map(Created::existing));
    }
    let now = Timestamp(read.now);
    let facts = read.facts;
    let (budget, reservation) = (&cost.budget, &cost.reservation);
    let Ok(token) = facts.decide(budget, reservation, now) else {
        return Ok(None);
    };
    let (row, reserve) = unsourced_row(
        new,
        (scope, subject),
        (config_hash.0, model_ref),
        now,
        cost,
        token.is_some(),
    )?;
    let lock = scope_lock_key(app, scope);
    let made = guarded_reserve(store, conn, &row, (lock, &facts), budget, token, reserve).await?;
    store.one_statement.count(made.is_some());
    Ok(made)
}

/// What [`create`] did on an instance (for diagnostics and tests).
#[derive(Debug, Default)]
pub(in crate::postgres) struct OneStatement {
    made: AtomicU64,
    changed: AtomicU64,
}

impl OneStatement {
    fn count(&self, made: bool) {
        let counter = if made { &self.made } else { &self.changed };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Creations made in one statement, and those that found their facts changed.
    pub(in crate::postgres) fn counts(&self) -> (u64, u64) {
        (
            self.made.load(Ordering::Relaxed),
            self.changed.load(Ordering::Relaxed),
        )
    }
}
