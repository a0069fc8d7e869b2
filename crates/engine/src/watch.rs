//! Waiting for tasks to end, shared (docs/api.md, "Waiting").
//!
//! Every call waiting for a task (`?wait=`, the OpenAI-compatible door, [`Tollgate::wait`])
//! holds a slot of its app: at most `[notifications] waiters_per_app` at once, so one
//! tenant's long-polls cannot take the process from the others. Waiters of one task share
//! one watch: an end in this process is handed to the task's watch by the code that
//! recorded it ([`Watches::ended`], with the task, so nobody reads it again); one
//! background loop per engine hears every other end (another replica's, a sweep's) and
//! is the only one that looks at the database, once per watched task per
//! `notifications.poll_interval` whatever the number of its waiters. So a lost
//! notification costs latency, never correctness, and waiting costs no read per waiter.
//!
//! [`Tollgate::wait`]: crate::Tollgate::wait

use crate::error::EngineError;
use crate::notify::{Event, FinishedTask, Notifier};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, broadcast, watch};
use tokio::time::Instant;
use tollgate_core::{AppId, Task, TaskId};
use tollgate_store::Store;

/// What the shared watch of one task knows.
#[derive(Debug, Clone)]
pub(crate) enum Seen {
    /// Not terminal when last looked at (the task as then, if the watch read it).
    Pending(Option<Arc<Task>>),
    /// Ended: the task as it ended.
    Done(Arc<Task>),
    /// No longer exists (its owner was deleted).
    Gone,
}

/// The shared watches of one engine and the waiter count of each app.
pub(crate) struct Watches {
    store: Arc<dyn Store>,
    notifier: Notifier,
    poll: Duration,
    limit: usize,
    state: Mutex<State>,
    /// Wakes the loop: a watch joined or left.
    wake: Notify,
}

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watches")
            .field("poll", &self.poll)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct State {
    /// Whether the loop runs (it ends when nothing is watched).
    running: bool,
    /// Calls waiting now, per app.
    waiting: HashMap<AppId, usize>,
    /// One entry per watched task.
    tasks: HashMap<(AppId, TaskId), Entry>,
}

#[derive(Debug)]
struct Entry {
    seen: watch::Sender<Seen>,
    /// Counts the stream log appends heard for the task (docs/api.md, "Streaming a
    /// task"): its readers that follow the log read on.
    appended: watch::Sender<u64>,
    waiters: usize,
    /// When the loop reads the task next (unless an end is heard first).
    next_read: Instant,
}

impl Entry {
    /// The task ended as `task` (terminal): its waiters get it, and it is not read again.
    fn end(&mut self, task: &Arc<Task>, now: Instant) {
        self.seen.send_replace(Seen::Done(task.clone()));
        self.next_read = far_future(now);
    }
}

impl Watches {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        notifier: Notifier,
        poll: Duration,
        limit: usize,
    ) -> Watches {
        Watches {
            store,
            notifier,
            poll,
            limit,
            state: Mutex::new(State::default()),
            wake: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts that are still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one of `app`'s waiter slots ([`EngineError::TooManyWaiters`] when all are
    /// taken); dropping the slot gives it back.
    pub(crate) fn slot(self: &Arc<Self>, app: &AppId) -> Result<WaitSlot, EngineError> {
        let mut state = self.lock();
        let count = state.waiting.entry(app.clone()).or_insert(0);
        if *count >= self.limit {
            metrics::counter!(crate::metrics::WAITERS_REFUSED_TOTAL).increment(1);
            return Err(EngineError::TooManyWaiters {
                app: app.to_string(),
                limit: self.limit,
            });
        }
        *count += 1;
        Ok(WaitSlot {
            watches: self.clone(),
            app: app.clone(),
        })
    }

    /// Calls of `app` waiting now.
    pub(crate) fn waiting(&self, app: &AppId) -> usize {
        self.lock().waiting.get(app).copied().unwrap_or(0)
    }

    /// Tasks watched now (one per task, whatever the number of its waiters).
    pub(crate) fn watched(&self) -> usize {
        self.lock().tasks.len()
    }

    /// Joins the watch of `(app, id)` (made if new, with the loop started if it is not
    /// running).
    pub(crate) fn watch(self: &Arc<Self>, app: &AppId, id: TaskId) -> Watching {
        let mut state = self.lock();
        if !state.running {
            state.running = true;
            let events = self.notifier.subscribe();
            tokio::spawn(self.clone().run(events));
        }
        let now = Instant::now();
        let entry = state
            .tasks
            .entry((app.clone(), id))
            .or_insert_with(|| Entry {
                seen: watch::channel(Seen::Pending(None)).0,
                appended: watch::channel(0).0,
                waiters: 0,
                next_read: now + self.poll,
            });
        entry.waiters += 1;
        let seen = entry.seen.subscribe();
        let appended = entry.appended.subscribe();
        drop(state);
        // The loop may sleep until a later read than this watch's.
        self.wake.notify_one();
        Watching {
            watches: self.clone(),
            key: (app.clone(), id),
            seen,
            appended,
        }
    }

    /// A waiter may have missed the end of `(app, id)`: the loop reads it at once rather
    /// than after a poll interval.
    pub(crate) fn read_now(&self, app: &AppId, id: TaskId) {
        if let Some(entry) = self.lock().tasks.get_mut(&(app.clone(), id))
            && matches!(*entry.seen.borrow(), Seen::Pending(_))
        {
            entry.next_read = Instant::now();
        }
        self.wake.notify_one();
    }

    /// The loop: hears ends, reads watched tasks that are due, and ends when nothing is
    /// watched.
    async fn run(self: Arc<Self>, mut events: broadcast::Receiver<Event>) {
        loop {
            let due = {
                let mut state = self.lock();
                if state.tasks.is_empty() {
                    state.running = false;
                    return;
                }
                state.tasks.values().map(|e| e.next_read).min()
            };
            let nap = tokio::time::sleep_until(due.unwrap_or_else(|| Instant::now() + self.poll));
            tokio::select! {
                () = nap => self.read_due().await,
                () = self.wake.notified() => {}
                event = events.recv() => match event {
                    Ok(Event::TaskFinished { app, id, task, .. }) => self.finished(app, id, task),
                    Ok(Event::StreamAppended { tasks }) => self.appended(&tasks),
                    Ok(_) => {}
                    Err(RecvError::Lagged(_)) => self.all_due(),
                    // Cannot happen while `self.notifier` lives; polling alone would carry on.
                    Err(RecvError::Closed) => events = self.notifier.subscribe(),
                },
            }
        }
    }

    /// An end heard: with the task (this process's), its waiters get it; without it
    /// (another replica's, a sweep's), the task is read now.
    fn finished(&self, app: Option<AppId>, id: TaskId, task: Option<FinishedTask>) {
        let mut state = self.lock();
        let now = Instant::now();
        for ((watched_app, watched_id), entry) in state.tasks.iter_mut() {
            if *watched_id != id || app.as_ref().is_some_and(|a| a != watched_app) {
                continue;
            }
            if matches!(*entry.seen.borrow(), Seen::Done(_)) {
                // Seen already (`Watches::ended`).
                continue;
            }
            match &task {
                Some(FinishedTask(t)) if t.app == *watched_app && t.status.is_terminal() => {
                    entry.end(t, now);
                }
                _ => entry.next_read = now,
            }
        }
    }

    /// This process ended `task`: its waiters get it now. The loop hears the same end
    /// from the notifier later and finds it seen.
    pub(crate) fn ended(&self, task: &Arc<Task>) {
        if !task.status.is_terminal() {
            return;
        }
        let mut state = self.lock();
        if let Some(entry) = state.tasks.get_mut(&(task.app.clone(), task.id)) {
            entry.end(task, Instant::now());
        }
    }

    /// Stream log appends heard: the readers of those tasks read on.
    fn appended(&self, tasks: &[(AppId, TaskId)]) {
        let state = self.lock();
        for key in tasks {
            if let Some(entry) = state.tasks.get(key) {
                entry.appended.send_modify(|n| *n = n.wrapping_add(1));
            }
        }
    }

    /// Some ends may have been missed: every watched task is read now.
    fn all_due(&self) {
        let now = Instant::now();
        for entry in self.lock().tasks.values_mut() {
            if matches!(*entry.seen.borrow(), Seen::Pending(_)) {
                entry.next_read = now;
            }
        }
    }

    /// Reads each watched task that is due, one after another (one connection at a
    /// time, whatever the number of waiters).
    async fn read_due(&self) {
        let now = Instant::now();
        let due: Vec<(AppId, TaskId)> = {
            let mut state = self.lock();
            let mut due = Vec::new();
            for (key, entry) in state.tasks.iter_mut() {
                if entry.next_read <= now {
                    entry.next_read = now + self.poll;
                    due.push(key.clone());
                }
            }
            due
        };
        for (app, id) in due {
            let seen = match self.store.get_task(&app, id).await {
                Ok(Some(task)) if task.status.is_terminal() => Seen::Done(Arc::new(task)),
                Ok(Some(task)) => Seen::Pending(Some(Arc::new(task))),
                Ok(None) => Seen::Gone,
                Err(e) => {
                    tracing::warn!(error = %e, task = %id, "cannot read a watched task; trying again");
                    continue;
                }
            };
            metrics::counter!(crate::metrics::WAIT_READS_TOTAL).increment(1);
            let mut state = self.lock();
            if let Some(entry) = state.tasks.get_mut(&(app, id)) {
                match seen {
                    // A newer state silently (waiters keep waiting; a timeout answers it).
                    Seen::Pending(_) => {
                        entry.seen.send_if_modified(|old| {
                            if matches!(old, Seen::Pending(_)) {
                                *old = seen;
                            }
                            false
                        });
                    }
                    end => {
                        entry.next_read = far_future(now);
                        entry.seen.send_replace(end);
                    }
                }
            }
        }
    }
}

/// Never, in practice (a finished watch is not read again).
fn far_future(now: Instant) -> Instant {
    now + Duration::from_secs(86_400 * 365)
}

/// One of an app's waiter slots ([`Watches::slot`]); given back on drop.
#[derive(Debug)]
pub(crate) struct WaitSlot {
    watches: Arc<Watches>,
    app: AppId,
}

impl WaitSlot {
    /// The app whose slot this is.
    pub(crate) fn app(&self) -> &AppId {
        &self.app
    }
}

impl Drop for WaitSlot {
    fn drop(&mut self) {
        let mut state = self.watches.lock();
        if let Some(count) = state.waiting.get_mut(&self.app) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                state.waiting.remove(&self.app);
            }
        }
    }
}

/// One waiter's share of a task's watch ([`Watches::watch`]); leaves it on drop.
#[derive(Debug)]
pub(crate) struct Watching {
    watches: Arc<Watches>,
    key: (AppId, TaskId),
    seen: watch::Receiver<Seen>,
    appended: watch::Receiver<u64>,
}

impl Watching {
    /// Waits until the task ended or vanished, or `deadline`; returns what is known then.
    pub(crate) async fn until(&mut self, deadline: Instant) -> Seen {
        loop {
            let seen = self.seen.borrow_and_update().clone();
            if !matches!(seen, Seen::Pending(_)) {
                return seen;
            }
            match tokio::time::timeout_at(deadline, self.seen.changed()).await {
                Ok(Ok(())) => continue,
                // Timed out, or the watch is gone (the engine with it): what is known.
                _ => return self.seen.borrow().clone(),
            }
        }
    }
}

impl Watching {
    /// The task as the watch last read it, while it had not ended (`None`: not read yet,
    /// or ended).
    pub(crate) fn latest(&self) -> Option<Arc<Task>> {
        match &*self.seen.borrow() {
            Seen::Pending(task) => task.clone(),
            _ => None,
        }
    }

    /// Changes when a stream log append is heard for the task (docs/api.md, "Streaming
    /// a task").
    pub(crate) fn appended(&self) -> watch::Receiver<u64> {
        self.appended.clone()
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut state = self.watches.lock();
        if let Some(entry) = state.tasks.get_mut(&self.key) {
            entry.waiters = entry.waiters.saturating_sub(1);
            if entry.waiters == 0 {
                state.tasks.remove(&self.key);
                if state.tasks.is_empty() {
                    // Lets the loop end.
                    self.watches.wake.notify_one();
                }
            }
        }
    }
}
