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
//! The process running a task also writes its pieces to the store's stream log
//! ([`log`]): a few coalesced per row, ~25 ms apart, never on the provider's path. A
//! reader on a replica that does not run the task follows that log instead
//! ([`TaskEvents`]), woken by [`Event::StreamAppended`](crate::notify::Event) hints and a
//! short poll. An execution that ends before its first flush writes nothing.

mod log;
mod read;

pub(crate) use log::LAST_CHUNK_WAIT;
pub use read::{TaskEvent, TaskEvents, answer_events, output_events};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;
use tollgate_core::{AppId, TaskId};

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
    /// What of it the stream log has.
    log: LogState,
}

/// An execution's progress in the stream log ([`log`]).
#[derive(Debug, Default)]
struct LogState {
    /// `events[..flushed]` are in the log.
    flushed: usize,
    /// The next chunk's number (chunks written so far).
    seq: u32,
    /// When the first piece not in the log yet was published.
    pending_since: Option<Instant>,
    /// A chunk of it is being written.
    writing: bool,
    /// The execution ended: only its last chunk is still written, when wanted.
    ended: bool,
    /// It answered after chunks were written: the rest goes in one last chunk marked
    /// answered.
    final_wanted: bool,
    /// Nothing more goes to the log (its last chunk written, or refused: the claim no
    /// longer runs the task).
    done: bool,
}

/// One execution's live stream: its events, and a counter readers wait on.
#[derive(Debug)]
struct Shared {
    live: Mutex<Live>,
    changed: watch::Sender<u64>,
    /// The task's app, for the log and its readers.
    app: AppId,
    /// The task.
    task: TaskId,
    /// The claim running this execution (the task's `attempt` at its claim): readers
    /// tell executions apart by it.
    claim: u32,
    /// Wakes the log writer; `None`: this stream is not logged.
    log_wake: Option<Arc<Notify>>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn push(&self, event: StreamEvent) {
        let wake_log = {
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
            self.log_wake.is_some() && live.log_pending()
        };
        self.changed.send_modify(|n| *n += 1);
        if wake_log && let Some(wake) = &self.log_wake {
            wake.notify_one();
        }
    }

    fn close(&self) {
        {
            let mut live = self.lock();
            live.closed = true;
            live.log.done = true;
        }
        self.changed.send_modify(|n| *n += 1);
    }
}

impl Live {
    /// Notes a piece the log does not have yet; true when the writer should hear of it
    /// (its first since the last flush starts the flush's clock; [`log::FLUSH_PIECES`]
    /// of them are flushed at once).
    fn log_pending(&mut self) -> bool {
        if self.log.ended || self.log.done {
            return false;
        }
        let first = self.log.pending_since.is_none();
        if first {
            self.log.pending_since = Some(Instant::now());
        }
        first || self.events.len() - self.log.flushed == log::FLUSH_PIECES
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
    streams: Mutex<Streams>,
    /// Counts streams opened, so a reader waiting for its task's can look again.
    opened: watch::Sender<u64>,
    /// Where streams are logged for readers on other replicas; `None`: nowhere.
    log: Option<log::LogTarget>,
}

#[derive(Debug, Default)]
struct Streams {
    by_task: HashMap<TaskId, Arc<Shared>>,
    /// The log writer runs (it ends a while after the last stream closed).
    writing: bool,
}

impl Default for StreamHub {
    fn default() -> StreamHub {
        StreamHub {
            streams: Mutex::new(Streams::default()),
            opened: watch::channel(0).0,
            log: None,
        }
    }
}

impl StreamHub {
    /// A hub whose streams are written to the store's stream log, with an
    /// [`Event::StreamAppended`](crate::notify::Event) hint after each write.
    pub(crate) fn logged(
        store: Arc<dyn tollgate_store::Store>,
        notifier: crate::notify::Notifier,
    ) -> StreamHub {
        StreamHub {
            log: Some(log::LogTarget::new(store, notifier)),
            ..StreamHub::default()
        }
    }

    fn lock(&self) -> MutexGuard<'_, Streams> {
        self.streams.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens the live stream of `task` (of `app`) for the execution of its claim
    /// `claim` (the task's `attempt` at that claim); it closes (and its pieces are
    /// dropped) when the returned guard is dropped.
    pub(crate) fn open(self: &Arc<Self>, app: &AppId, task: TaskId, claim: u32) -> LiveGuard {
        let shared = Arc::new(Shared {
            live: Mutex::new(Live::default()),
            changed: watch::channel(0).0,
            app: app.clone(),
            task,
            claim,
            log_wake: self.log.as_ref().map(log::LogTarget::wake),
        });
        let start_writer = {
            let mut streams = self.lock();
            if let Some(old) = streams.by_task.insert(task, shared.clone()) {
                old.close();
            }
            let start = self.log.is_some() && !streams.writing;
            streams.writing |= start;
            start
        };
        if start_writer {
            tokio::spawn(log::write(self.clone()));
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
        let shared = self.lock().by_task.get(&task)?.clone();
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
    /// The execution ended, with its output (`answered`: readers may take the pieces
    /// published since the last restart as that output's) or without. When chunks of it
    /// are in the stream log, an answered end writes the rest in one last chunk marked
    /// answered, for readers on other replicas: [`LastChunk::written`] waits (bounded)
    /// for it. `None`: nothing to wait for (nothing logged, which an execution that ends
    /// before its first flush never is; or no answer, whose pieces no reader needs).
    pub(crate) fn end(&self, answered: bool) -> Option<LastChunk> {
        let wanted = {
            let mut live = self.shared.lock();
            live.answered |= answered;
            live.log.ended = true;
            let logged = live.log.seq > 0 || live.log.writing;
            live.log.final_wanted = answered && logged && !live.log.done;
            live.log.final_wanted
        };
        let wake = self.shared.log_wake.as_ref().filter(|_| wanted)?;
        wake.notify_one();
        Some(LastChunk {
            shared: self.shared.clone(),
            changed: self.shared.changed.subscribe(),
        })
    }
}

/// The last chunk of an answered execution, on its way to the stream log
/// ([`LiveGuard::end`]).
#[derive(Debug)]
pub(crate) struct LastChunk {
    shared: Arc<Shared>,
    changed: watch::Receiver<u64>,
}

impl LastChunk {
    /// Waits until the chunk is written (or refused), at most `limit`: a slow log never
    /// holds the task's completion longer.
    pub(crate) async fn written(mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while !self.shared.lock().log.done {
            match tokio::time::timeout_at(deadline, self.changed.changed()).await {
                Ok(Ok(())) => {}
                _ => return,
            }
        }
    }
}

impl Drop for LiveGuard {
    fn drop(&mut self) {
        let last = {
            // Gone from the hub first, so no reader subscribes to a closed stream.
            let mut streams = self.hub.lock();
            if streams
                .by_task
                .get(&self.task)
                .is_some_and(|s| Arc::ptr_eq(s, &self.shared))
            {
                streams.by_task.remove(&self.task);
            }
            streams.by_task.is_empty()
        };
        self.shared.close();
        if let (true, Some(wake)) = (last, &self.shared.log_wake) {
            // The writer ends a while after the last stream closed.
            wake.notify_one();
        }
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

    /// Whether the execution ended with an output ([`LiveGuard::end`]).
    pub(crate) fn answered(&self) -> bool {
        self.shared.lock().answered
    }

    /// The claim whose execution this is.
    pub(crate) fn claim(&self) -> u32 {
        self.shared.claim
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_late_reader_gets_the_stream_from_its_start_and_restarts_only_after_output() {
        let hub = Arc::new(StreamHub::default());
        let id = TaskId::generate();
        let guard = hub.open(&AppId::new("acme").unwrap(), id, 1);
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
