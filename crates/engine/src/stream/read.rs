//! Reading a task's events ([`Tollgate::events`](crate::Tollgate::events)): its live
//! output while this process runs it, then its end.

use super::{StreamEvent, Subscription};
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
/// them (from the execution's start, when this process runs it), restarts, and last
/// [`TaskEvent::End`]. A reader that saw no piece of the final answer live (the task ran
/// on another replica, finished before, or its provider does not stream) gets the whole
/// answer as pieces ([`answer_events`]) just before the end. Holds one of the app's
/// waiter slots while the task runs (docs/api.md, "Waiting"); dropping it stops reading
/// and changes nothing about the task.
#[derive(Debug)]
pub struct TaskEvents {
    inner: Arc<Inner>,
    id: TaskId,
    _slot: Option<WaitSlot>,
    watching: Option<Watching>,
    live: Option<Subscription>,
    opened: watch::Receiver<u64>,
    /// Pieces were given since the last restart.
    dirty: bool,
    /// The execution that published them ended without an answer (interrupted, failed).
    stale: bool,
    pending: VecDeque<TaskEvent>,
    done: bool,
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
        let mut events = TaskEvents {
            inner: inner.clone(),
            id,
            _slot: None,
            watching: None,
            live: None,
            opened,
            dirty: false,
            stale: false,
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
        events.watching = Some(inner.watches.watch(app, id));
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
                        self.live = None;
                        continue;
                    }
                }
            }
            if let Some(live) = self.inner.streams.subscribe(self.id) {
                self.live = Some(live);
                self.stale = false;
                if self.dirty {
                    return Some(self.forward(StreamEvent::Restart {
                        reason: "the task's execution started over".into(),
                    }));
                }
                continue;
            }
            let watching = self.watching.as_mut()?;
            let far = Instant::now() + Duration::from_secs(86_400);
            tokio::select! {
                seen = watching.until(far) => match seen {
                    Seen::Done(task) => self.finish(Arc::unwrap_or_clone(task)),
                    Seen::Gone => {
                        self.done = true;
                        return None;
                    }
                    Seen::Pending(_) => {}
                },
                changed = self.opened.changed() => {
                    if changed.is_err() {
                        // The engine is gone: only the watch can say more.
                        self.opened = self.inner.streams.opened();
                    }
                }
            }
        }
    }
}
