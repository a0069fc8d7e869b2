//! The stream log's writer (docs/api.md, "Streaming a task"; docs/engine.md, "Live
//! streams across replicas"): one background task per process, running while the process
//! executes tasks, that writes the pieces its executions publish to the store's stream
//! log for readers on other replicas. Pieces are coalesced: an execution's pending pieces
//! are written [`FLUSH_EVERY`] after the first of them, or at once when
//! [`FLUSH_PIECES`] are pending, and the chunks of every execution due together go in one
//! store call (one transaction), so the log costs at most a few writes per second per
//! process, whatever the number of streams. Publishing never waits for the writer (the
//! sink only marks pieces pending), and an execution that ends before its first flush
//! writes nothing. After each write, one [`Event::StreamAppended`] hint per batch of
//! tasks tells their readers elsewhere to read on.

use super::{Shared, StreamEvent, StreamHub};
use crate::metrics as m;
use crate::notify::{Event, Notifier};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;
use tollgate_store::{Store, StreamChunk, StreamPosition};

/// How long an execution's first pending piece waits for the ones after it.
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(25);
/// Pending pieces that are written at once.
pub(crate) const FLUSH_PIECES: usize = 64;
/// Longest wait of an answered execution for its last chunk before its completion is
/// recorded (readers elsewhere then get the whole answer at the end instead).
pub(crate) const LAST_CHUNK_WAIT: Duration = Duration::from_millis(500);
/// Pause after a failed write before the next try.
const RETRY_AFTER: Duration = Duration::from_millis(200);
/// How long the writer waits for another stream after the last one closed before it
/// ends (busy processes open and close streams all the time).
const LINGER: Duration = Duration::from_secs(1);
/// Most tasks named by one [`Event::StreamAppended`] (a PostgreSQL notification's payload
/// is bounded).
const TASKS_PER_HINT: usize = 32;

/// Where a hub's streams are logged.
pub(super) struct LogTarget {
    store: Arc<dyn Store>,
    notifier: Notifier,
    /// Wakes the writer: a stream has pieces pending, ended or closed.
    wake: Arc<Notify>,
}

impl std::fmt::Debug for LogTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogTarget").finish_non_exhaustive()
    }
}

impl LogTarget {
    pub(super) fn new(store: Arc<dyn Store>, notifier: Notifier) -> LogTarget {
        LogTarget {
            store,
            notifier,
            wake: Arc::new(Notify::new()),
        }
    }

    pub(super) fn wake(&self) -> Arc<Notify> {
        self.wake.clone()
    }
}

/// When a stream's next chunk is due.
enum Due {
    /// Now: the chunk, taken (the stream marks it being written).
    Now(Flush),
    /// At this instant, unless more pieces come first.
    At(Instant),
    /// Not until something changes.
    Never,
}

/// A chunk being written, and what it covers.
struct Flush {
    chunk: StreamChunk,
    /// The stream's events up to here are in it.
    upto: usize,
}

impl Shared {
    /// This stream's next chunk, if due at `now` ([`FLUSH_EVERY`], [`FLUSH_PIECES`], or
    /// the last chunk of an answered execution).
    fn due(&self, now: Instant) -> Due {
        let mut live = self.lock();
        let log = &live.log;
        if log.done || log.writing {
            return Due::Never;
        }
        if !log.final_wanted {
            let Some(since) = log.pending_since.filter(|_| !log.ended) else {
                return Due::Never;
            };
            let at = since + FLUSH_EVERY;
            if live.events.len() - log.flushed < FLUSH_PIECES && now < at {
                return Due::At(at);
            }
        }
        let upto = live.events.len();
        let chunk = StreamChunk {
            task: self.task,
            position: StreamPosition {
                claim: self.claim,
                seq: log.seq,
            },
            events: encode(&live.events[log.flushed..upto]),
            answered: log.final_wanted,
        };
        live.log.writing = true;
        Due::Now(Flush { chunk, upto })
    }

    /// The write of `flush` ended: `Some(true)` written, `Some(false)` refused (the claim
    /// no longer runs the task: nothing more is written), `None` failed (tried again).
    fn flushed(&self, flush: &Flush, written: Option<bool>, now: Instant) {
        let done = {
            let mut live = self.lock();
            let pending = live.events.len() > flush.upto;
            let log = &mut live.log;
            log.writing = false;
            match written {
                Some(true) => {
                    log.flushed = flush.upto;
                    log.seq += 1;
                    log.pending_since = pending.then_some(now);
                    log.done |= flush.chunk.answered;
                }
                Some(false) => log.done = true,
                None => {}
            }
            log.done
        };
        if done {
            // Wakes the execution waiting for its last chunk.
            self.changed.send_modify(|n| *n += 1);
        }
    }
}

/// The writer: runs while the hub has open streams (started by the first that opens),
/// and [`LINGER`] after the last one closed.
pub(super) async fn write(hub: Arc<StreamHub>) {
    let Some(target) = hub.log.as_ref() else {
        return;
    };
    let mut idle_since: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let (due, next) = {
            let mut streams = hub.lock();
            if streams.by_task.is_empty() {
                let since = *idle_since.get_or_insert(now);
                if now >= since + LINGER {
                    streams.writing = false;
                    return;
                }
            } else {
                idle_since = None;
            }
            let mut due = Vec::new();
            let mut next: Option<Instant> = idle_since.map(|since| since + LINGER);
            for shared in streams.by_task.values() {
                match shared.due(now) {
                    Due::Now(flush) => due.push((shared.clone(), flush)),
                    Due::At(at) => next = Some(next.map_or(at, |n| n.min(at))),
                    Due::Never => {}
                }
            }
            (due, next)
        };
        if due.is_empty() {
            let nap = next.unwrap_or(now + Duration::from_secs(3600));
            tokio::select! {
                () = tokio::time::sleep_until(nap) => {}
                () = target.wake.notified() => {}
            }
            continue;
        }
        let chunks: Vec<StreamChunk> = due.iter().map(|(_, f)| f.chunk.clone()).collect();
        match target.store.append_stream_chunks(&chunks).await {
            Ok(written) => {
                let now = Instant::now();
                let mut appended = Vec::new();
                for ((shared, flush), ok) in due.iter().zip(written) {
                    shared.flushed(flush, Some(ok), now);
                    if ok {
                        appended.push((shared.app.clone(), shared.task));
                    }
                }
                metrics::counter!(m::STREAM_LOG_CHUNKS_TOTAL).increment(appended.len() as u64);
                for tasks in appended.chunks(TASKS_PER_HINT) {
                    target.notifier.publish(Event::StreamAppended {
                        tasks: tasks.to_vec(),
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, chunks = chunks.len(), "cannot write the stream log; trying again");
                let now = Instant::now();
                for (shared, flush) in &due {
                    shared.flushed(flush, None, now);
                }
                tokio::time::sleep(RETRY_AFTER).await;
            }
        }
    }
}

/// Pieces as a chunk's JSON text: `{"text": …}`, `{"tool_call": {"index", "id", "name",
/// "arguments"}}` (the events endpoint's `delta` data) or `{"restart": reason}`.
pub(crate) fn encode(events: &[StreamEvent]) -> String {
    let pieces: Vec<Value> = events
        .iter()
        .map(|event| match event {
            StreamEvent::Text(text) => json!({ "text": text }),
            StreamEvent::ToolCall {
                index,
                id,
                name,
                arguments,
            } => json!({ "tool_call": {
                "index": index, "id": id, "name": name, "arguments": arguments,
            }}),
            StreamEvent::Restart { reason } => json!({ "restart": reason }),
        })
        .collect();
    Value::Array(pieces).to_string()
}

/// The pieces of a chunk's JSON text ([`encode`]).
pub(crate) fn decode(text: &str) -> Result<Vec<StreamEvent>, String> {
    let pieces: Vec<Value> = serde_json::from_str(text).map_err(|e| e.to_string())?;
    pieces
        .into_iter()
        .map(|piece| {
            let str_of = |v: &Value| v.as_str().map(str::to_string);
            if let Some(text) = piece.get("text").and_then(Value::as_str) {
                return Ok(StreamEvent::Text(text.to_string()));
            }
            if let Some(reason) = piece.get("restart").and_then(Value::as_str) {
                return Ok(StreamEvent::Restart {
                    reason: reason.to_string(),
                });
            }
            let call = piece
                .get("tool_call")
                .ok_or_else(|| format!("not a piece: {piece}"))?;
            Ok(StreamEvent::ToolCall {
                index: call
                    .get("index")
                    .and_then(Value::as_u64)
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| format!("a tool call piece without its index: {piece}"))?,
                id: call.get("id").and_then(str_of),
                name: call.get("name").and_then(str_of),
                arguments: call.get("arguments").and_then(str_of).unwrap_or_default(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_read_back_as_written() {
        let events = vec![
            StreamEvent::Text("Hel\"lo\n".into()),
            StreamEvent::Restart {
                reason: "re-ask".into(),
            },
            StreamEvent::ToolCall {
                index: 2,
                id: Some("c1".into()),
                name: Some("f".into()),
                arguments: "{\"a\":".into(),
            },
            StreamEvent::ToolCall {
                index: 2,
                id: None,
                name: None,
                arguments: "1}".into(),
            },
        ];
        assert_eq!(decode(&encode(&events)).unwrap(), events);
        assert_eq!(decode("[]").unwrap(), vec![]);
        assert!(decode("[{\"other\":1}]").is_err());
        assert!(decode("not json").is_err());
    }
}
