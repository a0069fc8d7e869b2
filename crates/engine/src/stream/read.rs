//! Reading a task's events ([`Tollgate::events`](crate::Tollgate::events)): its live
//! output — from this process's hub while it runs the task, from the store's stream log
//! while another replica does — then its end.

use super::{StreamEvent, Subscription, log};
use crate::error::EngineError;
use crate::inner::Inner;
use crate::watch::{Seen, WaitSlot, Watching};
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tollgate_core::{AppId, Task, TaskId, TaskKind, TaskStatus};
use tollgate_store::StreamPosition;

/// How often a reader of a task running on another replica reads the stream log when
/// no append is heard (hints make it sooner).
pub(crate) const LOG_POLL: Duration = Duration::from_millis(100);
/// Chunks read from the stream log at once.
const LOG_PAGE: u32 = 256;
/// Most pages read at a task's end to catch up with its log.
const LOG_PAGES_AT_END: usize = 64;

/// One event of a task's stream ([`TaskEvents`]).
#[derive(Debug, Clone, PartialEq)]
pub enum TaskEvent {
    /// A piece of the output, or a restart.
    Stream(StreamEvent),
    /// The task ended (succeeded, failed or canceled): the last event, with the task as
    /// stored (its validated output and usage, or its error).
    End(Box<Task>),
}

/// The answer of a succeeded task as stream pieces (what a reader that saw none of them
/// live gets before the end): a `generate_text`'s text, a `chat`'s content and tool
/// calls, any other kind's output as JSON text; nothing for `embed` (vectors are read
/// from the task) or a task without output.
pub fn answer_events(task: &Task) -> Vec<StreamEvent> {
    match task.output.as_ref() {
        Some(output) if task.status == TaskStatus::Succeeded => output_events(task.kind, output),
        _ => Vec::new(),
    }
}

/// An output of `kind` as stream pieces (see [`answer_events`]).
pub fn output_events(kind: TaskKind, output: &Value) -> Vec<StreamEvent> {
    let text = |v: Option<&Value>| {
        v.and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .map(|t| StreamEvent::Text(t.to_string()))
    };
    match kind {
        TaskKind::Embed => Vec::new(),
        TaskKind::GenerateText => text(output.get("text")).into_iter().collect(),
        TaskKind::Chat => {
            let mut events: Vec<StreamEvent> = text(output.get("content")).into_iter().collect();
            let calls = output.get("tool_calls").and_then(Value::as_array);
            for (index, call) in calls.into_iter().flatten().enumerate() {
                let field = |path: &str| call.pointer(path).and_then(Value::as_str);
                events.push(StreamEvent::ToolCall {
                    index: u32::try_from(index).unwrap_or(u32::MAX),
                    id: field("/id").map(str::to_string),
                    name: field("/function/name").map(str::to_string),
                    arguments: field("/function/arguments").unwrap_or("{}").to_string(),
                });
            }
            events
        }
        _ => vec![StreamEvent::Text(output.to_string())],
    }
}

/// A task's events, in order: the pieces of its output as the executing provider sends
/// them (from the execution's start, wherever it runs: this process's live stream, or
/// the stream log another replica writes), restarts, and last [`TaskEvent::End`]. A
/// reader that saw no piece of the final answer (it finished before, or its provider
/// does not stream, or it ended before its first pieces were logged) gets the whole
/// answer as pieces ([`answer_events`]) just before the end. Holds one of the app's
/// waiter slots while the task runs (docs/api.md, "Waiting"); dropping it stops reading
/// and changes nothing about the task.
#[derive(Debug)]
pub struct TaskEvents {
    inner: Arc<Inner>,
    app: AppId,
    id: TaskId,
    _slot: Option<WaitSlot>,
    watching: Option<Watching>,
    live: Option<Subscription>,
    opened: watch::Receiver<u64>,
    /// Changes when a stream log append is heard for the task.
    appended: Option<watch::Receiver<u64>>,
    /// Pieces were given since the last restart.
    dirty: bool,
    /// The execution that published them ended without an answer (interrupted, failed).
    stale: bool,
    /// The claim whose execution's pieces are being given.
    claim: Option<u32>,
    /// The last execution followed here ended with the answer, its pieces all given.
    answered: bool,
    /// The next position to read in the stream log.
    from: StreamPosition,
    /// The stream log is to be read now.
    log_due: bool,
    /// The task runs on another replica: its stream log is read every [`LOG_POLL`].
    elsewhere: bool,
    pending: VecDeque<TaskEvent>,
    done: bool,
}

/// What woke an idle reader.
enum Woken {
    Seen(Seen),
    Opened(bool),
    Appended,
    Tick,
}

impl TaskEvents {
    /// Starts reading `(app, id)`, from `known` when given (the task as submitted or
    /// read by the caller: no read here). `None`: no such task.
    pub(crate) async fn open(
        inner: Arc<Inner>,
        app: &AppId,
        id: TaskId,
        known: Option<Task>,
        slot: Option<WaitSlot>,
    ) -> Result<Option<TaskEvents>, EngineError> {
        // Listening first, so a stream that opens after the read is not missed.
        let opened = inner.streams.opened();
        let task = match known.filter(|t| t.id == id && t.app == *app) {
            Some(task) => task,
            None => match inner.store.get_task(app, id).await? {
                Some(task) => task,
                None => return Ok(None),
            },
        };
        let running = task.status == TaskStatus::Running;
        let mut events = TaskEvents {
            inner: inner.clone(),
            app: app.clone(),
            id,
            _slot: None,
            watching: None,
            live: None,
            opened,
            appended: None,
            dirty: false,
            stale: false,
            claim: None,
            answered: false,
            // The current claim's chunks, from its first (earlier claims' are void).
            from: StreamPosition {
                claim: task.attempt,
                seq: 0,
            },
            log_due: running,
            elsewhere: running,
            pending: VecDeque::new(),
            done: false,
        };
        if task.status.is_terminal() {
            events.finish(task);
            return Ok(Some(events));
        }
        events._slot = Some(match slot {
            Some(slot) if slot.app() == app => slot,
            _ => inner.watches.slot(app)?,
        });
        let watching = inner.watches.watch(app, id);
        events.appended = Some(watching.appended());
        events.watching = Some(watching);
        // An end between the read and the watch is not missed either.
        inner.watches.read_now(app, id);
        Ok(Some(events))
    }

    fn finish(&mut self, task: Task) {
        self.done = true;
        if self.dirty && self.stale && task.status == TaskStatus::Succeeded {
            // Another execution answered: what this reader got is void.
            let restart = self.forward(StreamEvent::Restart {
                reason: "another execution answered".into(),
            });
            self.pending.push_back(restart);
        }
        if !self.dirty {
            self.pending
                .extend(answer_events(&task).into_iter().map(TaskEvent::Stream));
        }
        self.pending.push_back(TaskEvent::End(Box::new(task)));
    }

    fn forward(&mut self, event: StreamEvent) -> TaskEvent {
        self.dirty = !matches!(event, StreamEvent::Restart { .. });
        TaskEvent::Stream(event)
    }

    /// Gives the pieces of another execution from here: what was given before is void.
    fn follow(&mut self, claim: u32) {
        if self.dirty {
            let restart = self.forward(StreamEvent::Restart {
                reason: "the task's execution started over".into(),
            });
            self.pending.push_back(restart);
        }
        self.claim = Some(claim);
        self.stale = false;
        self.answered = false;
    }

    /// Reads the stream log from [`Self::from`] (one page; another is due when it was
    /// full). Returns whether it read anything.
    async fn read_log(&mut self) -> bool {
        let chunks = match self
            .inner
            .store
            .stream_chunks(&self.app, self.id, self.from, LOG_PAGE)
            .await
        {
            Ok(chunks) => chunks,
            Err(e) => {
                tracing::warn!(task = %self.id, error = %e, "cannot read the stream log; trying again");
                return false;
            }
        };
        self.log_due = chunks.len() == LOG_PAGE as usize;
        let read = !chunks.is_empty();
        for chunk in chunks {
            let position = chunk.position;
            self.from = StreamPosition {
                claim: position.claim,
                seq: position.seq.saturating_add(1),
            };
            if self.claim != Some(position.claim) {
                self.follow(position.claim);
            }
            self.elsewhere = true;
            match log::decode(&chunk.events) {
                Ok(pieces) => {
                    for piece in pieces {
                        let event = self.forward(piece);
                        self.pending.push_back(event);
                    }
                    self.answered = chunk.answered;
                }
                Err(e) => {
                    // Pieces are missing from here: at the end, the whole answer.
                    tracing::warn!(task = %self.id, error = %e, "an unreadable stream log chunk");
                    self.stale = true;
                    self.answered = false;
                }
            }
        }
        read
    }

    /// The task ended: what its log still holds of the answering execution is given
    /// before its end (nothing to read when the execution followed here answered and
    /// all its pieces were given).
    async fn catch_up(&mut self, task: &Task) {
        if task.status != TaskStatus::Succeeded || self.answered {
            return;
        }
        for _ in 0..LOG_PAGES_AT_END {
            self.read_log().await;
            if !self.log_due {
                break;
            }
        }
        self.log_due = false;
        // What was given is the answer only when its execution's last chunk was read.
        self.stale |= !self.answered;
    }

    /// The next event, waiting for it; `None` after the end (or when the task was
    /// deleted meanwhile).
    pub async fn next(&mut self) -> Option<TaskEvent> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.done {
                return None;
            }
            if let Some(live) = &mut self.live {
                match live.next().await {
                    Some(event) => return Some(self.forward(event)),
                    None => {
                        // Ended without an output (failed, interrupted): what it
                        // published is void should another execution answer.
                        self.stale = !live.answered();
                        self.answered = live.answered();
                        // Its chunks in the log were given here already.
                        self.from = StreamPosition {
                            claim: live.claim().saturating_add(1),
                            seq: 0,
                        };
                        self.live = None;
                        continue;
                    }
                }
            }
            if let Some(live) = self.inner.streams.subscribe(self.id) {
                let claim = live.claim();
                self.live = Some(live);
                self.follow(claim);
                self.elsewhere = false;
                self.log_due = false;
                continue;
            }
            if self.log_due && self.read_log().await {
                continue;
            }
            let watching = self.watching.as_mut()?;
            let far = Instant::now() + Duration::from_secs(86_400);
            let tick = if self.elsewhere {
                LOG_POLL
            } else {
                self.inner.config.notifications.poll_interval
            };
            let woken = tokio::select! {
                seen = watching.until(far) => Woken::Seen(seen),
                changed = self.opened.changed() => Woken::Opened(changed.is_ok()),
                appended = changed(&mut self.appended) => match appended {
                    true => Woken::Appended,
                    false => Woken::Tick,
                },
                () = tokio::time::sleep(tick) => Woken::Tick,
            };
            match woken {
                Woken::Seen(Seen::Done(task)) => {
                    self.catch_up(&task).await;
                    self.finish(Arc::unwrap_or_clone(task));
                }
                Woken::Seen(Seen::Gone) => {
                    self.done = true;
                    return None;
                }
                Woken::Seen(Seen::Pending(_)) => {}
                // The engine is gone: only the watch can say more.
                Woken::Opened(false) => self.opened = self.inner.streams.opened(),
                Woken::Opened(true) => {}
                Woken::Appended => self.log_due = true,
                Woken::Tick => {
                    // Running elsewhere (as the watch last read it): its log is read.
                    let running = watching
                        .latest()
                        .is_some_and(|t| t.status == TaskStatus::Running);
                    self.elsewhere |= running;
                    self.log_due |= self.elsewhere;
                }
            }
        }
    }
}

/// Waits for a change of `appended`; `false` once it can change no more (its engine is
/// gone: it is not waited on again).
async fn changed(appended: &mut Option<watch::Receiver<u64>>) -> bool {
    let Some(rx) = appended else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_ok() {
        return true;
    }
    *appended = None;
    false
}
