//! `[notifications]`: how replicas tell each other about new and finished work.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::*;

/// How replicas tell each other about new and finished work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// In this process only.
    Local,
    /// NATS core pub/sub.
    Nats,
    /// PostgreSQL `LISTEN/NOTIFY` (PostgreSQL databases only).
    Postgres,
}

/// Default of `[notifications] waiters_per_app`.
pub const DEFAULT_WAITERS_PER_APP: usize = 1000;

/// `[notifications]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NotificationConfig {
    /// Which transport carries hints between replicas.
    pub transport: TransportKind,
    /// The NATS server (`transport = "nats"`).
    pub nats_url: String,
    /// NATS subjects are `<prefix>.task.queued`, `<prefix>.task.finished`,
    /// `<prefix>.task.streamed`, `<prefix>.run.woken`.
    pub subject_prefix: String,
    /// The bounded fallback: every waiter and every idle worker looks at the database at
    /// least this often, so a lost notification costs at most this much latency.
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    /// Most calls of one app waiting at once for a task or run to end (`?wait=`, the
    /// OpenAI-compatible door); one more is refused with 429
    /// `WORKFLOW_AI_TOO_MANY_WAITERS` (docs/api.md, "Waiting").
    pub waiters_per_app: usize,
}

impl Default for NotificationConfig {
    fn default() -> Self {
        NotificationConfig {
            transport: TransportKind::Local,
            nats_url: "nats://127.0.0.1:4222".to_string(),
            subject_prefix: "tollgate".to_string(),
            poll_interval: Duration::from_secs(1),
            waiters_per_app: DEFAULT_WAITERS_PER_APP,
        }
    }
}
