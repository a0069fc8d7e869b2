//! Live output of running tasks (docs/api.md, "Streaming a task").
//!
//! The worker executing a task opens the task's live stream in this process's
//! [`StreamHub`] and hands its provider calls a [`StreamSink`]; a provider that streams
//! publishes the answer's pieces there as they arrive ([`StreamEvent::Text`],
//! [`StreamEvent::ToolCall`]). Readers ([`TaskEvents`]) subscribe: a reader that comes
//! late gets the execution's pieces from its start (the hub keeps them until the
//! execution ends), then follows. When output already published becomes void — a
//! re-ask, a fallback to another deployment, a provider's own retry after the answer
//! broke off, another execution after an interruption — the sink publishes
//! [`StreamEvent::Restart`] before the new pieces, so a reader never splices two
//! answers. The stream is a view: the task's stored output (validated, with its usage)
//! is what counts, and every reader's last event is the task as it ended.
//!
//! Live pieces exist only in the process that runs the task; a reader on another replica
//! gets the task's end (with its whole answer) when it ends, through the shared watch.

mod read;

pub use read::{TaskEvent, TaskEvents, answer_events, output_events};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;
use tollgate_core::TaskId;

/// One piece of a task's live output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// Text of the answer, in order. For a structured kind it is the model's raw text,
    /// which the stored output (validated at the end) may normalize.
    Text(String),
    /// A piece of a tool call (kind `chat`): the call's first piece names its `id` and
    /// function; `arguments` pieces concatenate to the call's arguments.
    ToolCall {
        /// The call's position among the answer's calls.
        index: u32,
        /// The call's id (on its first piece).
        id: Option<String>,
        /// The function called (on its first piece).
        name: Option<String>,
        /// The next piece of the arguments' JSON text.
        arguments: String,
    },
    /// Everything published before is void: the output starts over (why, in `reason`).
    Restart {
        /// What started the output over.
        reason: String,
    },
}

#[derive(Debug, Default)]
struct Live {
    events: Vec<StreamEvent>,
    /// Whether output was published since the last restart (a restart before any is not
    /// published: nothing is void).
    dirty: bool,
    /// The execution ended: no more events.
    closed: bool,
    /// The execution ended with an output (being recorded): the pieces since the last
    /// restart are that output's.
    answered: bool,
}

/// One execution's live stream: its events, and a counter readers wait on.
#[derive(Debug)]
struct Shared {
    live: Mutex<Live>,
    changed: watch::Sender<u64>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, event: StreamEvent) {
        {
            let mut live = self.lock();
            if live.closed {
                return;
            }
            match &event {
                StreamEvent::Restart { .. } if !live.dirty => return,
                StreamEvent::Restart { .. } => live.dirty = false,
                _ => live.dirty = true,
            }
            live.events.push(event);
        }
        self.changed.send_modify(|n| *n += 1);
    }

    fn close(&self) {
        self.lock().closed = true;
        self.changed.send_modify(|n| *n += 1);
    }
}

/// Where a provider publishes the pieces of its answer as they arrive
/// ([`Provider::complete_streaming`](crate::provider::Provider::complete_streaming)).
/// Cheap to clone; publishing never blocks and never fails (with no reader, pieces are
/// only kept until the execution ends).
#[derive(Debug, Clone, Default)]
pub struct StreamSink {
    shared: Option<Arc<Shared>>,
}

impl StreamSink {
    /// A sink that keeps nothing (a call nobody can read live, tests).
    pub fn detached() -> StreamSink {
        StreamSink::default()
    }

    /// Publishes one piece ([`text`](Self::text), [`tool_call`](Self::tool_call) or
    /// [`restart`](Self::restart)).
    pub fn publish(&self, event: StreamEvent) {
        match event {
            StreamEvent::Text(text) => self.text(&text),
            StreamEvent::Restart { reason } => self.restart(&reason),
            tool_call => {
                if let Some(s) = &self.shared {
                    s.push(tool_call);
                }
            }
        }
    }

    /// Publishes the next piece of the answer's text (empty pieces are skipped).
    pub fn text(&self, text: &str) {
        if let (Some(s), false) = (&self.shared, text.is_empty()) {
            s.push(StreamEvent::Text(text.to_string()));
        }
    }

    /// Publishes a piece of tool call `index` (see [`StreamEvent::ToolCall`]).
    pub fn tool_call(&self, index: u32, id: Option<&str>, name: Option<&str>, arguments: &str) {
        if let Some(s) = &self.shared {
            s.push(StreamEvent::ToolCall {
                index,
                id: id.map(str::to_string),
                name: name.map(str::to_string),
                arguments: arguments.to_string(),
            });
        }
    }

    /// The output starts over (a new provider call or try): when something was
    /// published since the last restart, readers are told it is void.
    pub fn restart(&self, reason: &str) {
        if let Some(s) = &self.shared {
            s.push(StreamEvent::Restart {
                reason: reason.to_string(),
            });
        }
    }
}

/// This process's live streams, one per task it is executing.
#[derive(Debug)]
pub(crate) struct StreamHub {
    tasks: Mutex<HashMap<TaskId, Arc<Shared>>>,
    /// Counts streams opened, so a reader waiting for its task's can look again.
    opened: watch::Sender<u64>,
}

impl Default for StreamHub {
    fn default() -> StreamHub {
        StreamHub {
            tasks: Mutex::new(HashMap::new()),
            opened: watch::channel(0).0,
        }
    }
}

impl StreamHub {
    fn lock(&self) -> MutexGuard<'_, HashMap<TaskId, Arc<Shared>>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens `task`'s live stream for one execution; it closes (and its pieces are
    /// dropped) when the returned guard is dropped.
    pub(crate) fn open(self: &Arc<Self>, task: TaskId) -> LiveGuard {
        let shared = Arc::new(Shared {
            live: Mutex::new(Live::default()),
            changed: watch::channel(0).0,
        });
        if let Some(old) = self.lock().insert(task, shared.clone()) {
            old.close();
        }
        self.opened.send_modify(|n| *n += 1);
        LiveGuard {
            hub: self.clone(),
            task,
            shared,
        }
    }

    /// Follows `task`'s live stream from its start, when this process is executing it.
    pub(crate) fn subscribe(&self, task: TaskId) -> Option<Subscription> {
        let shared = self.lock().get(&task)?.clone();
        let changed = shared.changed.subscribe();
        Some(Subscription {
            shared,
            cursor: 0,
            changed,
        })
    }

    /// Changes when a stream opens.
    pub(crate) fn opened(&self) -> watch::Receiver<u64> {
        self.opened.subscribe()
    }
}

/// One execution's hold on its task's live stream ([`StreamHub::open`]).
#[derive(Debug)]
pub(crate) struct LiveGuard {
    hub: Arc<StreamHub>,
    task: TaskId,
    shared: Arc<Shared>,
}

impl LiveGuard {
    /// The sink the execution's provider calls publish to.
    pub(crate) fn sink(&self) -> StreamSink {
        StreamSink {
            shared: Some(self.shared.clone()),
        }
    }
}

impl LiveGuard {
    /// The execution produced its output: readers may take the pieces published since
    /// the last restart as that output's.
    pub(crate) fn answered(&self) {
        self.shared.lock().answered = true;
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        {
            // Gone from the hub first, so no reader subscribes to a closed stream.
            let mut tasks = self.hub.lock();
            if tasks
                .get(&self.task)
                .is_some_and(|s| Arc::ptr_eq(s, &self.shared))
            {
                tasks.remove(&self.task);
            }
        }
        self.shared.close();
    }
}

/// A reader's place in one execution's live stream.
#[derive(Debug)]
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    cursor: usize,
    changed: watch::Receiver<u64>,
}

impl Subscription {
    /// The next piece, waiting for it; `None` once the execution ended and every piece
    /// was read.
    pub(crate) async fn next(&mut self) -> Option<StreamEvent> {
        loop {
            {
                let live = self.shared.lock();
                if let Some(event) = live.events.get(self.cursor) {
                    self.cursor += 1;
                    return Some(event.clone());
                }
                if live.closed {
                    return None;
                }
                self.changed.mark_unchanged();
            }
            // The sender lives in `shared`, which this subscription holds.
            if self.changed.changed().await.is_err() {
                return None;
            }
        }
    }

    /// Whether the execution ended with an output ([`LiveGuard::answered`]).
    pub(crate) fn answered(&self) -> bool {
        self.shared.lock().answered
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_late_reader_gets_the_stream_from_its_start_and_restarts_only_after_output() {
        let hub = Arc::new(StreamHub::default());
        let id = TaskId::generate();
        let guard = hub.open(id);
        let sink = guard.sink();
        sink.restart("nothing yet: not published");
        sink.text("Hel");
        sink.text("");
        sink.text("lo");
        let mut late = hub.subscribe(id).expect("open");
        assert_eq!(late.next().await, Some(StreamEvent::Text("Hel".into())));
        assert_eq!(late.next().await, Some(StreamEvent::Text("lo".into())));
        sink.restart("re-ask");
        sink.restart("twice: once");
        sink.tool_call(0, Some("c1"), Some("f"), "{}");
        assert_eq!(
            late.next().await,
            Some(StreamEvent::Restart {
                reason: "re-ask".into()
            })
        );
        assert!(matches!(
            late.next().await,
            Some(StreamEvent::ToolCall { index: 0, .. })
        ));
        let waiting = tokio::spawn(async move { late.next().await });
        tokio::task::yield_now().await;
        drop(guard);
        assert_eq!(waiting.await.unwrap(), None);
        assert!(hub.subscribe(id).is_none());
        // Publishing after the end changes nothing.
        sink.text("late");
    }
}
