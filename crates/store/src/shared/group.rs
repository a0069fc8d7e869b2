//! Creations made together (docs/locking.md, "Creations made together"): creations that
//! an instance is asked for while another of the same group is in flight wait, and are
//! then made in ONE transaction, by a task of their own. Which creations group, and
//! what "together" means, is the backend's ([`Grouping`]): on PostgreSQL, one scope's
//! tasks without a source under a USD or token limit (one hold of the scope's lock); on
//! SQLite, every single creation (one write transaction, one commit, for the writer all
//! of them wait for anyway).
//!
//! The first creation of a group with none in flight runs alone, as it would without
//! grouping, and leads: the creations that arrive while it runs wait in the group, and
//! when it ends (or its caller goes away) the waiting ones are made together in a task
//! of their own, whose end hands over to the next ones in the same way. A creation
//! whose effect key a group finds taken runs alone (answered as the replay it is) and
//! the rest are tried together again; a group whose transaction fails runs each alone.
//! Either way the answers are exactly those of creations made one at a time.

use crate::{Created, StoreError, StoreResult};
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::oneshot;
use tollgate_core::NewTask;

/// The most creations one group's transaction takes; the rest wait for the next.
const MOST_TOGETHER: usize = 64;

/// What a group is known by (PostgreSQL: app and scope; SQLite: one for all).
pub(crate) type GroupKey = (String, String);

/// A backend's creations made together.
#[async_trait::async_trait]
pub(crate) trait Grouping: Clone + Send + Sync + 'static {
    /// This instance's groups.
    fn groups(&self) -> &Groups;

    /// One creation in transactions of its own, as without grouping.
    async fn alone(&self, new: NewTask) -> StoreResult<Created>;

    /// Several creations of one group in one transaction, in order, or nothing written
    /// when an effect key is found taken ([`Together::Taken`]). An `Err` wrote nothing.
    async fn together(&self, news: &[&NewTask]) -> StoreResult<Together>;
}

/// What [`Grouping::together`] did.
pub(crate) enum Together {
    /// Each creation's answer, in order.
    Created(Vec<StoreResult<Created>>),
    /// The effect key of the creation at this index was taken (before, or by an earlier
    /// creation of the group): nothing was written.
    Taken(usize),
}

/// The groups with a creation in flight on this instance, each with the creations
/// waiting for it (a group is listed while one leads, so an empty list means "leading,
/// none waiting").
#[derive(Debug, Default)]
pub(crate) struct Groups {
    waiting: Mutex<HashMap<GroupKey, Vec<Waiting>>>,
    /// How many creations were made in a group of two or more (for tests and
    /// diagnostics).
    together: AtomicU64,
}

impl Groups {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<GroupKey, Vec<Waiting>>> {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many creations this instance made together with others.
    pub(crate) fn together(&self) -> u64 {
        self.together.load(Ordering::Relaxed)
    }
}

/// A creation waiting for its group.
#[derive(Debug)]
struct Waiting {
    new: NewTask,
    answer: oneshot::Sender<StoreResult<Created>>,
}

/// Creates `new` alone when nothing of its group is in flight on this instance,
/// otherwise together with the others waiting then.
pub(crate) async fn create<S: Grouping>(
    store: &S,
    key: GroupKey,
    new: NewTask,
) -> StoreResult<Created> {
    let waiting = {
        let mut groups = store.groups().waiting();
        match groups.get_mut(&key) {
            Some(waiting) => {
                let (answer, answered) = oneshot::channel();
                waiting.push(Waiting { new, answer });
                Err(answered)
            }
            None => {
                groups.insert(key.clone(), Vec::new());
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
            store.alone(new).await
        }
        Err(answered) => answered.await.unwrap_or_else(|_| {
            Err(StoreError::Unavailable(
                "the creation's group ended before it was created; retry".into(),
            ))
        }),
    }
}

/// The creation (or group) in flight of a group. When it ends, however it ends (its
/// caller may drop it), the creations that waited meanwhile are made together in a task
/// of their own, which leads in turn; with none waiting the group is no longer in
/// flight.
struct Lead<S: Grouping> {
    store: S,
    key: GroupKey,
}

impl<S: Grouping> Drop for Lead<S> {
    fn drop(&mut self) {
        let next = {
            let mut groups = self.store.groups().waiting();
            let Some(waiting) = groups.get_mut(&self.key) else {
                return;
            };
            if waiting.is_empty() {
                groups.remove(&self.key);
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
        // their callers are told to retry, and `lead` ends the group's flight.
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
async fn create_waiting<S: Grouping>(store: &S, mut waiting: Vec<Waiting>) {
    while waiting.len() > 1 {
        let news: Vec<&NewTask> = waiting.iter().map(|w| &w.new).collect();
        match store.together(&news).await {
            Ok(Together::Created(answers)) => {
                store
                    .groups()
                    .together
                    .fetch_add(answers.len() as u64, Ordering::Relaxed);
                for (w, answer) in waiting.into_iter().zip(answers) {
                    // A caller that went away no longer listens.
                    let _ = w.answer.send(answer);
                }
                return;
            }
            Ok(Together::Taken(n)) if n < waiting.len() => {
                let w = waiting.remove(n);
                let answer = store.alone(w.new).await;
                let _ = w.answer.send(answer);
            }
            Ok(Together::Taken(_)) | Err(_) => break,
        }
    }
    for w in waiting {
        let answer = store.alone(w.new).await;
        let _ = w.answer.send(answer);
    }
}
