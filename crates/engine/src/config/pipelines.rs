//! `[pipelines]`: how this process drives pipeline runs.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::*;

/// `[pipelines]`: how this process drives pipeline runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// Runs this process drives at once (each drive is a few short store calls, never
    /// held during inference). 0: this process drives no runs (other replicas do).
    pub concurrency: u32,
    /// How long a claimed run is held by this process's driver. Another replica takes
    /// over a run whose driver died once its lease ends.
    #[serde(with = "duration_text")]
    pub lease: Duration,
    /// The bounded fallback: an idle driver looks for due runs at least this often,
    /// whatever notifications say.
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    /// An admission rejection of a step (`WORKFLOW_AI_*`) makes the run wait and try
    /// again; `false` fails the run with the rejection instead.
    pub admission_retry: bool,
    /// How long a run waits after an admission rejection that gives no retry time
    /// (capacity, per-source and daily budgets).
    #[serde(with = "duration_text")]
    pub admission_default_delay: Duration,
    /// How long a run waits before it is driven again after a store error (an
    /// unavailable database).
    #[serde(with = "duration_text")]
    pub error_delay: Duration,
    /// How many times a step whose attempt was interrupted by a dead worker
    /// (`WORKFLOW_AI_INTERRUPTED`, a crash mid-call) is tried again, on top of the step's
    /// own `retries`: a run survives crashes of the processes executing its steps.
    pub interrupted_retries: u32,
    /// Whether a process that runs no workers (`workers.concurrency = 0`, an API-only
    /// replica) drives pipeline runs too. Off by default: API-only replicas answer HTTP
    /// and sweep, and the worker replicas drive runs.
    pub drive_without_workers: bool,
}

impl Default for PipelineConfig {
    fn default() -> Self {
        PipelineConfig {
            concurrency: 8,
            lease: Duration::from_secs(30),
            poll_interval: Duration::from_secs(1),
            admission_retry: true,
            admission_default_delay: Duration::from_secs(5),
            error_delay: Duration::from_secs(1),
            interrupted_retries: 3,
            drive_without_workers: false,
        }
    }
}
