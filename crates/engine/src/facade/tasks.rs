//! Tasks by id or effect key: get, wait, cancel, release, unreleased sources, deletion (docs/conformance.md#lifecycle, docs/conformance.md#application-tasks).

use crate::error::EngineError;
use crate::notify::{Event, FinishedTask};
use crate::watch::{Seen, WaitSlot};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::TryRecvError;
use tokio::time::Instant;
use tollgate_core::{AppId, Attempt, EffectKey, ScopeId, SourceId, Task, TaskId};
use tollgate_store::{UnreleasedPage, UnreleasedQuery};

use super::*;

impl Tollgate {
    /// A task of the app by id (`None`: no such task in this app).
    pub async fn get(&self, app: &AppId, id: TaskId) -> Result<Option<Task>, EngineError> {
        Ok(self.inner.store.get_task(app, id).await?)
    }

    /// The attempts of a task of the app, in order (docs/routes.md, "Attempts"; none for
    /// another app's task or one that never started).
    pub async fn attempts(&self, app: &AppId, id: TaskId) -> Result<Vec<Attempt>, EngineError> {
        Ok(self.inner.store.task_attempts(app, id).await?)
    }

    /// A task of the app by effect key.
    pub async fn get_by_effect_key(
        &self,
        app: &AppId,
        key: &EffectKey,
    ) -> Result<Option<Task>, EngineError> {
        Ok(self.inner.store.get_task_by_effect_key(app, key).await?)
    }

    /// Waits until the task is terminal or `timeout` passes, and returns it as it is then
    /// (`None`: no such task, or it was deleted). Woken by notifications; the task's shared
    /// watch looks at the database at least every `notifications.poll_interval` whatever
    /// happens, so a lost notification costs latency only. Takes one of the app's waiter
    /// slots while it waits ([`EngineError::TooManyWaiters`] when none is free).
    pub async fn wait(
        &self,
        app: &AppId,
        id: TaskId,
        timeout: Duration,
    ) -> Result<Option<Task>, EngineError> {
        self.waiter().wait(app, id, None, timeout).await
    }

    /// The task's events (docs/api.md, "Streaming a task"): its output as the provider
    /// sends it (from this process's live stream, or the stream log when another
    /// replica runs it), restarts, then its end
    /// ([`TaskEvents`](crate::stream::TaskEvents)). `None`: no such task. Reading a task
    /// that has not ended holds one of the app's waiter slots
    /// ([`EngineError::TooManyWaiters`] when none is free).
    pub async fn events(
        &self,
        app: &AppId,
        id: TaskId,
    ) -> Result<Option<crate::stream::TaskEvents>, EngineError> {
        crate::stream::TaskEvents::open(self.inner.clone(), app, id, None, None).await
    }

    /// A [`TaskWaiter`] that hears every task end from now on: make it before submitting or
    /// reading a task to wait on it without reading it again.
    pub fn waiter(&self) -> TaskWaiter {
        TaskWaiter {
            tollgate: self.clone(),
            events: self.inner.notifier.subscribe(),
            slot: None,
        }
    }

    /// [`Tollgate::waiter`] holding one of `app`'s waiter slots from now on: take it before
    /// submitting a task to wait on, so a call refused for want of a slot
    /// ([`EngineError::TooManyWaiters`]) submitted nothing.
    pub fn waiter_for(&self, app: &AppId) -> Result<TaskWaiter, EngineError> {
        let slot = self.inner.watches.slot(app)?;
        let mut waiter = self.waiter();
        waiter.slot = Some(slot);
        Ok(waiter)
    }

    /// Calls of `app` waiting now for a task or run (at most `[notifications]
    /// waiters_per_app`).
    pub fn waiters(&self, app: &AppId) -> usize {
        self.inner.watches.waiting(app)
    }

    /// Tasks watched now for waiters: one per task, whatever the number of its waiters.
    pub fn watched_tasks(&self) -> usize {
        self.inner.watches.watched()
    }

    /// docs/conformance.md#lifecycle request cancel: a queued or running task becomes `canceled` at once and
    /// its worker stops the provider call within one heartbeat interval (at once when
    /// the worker is in this process or hears the notification). A terminal task is
    /// returned unchanged. `None`: no such task in this app.
    pub async fn cancel(&self, app: &AppId, id: TaskId) -> Result<Option<Task>, EngineError> {
        let Some(transition) = self.inner.store.request_cancel(app, id).await? else {
            return Ok(None);
        };
        self.inner.publish_transition(&transition);
        Ok(transition.task)
    }

    /// docs/conformance.md#application-tasks release: the application stored or discarded the result of the
    /// application-owned task with this effect key. Returns whether a task matched.
    pub async fn release(
        &self,
        app: &AppId,
        scope: &ScopeId,
        key: &EffectKey,
    ) -> Result<bool, EngineError> {
        Ok(self.inner.store.release(app, scope, key).await?)
    }

    /// docs/conformance.md#application-tasks: distinct (scope, source) pairs with unreleased application tasks, in
    /// keyset pages of at most 100.
    pub async fn list_unreleased_sources(
        &self,
        app: &AppId,
        query: &UnreleasedQuery,
    ) -> Result<UnreleasedPage, EngineError> {
        Ok(self.inner.store.list_unreleased_sources(app, query).await?)
    }

    /// docs/conformance.md#application-tasks: deletes the app's application-owned tasks of a scope (optionally of one
    /// source) and returns how many. In-flight ones stop: their workers' next heartbeat
    /// reports them gone. Admission records are kept.
    pub async fn delete_owner_data(
        &self,
        app: &AppId,
        scope: &ScopeId,
        source: Option<&SourceId>,
    ) -> Result<u64, EngineError> {
        Ok(self
            .inner
            .store
            .delete_owner_data(app, scope, source)
            .await?)
    }
}

/// Waits for a task to end, hearing every end since it was made ([`Tollgate::waiter`]).
#[derive(Debug)]
pub struct TaskWaiter {
    tollgate: Tollgate,
    events: broadcast::Receiver<Event>,
    /// A waiter slot taken before the task was submitted ([`Tollgate::waiter_for`]).
    slot: Option<WaitSlot>,
}

impl TaskWaiter {
    /// [`Tollgate::events`] of `(app, id)`, reading with this waiter's slot (taken before
    /// the task was submitted, [`Tollgate::waiter_for`]) rather than another.
    pub async fn events(
        mut self,
        app: &AppId,
        id: TaskId,
    ) -> Result<Option<crate::stream::TaskEvents>, EngineError> {
        let inner = self.tollgate.inner.clone();
        crate::stream::TaskEvents::open(inner, app, id, None, self.slot.take()).await
    }

    /// [`events`](Self::events) of `known`, the task as submitted or read after this
    /// waiter was made: no read to start from (the shared watch still looks at the
    /// task once at once, so an end before the watch began is not missed).
    pub async fn events_of(
        mut self,
        known: Task,
    ) -> Result<Option<crate::stream::TaskEvents>, EngineError> {
        let inner = self.tollgate.inner.clone();
        let (app, id) = (known.app.clone(), known.id);
        crate::stream::TaskEvents::open(inner, &app, id, Some(known), self.slot.take()).await
    }

    /// [`Tollgate::wait`], starting from `known` when given: the task as read (or submitted)
    /// after this waiter was made, so a finish after that read is heard, not missed. An
    /// end published by this process carries the task as it ended (no read); the task's
    /// shared watch reads it once per `notifications.poll_interval` for all its waiters
    /// (docs/api.md, "Waiting"). Waiting takes one of the app's waiter slots:
    /// [`EngineError::TooManyWaiters`] when none is free.
    pub async fn wait(
        mut self,
        app: &AppId,
        id: TaskId,
        known: Option<Task>,
        timeout: Duration,
    ) -> Result<Option<Task>, EngineError> {
        let inner = self.tollgate.inner.clone();
        let deadline = Instant::now() + timeout;
        let task = match known.filter(|t| t.id == id && t.app == *app) {
            Some(task) => task,
            None => match inner.store.get_task(app, id).await? {
                Some(task) => task,
                None => return Ok(None),
            },
        };
        if task.status.is_terminal() || timeout.is_zero() {
            return Ok(Some(task));
        }
        let _slot = match self.slot.take() {
            Some(slot) if slot.app() == app => slot,
            _ => inner.watches.slot(app)?,
        };
        // Joined first, so an end from now on reaches the watch; one heard before (since
        // this waiter was made) is in this waiter's own receiver.
        let mut watching = inner.watches.watch(app, id);
        loop {
            match self.events.try_recv() {
                Ok(Event::TaskFinished {
                    id: finished, task, ..
                }) if finished == id => match task {
                    Some(FinishedTask(t)) if t.app == *app && t.status.is_terminal() => {
                        return Ok(Some(Arc::unwrap_or_clone(t)));
                    }
                    _ => inner.watches.read_now(app, id),
                },
                Ok(_) => {}
                Err(TryRecvError::Lagged(_)) => inner.watches.read_now(app, id),
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        drop(self.events);
        Ok(match watching.until(deadline).await {
            Seen::Done(t) => Some(Arc::unwrap_or_clone(t)),
            Seen::Gone => None,
            Seen::Pending(Some(newer)) => Some(Arc::unwrap_or_clone(newer)),
            Seen::Pending(None) => Some(task),
        })
    }
}
