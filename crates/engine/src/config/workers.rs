//! `[workers]` and `[sweeper]`: this process's worker pool and the docs/conformance.md#sweeps sweep.

use serde::{Deserialize, Serialize};
use std::time::Duration;

use super::*;

/// `[workers]`: this process's worker pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// Tasks executed at once by this process; 0 runs none (an API-only replica).
    pub concurrency: u32,
    /// How often the pool heartbeats all its tasks (one write) and learns which to stop.
    #[serde(with = "duration_text")]
    pub heartbeat_interval: Duration,
    /// How many times an invalid model output is sent back to the provider with the
    /// validation error before the task fails with `invalid_model_output`.
    pub max_output_retries: u32,
    /// How long the first embeddings call of a group waits for other `embed` tasks'
    /// texts for the same deployment to join it in one provider call (docs/engine.md,
    /// "Embeddings").
    #[serde(with = "duration_text")]
    pub embed_gather: Duration,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            concurrency: 8,
            heartbeat_interval: Duration::from_secs(5),
            max_output_retries: 2,
            embed_gather: Duration::from_millis(10),
        }
    }
}

/// `[sweeper]`: docs/conformance.md#sweeps timeouts and batches (configuration, not constants).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SweeperConfig {
    /// How often this replica sweeps.
    #[serde(with = "duration_text")]
    pub interval: Duration,
    /// Queued longer than this fails with `WORKFLOW_AI_QUEUE_TIMEOUT`.
    #[serde(with = "duration_text")]
    pub queue_timeout: Duration,
    /// Running without a heartbeat this long fails with `WORKFLOW_AI_INTERRUPTED`.
    #[serde(with = "duration_text")]
    pub liveness_timeout: Duration,
    /// Released terminal application tasks are deleted this long after release and
    /// completion; webhook events this long after their deliveries all ended.
    #[serde(with = "duration_text")]
    pub retention: Duration,
    /// Rows per sweep item per round.
    pub batch_size: u32,
}

impl Default for SweeperConfig {
    fn default() -> Self {
        SweeperConfig {
            interval: Duration::from_secs(10),
            queue_timeout: Duration::from_secs(3600),
            liveness_timeout: Duration::from_secs(30),
            retention: Duration::from_secs(24 * 3600),
            batch_size: 100,
        }
    }
}
