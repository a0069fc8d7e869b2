//! Creations of one scope together (docs/locking.md, "Creations of one scope together"):
//! the tasks without a source under a USD or token limit (every OpenAI door call under
//! a metered policy) that one instance is asked to create in the same scope while one of
//! them holds that scope's lock are created by ONE transaction: the lock taken and the
//! facts read once, core asked about each in turn on the facts as the ones before it
//! left them ([`UnsourcedFacts::after`]), each row written by the single creation's
//! statement, one commit. Same-scope calls then share one hold of the lock instead of
//! taking it one after another, each for its reads, its insert and its commit.
//!
//! The first creation of a scope with none in flight runs alone, as before, and leads:
//! the creations that arrive while it runs wait in the scope's group, and when it ends
//! (or its caller goes away) the waiting ones are created together in a task of their
//! own, whose end hands over to the next group in the same way. A group that meets a
//! taken effect key (a replay, or two calls of one key) is rolled back, that creation
//! runs alone (answered as the replay it is) and the rest are tried together again; a
//! group whose transaction fails is rolled back and its creations run alone, one by
//! one. Either way the answers are exactly the single path's.

use super::super::PostgresStore;
use super::insert::{InsertRow, insert_reserved};
use super::probe::{Asked, Facts, ReadsLock, reads, scope_lock_key};
use super::snapshot::check_unsourced;
use super::{create_alone, encode_reservation};
use crate::shared::admission::{Refusal, UnsourcedFacts, stored_reservation};
use crate::shared::cost::SpendDelta;
use crate::shared::tasks::Tasks;
use crate::{Created, StoreError, StoreResult};
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::sync::oneshot;
use tollgate_core::{NewTask, Owner, Task, TaskCost, TaskId, Timestamp};

/// The most creations one group's transaction takes; the rest wait for the next.
const MOST_TOGETHER: usize = 64;

/// The scopes with a creation in flight on this instance, each with the creations
/// waiting for it (a scope is listed while one leads, so an empty list means "leading,
/// none waiting").
#[derive(Debug, Default)]
pub(in crate::postgres) struct Groups {
    scopes: Mutex<HashMap<(String, String), Vec<Waiting>>>,
    /// How many creations were created in a group of two or more (for tests and
    /// diagnostics).
    together: std::sync::atomic::AtomicU64,
}

impl Groups {
    fn scopes(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Vec<Waiting>>> {
        self.scopes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many creations this instance made together with others of their scope.
    pub(in crate::postgres) fn together(&self) -> u64 {
        self.together.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// A creation waiting for its scope's group.
#[derive(Debug)]
struct Waiting {
    new: NewTask,
    answer: oneshot::Sender<StoreResult<Created>>,
}

/// Whether a creation may be made together with others of its scope: an application's
/// task without a source under a USD or token limit (its whole decision is
/// [`UnsourcedFacts`] and the app's spend).
pub(super) fn groups(new: &NewTask) -> bool {
    new.scope.is_none()
        && matches!(new.owner, Owner::Application { .. })
        && new.cost.as_ref().is_some_and(TaskCost::limited)
}

/// Creates `new` ([`groups`] holds) alone when nothing of its scope is in flight on this
/// instance, otherwise together with the others waiting then.
pub(super) async fn create(store: &PostgresStore, new: NewTask) -> StoreResult<Created> {
    let Owner::Application { app, scope, .. } = &new.owner else {
        return create_alone(store, new).await;
    };
    let key = (app.to_string(), scope.to_string());
    let waiting = {
        let mut scopes = store.groups.scopes();
        match scopes.get_mut(&key) {
            Some(waiting) => {
                let (answer, answered) = oneshot::channel();
                waiting.push(Waiting { new, answer });
                Err(answered)
            }
            None => {
                scopes.insert(key.clone(), Vec::new());
                Ok(new)
            }
        }
    };
    match waiting {
        Ok(new) => {
            let _lead = Lead {
                store: store.clone(),
                key,
            };
            create_alone(store, new).await
        }
        Err(answered) => answered.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the creation's group ended before it was created; retry".into(),
            ))
        }),
    }
}

/// The creation (or group) in flight of a scope. When it ends, however it ends (its
/// caller may drop it), the creations that waited meanwhile are created together in a
/// task of their own, which leads in turn; with none waiting the scope is no longer in
/// flight.
struct Lead {
    store: PostgresStore,
    key: (String, String),
}

impl Drop for Lead {
    fn drop(&mut self) {
        let next = {
            let mut scopes = self.store.groups.scopes();
            let Some(waiting) = scopes.get_mut(&self.key) else {
                return;
            };
            if waiting.is_empty() {
                scopes.remove(&self.key);
                return;
            }
            let n = waiting.len().min(MOST_TOGETHER);
            waiting.drain(..n).collect::<Vec<Waiting>>()
        };
        let lead = Lead {
            store: self.store.clone(),
            key: self.key.clone(),
        };
        // Without a runtime (it is shutting down) the waiting creations are dropped:
        // their callers are told to retry, and `lead` ends the scope's flight.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                create_waiting(&lead.store, next).await;
                drop(lead);
            });
        }
    }
}

/// Answers each waiting creation: together when there are several. A creation whose
/// effect key is found taken runs alone (it is answered as a replay) and the rest are
/// tried together again; when a group's transaction fails, each runs alone.
async fn create_waiting(store: &PostgresStore, mut waiting: Vec<Waiting>) {
    while waiting.len() > 1 {
        let news: Vec<&NewTask> = waiting.iter().map(|w| &w.new).collect();
        match create_together(store, &news).await {
            Ok(Together::Created(answers)) => {
                store
                    .groups
                    .together
                    .fetch_add(answers.len() as u64, std::sync::atomic::Ordering::Relaxed);
                for (w, answer) in waiting.into_iter().zip(answers) {
                    // A caller that went away no longer listens.
                    let _ = w.answer.send(answer);
                }
                return;
            }
            Ok(Together::Taken(n)) => {
                let w = waiting.remove(n);
                let answer = create_alone(store, w.new).await;
                let _ = w.answer.send(answer);
            }
            Err(_) => break,
        }
    }
    for w in waiting {
        let answer = create_alone(store, w.new).await;
        let _ = w.answer.send(answer);
    }
}

/// What [`create_together`] did.
enum Together {
    /// Each creation's answer, in order.
    Created(Vec<StoreResult<Created>>),
    /// The effect key of the creation at this index was taken (before, or by an earlier
    /// call of the group): nothing was written.
    Taken(usize),
}

/// One item of a group after its decision.
enum Decided {
    Created(Box<Task>),
    Refused(Refusal),
    /// Its own refusal before anything was read (its model configuration).
    Invalid(StoreError),
}

/// Creates a group of one scope's creations ([`groups`] holds for each) in one
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
        let config_hash = match new.model_ref.config_hash() {
            Ok(hash) => hash,
            Err(e) => {
                decided.push(Decided::Invalid(e.into()));
                continue;
            }
        };
        let model_ref = serde_json::to_string(&new.model_ref)
            .map_err(|e| StoreError::Database(format!("cannot encode model ref: {e}")))?;
        let (budget, reservation) = (&cost.budget, &cost.reservation);
        let token =
            match check_unsourced(&mut tx, app, scope, &facts, budget, reservation, now).await? {
                Ok(token) => token,
                Err(refusal) => {
                    decided.push(Decided::Refused(refusal));
                    continue;
                }
            };
        let owner = (None, scope.clone(), subject.clone());
        let mut row = InsertRow::new(
            TaskId::generate(),
            new,
            owner,
            (config_hash.0, model_ref),
            now,
        );
        let stored = stored_reservation(reservation, budget, token.is_some());
        row.reservation = Some(encode_reservation(&stored)?);
        let reserve = SpendDelta::reserve(&stored);
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
