//! Notifications: hints that make things fast, never the truth.
//!
//! Every event is delivered in-process at once (a tokio broadcast channel) and, when a
//! [`Transport`] is configured, published to the other replicas: NATS core pub/sub or
//! PostgreSQL `LISTEN/NOTIFY`. Workers claim hinted tasks at once; waiters wake up when
//! their task finishes. The database stays the truth: every waiter and every idle worker
//! also polls at a bounded interval, so a lost notification (a full channel, a broken
//! connection, a replica that was down) costs latency only.

use crate::error::EngineError;
use crate::metrics as m;
use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc};
use tokio_util::sync::CancellationToken;
use tollgate_core::{AppId, RunId, Task, TaskId, TaskStatus};
use uuid::Uuid;

/// How many events a slow in-process subscriber may fall behind before it skips some
/// (and so falls back on polling).
const LOCAL_CAPACITY: usize = 4096;
/// Events waiting to be published to other replicas; when full, new ones are dropped.
const OUTBOUND_CAPACITY: usize = 4096;

/// Something that happened that another part of the system may be waiting for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum Event {
    /// A task was created `queued`: a worker may claim it.
    TaskQueued {
        /// The task's app.
        app: AppId,
        /// The task.
        id: TaskId,
    },
    /// A task reached a terminal state (or was removed with its owner).
    TaskFinished {
        /// The task's app, when known (sweeps report ids only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app: Option<AppId>,
        /// The task.
        id: TaskId,
        /// Its new state, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<TaskStatus>,
        /// The task as it ended, on events published by this process (never sent to
        /// other replicas): a waiter here needs no read.
        #[serde(skip)]
        task: Option<FinishedTask>,
    },
    /// Chunks of these running tasks' live output were written to the stream log: their
    /// readers on other replicas may read on (docs/api.md, "Streaming a task").
    StreamAppended {
        /// The tasks, each with its app.
        tasks: Vec<(AppId, TaskId)>,
    },
    /// A run waiting on a task was woken: its workflow worker may continue it.
    RunWoken {
        /// The run's app, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        app: Option<AppId>,
        /// The run.
        id: RunId,
    },
}

impl Event {
    /// The NATS subject suffix of the event.
    pub fn topic(&self) -> &'static str {
        match self {
            Event::TaskQueued { .. } => "task.queued",
            Event::TaskFinished { .. } => "task.finished",
            Event::RunWoken { .. } => "run.woken",
            Event::StreamAppended { .. } => "task.streamed",
        }
    }
}

/// A task as the transition that ended it returned it (see [`Event::TaskFinished`]).
#[derive(Debug, Clone)]
pub struct FinishedTask(pub Arc<Task>);

impl PartialEq for FinishedTask {
    fn eq(&self, other: &FinishedTask) -> bool {
        *self.0 == *other.0
    }
}

// A task holds JSON values without floats that are not numbers: equality is total.
impl Eq for FinishedTask {}

/// What crosses replicas: the event and the replica that sent it (so a replica ignores
/// its own echoes).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Envelope {
    origin: Uuid,
    #[serde(flatten)]
    event: Event,
}

/// Carries events between replicas. Implementations publish a payload and deliver every
/// payload published by anyone (including themselves; echoes are filtered by origin).
#[async_trait]
pub trait Transport: Send + Sync + fmt::Debug + 'static {
    /// A short name for logs and metrics (`"nats"`, `"postgres"`).
    fn name(&self) -> &'static str;

    /// Publishes one payload about `event`.
    async fn publish(&self, event: &Event, payload: String) -> Result<(), String>;

    /// Starts receiving payloads. The stream ends only when the transport is gone for
    /// good; transient losses are healed inside (and what was sent meanwhile is lost).
    async fn subscribe(&self) -> Result<BoxStream<'static, String>, String>;
}

/// The engine's notification hub. Cloning shares it.
#[derive(Debug, Clone)]
pub struct Notifier {
    inner: Arc<NotifierInner>,
}

#[derive(Debug)]
struct NotifierInner {
    origin: Uuid,
    enabled: bool,
    local: broadcast::Sender<Event>,
    outbound: Option<mpsc::Sender<Event>>,
    transport: &'static str,
    stop: CancellationToken,
}

impl Drop for NotifierInner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl Notifier {
    /// In-process only: the right choice for one process (embedded SQLite).
    pub fn local() -> Notifier {
        Notifier::build(true, None, "local", CancellationToken::new())
    }

    /// Delivers nothing at all. Everything still works, at polling speed: useful to prove
    /// that correctness never depends on notifications.
    pub fn none() -> Notifier {
        Notifier::build(false, None, "none", CancellationToken::new())
    }

    /// NATS core pub/sub on `<subject_prefix>.task.queued`, `.task.finished`,
    /// `.task.streamed` and `.run.woken`. A server that cannot be reached now does not
    /// fail it: the client connects in the background and hints flow from then on
    /// (polling covers the gap).
    pub async fn nats(url: &str, subject_prefix: &str) -> Result<Notifier, EngineError> {
        let transport = NatsTransport::connect(url, subject_prefix).await?;
        Notifier::with_transport(Arc::new(transport)).await
    }

    /// PostgreSQL `LISTEN/NOTIFY` on the channel of the store's schema.
    #[cfg(feature = "postgres")]
    pub async fn postgres(
        store: &tollgate_store::postgres::PostgresStore,
    ) -> Result<Notifier, EngineError> {
        let channel = tollgate_store::postgres::notify::PgNotifications::new(store).await?;
        Notifier::with_transport(Arc::new(PostgresTransport { channel })).await
    }

    /// Uses any transport. Subscribes before returning, so events published by other
    /// replicas from now on are heard. Must be called inside a tokio runtime.
    pub async fn with_transport(transport: Arc<dyn Transport>) -> Result<Notifier, EngineError> {
        let stop = CancellationToken::new();
        let incoming = transport
            .subscribe()
            .await
            .map_err(|e| EngineError::Notify(format!("{}: {e}", transport.name())))?;
        let (tx, rx) = mpsc::channel(OUTBOUND_CAPACITY);
        let notifier = Notifier::build(true, Some(tx), transport.name(), stop.clone());
        tokio::spawn(receive_loop(
            incoming,
            notifier.inner.local.clone(),
            notifier.inner.origin,
            stop.clone(),
        ));
        tokio::spawn(publish_loop(rx, transport, notifier.inner.origin, stop));
        Ok(notifier)
    }

    fn build(
        enabled: bool,
        outbound: Option<mpsc::Sender<Event>>,
        transport: &'static str,
        stop: CancellationToken,
    ) -> Notifier {
        let (local, _) = broadcast::channel(LOCAL_CAPACITY);
        Notifier {
            inner: Arc::new(NotifierInner {
                origin: Uuid::new_v4(),
                enabled,
                local,
                outbound,
                transport,
                stop,
            }),
        }
    }

    /// Which transport carries events across replicas (`local`, `none`, `nats`,
    /// `postgres`).
    pub fn transport(&self) -> &'static str {
        self.inner.transport
    }

    /// Delivers `event` in-process at once and queues it for the other replicas. Never
    /// waits: when a queue is full the hint is dropped (polling covers it).
    pub fn publish(&self, event: Event) {
        if !self.inner.enabled {
            return;
        }
        if let Some(outbound) = &self.inner.outbound
            && outbound.try_send(event.clone()).is_err()
        {
            metrics::counter!(m::NOTIFICATIONS_TOTAL, "direction" => "dropped").increment(1);
        }
        // No subscriber is not an error: nobody is waiting.
        let _ = self.inner.local.send(event);
        metrics::counter!(m::NOTIFICATIONS_TOTAL, "direction" => "published").increment(1);
    }

    /// Receives every event from now on (own and other replicas'). A receiver that falls
    /// behind skips events and must look at the database.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.inner.local.subscribe()
    }
}

async fn receive_loop(
    mut incoming: BoxStream<'static, String>,
    local: broadcast::Sender<Event>,
    origin: Uuid,
    stop: CancellationToken,
) {
    loop {
        let payload = tokio::select! {
            _ = stop.cancelled() => return,
            next = incoming.next() => match next {
                Some(p) => p,
                None => return,
            },
        };
        match serde_json::from_str::<Envelope>(&payload) {
            Ok(envelope) if envelope.origin == origin => {}
            Ok(envelope) => {
                metrics::counter!(m::NOTIFICATIONS_TOTAL, "direction" => "received").increment(1);
                let _ = local.send(envelope.event);
            }
            Err(e) => tracing::debug!(error = %e, "ignoring a notification that is not Tollgate's"),
        }
    }
}

async fn publish_loop(
    mut rx: mpsc::Receiver<Event>,
    transport: Arc<dyn Transport>,
    origin: Uuid,
    stop: CancellationToken,
) {
    loop {
        let event = tokio::select! {
            _ = stop.cancelled() => return,
            next = rx.recv() => match next {
                Some(e) => e,
                None => return,
            },
        };
        let envelope = Envelope { origin, event };
        let payload = match serde_json::to_string(&envelope) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode a notification");
                continue;
            }
        };
        if let Err(e) = transport.publish(&envelope.event, payload).await {
            metrics::counter!(m::NOTIFICATIONS_TOTAL, "direction" => "dropped").increment(1);
            tracing::warn!(transport = transport.name(), error = %e, "notification not sent");
        }
    }
}

/// NATS core pub/sub.
#[derive(Debug)]
pub struct NatsTransport {
    client: async_nats::Client,
    prefix: String,
}

impl NatsTransport {
    /// Connects to the NATS server at `url`. When it cannot be reached now, the replica
    /// still starts: the client keeps connecting in the background (the subscription is
    /// registered as soon as it connects), and until then hints are lost and work goes on
    /// at polling speed — notifications are hints, the database is the truth. Later
    /// disconnections are healed by the client the same way.
    pub async fn connect(url: &str, subject_prefix: &str) -> Result<NatsTransport, EngineError> {
        let options = || {
            async_nats::ConnectOptions::new()
                .name("tollgate")
                .connection_timeout(Duration::from_secs(5))
        };
        let client = match options().connect(url).await {
            Ok(client) => client,
            Err(e) => {
                tracing::warn!(
                    %url, error = %e,
                    "cannot connect to NATS now; serving at polling speed and connecting in the background"
                );
                options()
                    .retry_on_initial_connect()
                    .connect(url)
                    .await
                    .map_err(|e| EngineError::Notify(format!("invalid NATS address {url}: {e}")))?
            }
        };
        Ok(NatsTransport {
            client,
            prefix: subject_prefix.to_string(),
        })
    }

    /// Whether the client is connected to a NATS server now.
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }
}

#[async_trait]
impl Transport for NatsTransport {
    fn name(&self) -> &'static str {
        "nats"
    }

    async fn publish(&self, event: &Event, payload: String) -> Result<(), String> {
        self.client
            .publish(format!("{}.{}", self.prefix, event.topic()), payload.into())
            .await
            .map_err(|e| e.to_string())
    }

    async fn subscribe(&self) -> Result<BoxStream<'static, String>, String> {
        let subscriber = self
            .client
            .subscribe(format!("{}.>", self.prefix))
            .await
            .map_err(|e| e.to_string())?;
        // Make sure the server registered the subscription before anyone relies on it
        // (when not connected yet, the client registers it once it connects).
        if self.is_connected() {
            self.client.flush().await.map_err(|e| e.to_string())?;
        }
        Ok(subscriber
            .map(|message| String::from_utf8_lossy(&message.payload).into_owned())
            .boxed())
    }
}

/// PostgreSQL `LISTEN/NOTIFY` through the store crate (SQL lives there).
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub struct PostgresTransport {
    channel: tollgate_store::postgres::notify::PgNotifications,
}

#[cfg(feature = "postgres")]
#[async_trait]
impl Transport for PostgresTransport {
    fn name(&self) -> &'static str {
        "postgres"
    }

    async fn publish(&self, _event: &Event, payload: String) -> Result<(), String> {
        self.channel
            .notify(&payload)
            .await
            .map_err(|e| e.to_string())
    }

    async fn subscribe(&self) -> Result<BoxStream<'static, String>, String> {
        let stream = self.channel.listen().await.map_err(|e| e.to_string())?;
        Ok(futures::stream::unfold(stream, |mut stream| async move {
            loop {
                match stream.recv().await {
                    Ok(payload) => return Some((payload, stream)),
                    Err(e) => {
                        // The database is unreachable: wait, then let the listener reconnect.
                        tracing::warn!(error = %e, "LISTEN connection lost; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        })
        .boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_as_json() {
        let event = Event::TaskFinished {
            app: Some(AppId::new("acme").unwrap()),
            id: TaskId::generate(),
            status: Some(TaskStatus::Succeeded),
            task: None,
        };
        let envelope = Envelope {
            origin: Uuid::new_v4(),
            event: event.clone(),
        };
        let text = serde_json::to_string(&envelope).unwrap();
        assert!(text.contains(r#""event":"task_finished""#), "{text}");
        let back: Envelope = serde_json::from_str(&text).unwrap();
        assert_eq!(back.event, event);
    }

    #[tokio::test]
    async fn local_delivers_and_none_drops() {
        let local = Notifier::local();
        let mut rx = local.subscribe();
        let id = RunId::generate();
        local.publish(Event::RunWoken { app: None, id });
        assert_eq!(rx.recv().await.unwrap(), Event::RunWoken { app: None, id });

        let none = Notifier::none();
        let mut rx = none.subscribe();
        none.publish(Event::RunWoken { app: None, id });
        assert!(rx.try_recv().is_err());
    }
}
