//! Creations of one scope together on PostgreSQL (docs/locking.md, "Creations made
//! together"): the tasks without a source under a USD or token limit (every OpenAI door
//! call under a metered policy) that one instance is asked to create in the same scope
//! while one of them is in flight are created by ONE transaction ([`crate::shared::group`]
//! runs the waiting and the hand-over): the scope's lock taken and the facts read once,
//! core asked about each in turn on the facts as the ones before it left them
//! ([`UnsourcedFacts::after`]), each row written by the single creation's statement, one
//! commit. Same-scope calls then share one hold of the lock instead of taking it one
//! after another, each for its reads, its insert and its commit.

use super::super::PostgresStore;
use super::create_alone;
use super::insert::{insert_reserved, unsourced_row};
use super::probe::{Asked, Facts, ReadsLock, reads, scope_lock_key};
use super::snapshot::check_unsourced;
use crate::shared::admission::{Refusal, UnsourcedFacts, model_columns};
use crate::shared::group::{GroupKey, Grouping, Groups, Together};
use crate::shared::tasks::Tasks;
use crate::{Created, StoreError, StoreResult};
use tollgate_core::{NewTask, Owner, Task, TaskCost, Timestamp};

/// The group of a creation that may be made together with others of its scope: an
/// application's task without a source under a USD or token limit (its whole decision is
/// [`UnsourcedFacts`] and the app's spend); `None` for any other.
pub(super) fn group_of(new: &NewTask) -> Option<GroupKey> {
    match &new.owner {
        Owner::Application { app, scope, .. }
            if new.scope.is_none() && new.cost.as_ref().is_some_and(TaskCost::limited) =>
        {
            Some((app.to_string(), scope.to_string()))
        }
        _ => None,
    }
}

#[async_trait::async_trait]
impl Grouping for PostgresStore {
    fn groups(&self) -> &Groups {
        &self.groups
    }

    async fn alone(&self, new: NewTask) -> StoreResult<Created> {
        create_alone(self, new).await
    }

    async fn together(&self, news: &[&NewTask]) -> StoreResult<Together> {
        create_together(self, news).await
    }
}

/// One item of a group after its decision.
enum Decided {
    Created(Box<Task>),
    Refused(Refusal),
    /// Its own refusal before anything was read (its model configuration).
    Invalid(StoreError),
}

/// Creates a group of one scope's creations ([`group_of`] names it) in one
/// transaction, or writes nothing when an effect key is taken ([`Together::Taken`]).
async fn create_together(store: &PostgresStore, news: &[&NewTask]) -> StoreResult<Together> {
    let Some(first) = news.first() else {
        return Ok(Together::Created(Vec::new()));
    };
    let Owner::Application { app, scope, .. } = &first.owner else {
        return Err(StoreError::Database(
            "a grouped creation without an application owner".into(),
        ));
    };
    let mut tx = store.begin().await?;
    // The lock, "now" and the facts, read once; the key looked up is the first's (a
    // taken one sends the group to the single path; the others' are found by their
    // inserts).
    let asked = Asked {
        app,
        new: first,
        scope,
        cache_key: None,
        probe_cache: false,
        facts: Facts::Cost,
    };
    let lock = ReadsLock {
        lock: Some((scope_lock_key(app, scope), true)),
        replay_first: false,
    };
    let read = reads(store, &mut tx, &asked, &lock).await?;
    if read.probe.taken {
        tx.rollback().await?;
        return Ok(Together::Taken(0));
    }
    let now = Timestamp(read.probe.now);
    let mut facts: UnsourcedFacts = read.facts()?;
    let mut decided = Vec::with_capacity(news.len());
    for (n, new) in news.iter().enumerate() {
        let (Owner::Application { subject, .. }, Some(cost)) = (&new.owner, &new.cost) else {
            return Err(StoreError::Database(
                "a grouped creation without an application owner or a cost".into(),
            ));
        };
        let (config_hash, model_ref) = match model_columns(new) {
            Ok(columns) => columns,
            Err(e) => {
                decided.push(Decided::Invalid(e));
                continue;
            }
        };
        let (budget, reservation) = (&cost.budget, &cost.reservation);
        let token =
            match check_unsourced(&mut tx, app, scope, &facts, budget, reservation, now).await? {
                Ok(token) => token,
                Err(refusal) => {
                    decided.push(Decided::Refused(refusal));
                    continue;
                }
            };
        let (row, reserve) = unsourced_row(
            new,
            (scope, subject.as_ref()),
            (config_hash.0, model_ref),
            now,
            cost,
            token.is_some(),
        )?;
        let Some(task) = insert_reserved(&mut tx, &row, budget, token, reserve).await? else {
            tx.rollback().await?;
            return Ok(Together::Taken(n));
        };
        facts.after(token, &reserve);
        decided.push(Decided::Created(Box::new(task)));
    }
    tx.commit().await?;
    let mut answers = Vec::with_capacity(news.len());
    for (new, decided) in news.iter().zip(decided) {
        answers.push(match decided {
            Decided::Created(task) => {
                store.queue_view.owe_creation_claim(new, &task);
                Ok(Created::inserted(*task))
            }
            // A replay is never judged by admission: a refused key that names a task
            // by now is answered with it.
            // (Committed by now: a failed read fails this answer alone.)
            Decided::Refused(refusal) => {
                match Tasks::get_task_by_effect_key(store, app, &new.effect_key).await {
                    Ok(Some(task)) => Ok(Created::existing(task)),
                    Ok(None) => Err(refusal.into()),
                    Err(e) => Err(e),
                }
            }
            Decided::Invalid(e) => Err(e),
        });
    }
    Ok(Together::Created(answers))
}
