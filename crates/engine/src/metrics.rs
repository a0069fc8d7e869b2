//! Every metric the engine records, declared in one place. Recording goes through the
//! [`metrics`] facade, so the embedding program chooses the exporter (the server exposes
//! Prometheus text at `/metrics`); with no recorder installed, recording costs nothing.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Submissions by `kind` and `outcome` (`created`, `existing`, `cached`, `rejected`,
/// `invalid`).
pub const SUBMITS_TOTAL: &str = "tollgate_submits_total";
/// Admission decisions of scoped tasks by `outcome` (`admitted`, or the rejection's error
/// code such as `WORKFLOW_AI_RATE_LIMIT`).
pub const ADMISSIONS_TOTAL: &str = "tollgate_admissions_total";
/// Tasks served from the cache, by `kind`.
pub const CACHE_HITS_TOTAL: &str = "tollgate_cache_hits_total";
/// Provider calls by `provider` and `outcome` (`ok`, `invalid_output`, `error`).
pub const PROVIDER_CALLS_TOTAL: &str = "tollgate_provider_calls_total";
/// Seconds one provider call took (including its HTTP retries), by `provider`.
pub const PROVIDER_LATENCY_SECONDS: &str = "tollgate_provider_latency_seconds";
/// Tokens reported by providers, by `provider` and `direction` (`input`, `output`).
pub const PROVIDER_TOKENS_TOTAL: &str = "tollgate_provider_tokens_total";
/// HTTP retries inside provider calls (429, 5xx, timeouts), by `provider`.
pub const PROVIDER_RETRIES_TOTAL: &str = "tollgate_provider_retries_total";
/// Invalid model outputs sent back to the provider with their validation error, by `kind`.
pub const OUTPUT_REASKS_TOTAL: &str = "tollgate_output_reasks_total";
/// How executions ended, by `outcome` (`succeeded`, `failed`, `aborted`, `interrupted`,
/// `refused`) and `code` (the error code, or `none`).
pub const TASK_OUTCOMES_TOTAL: &str = "tollgate_task_outcomes_total";
/// Seconds from claim to the recorded end of an execution, by `kind`.
pub const TASK_EXECUTION_SECONDS: &str = "tollgate_task_execution_seconds";
/// Tasks this process is executing now.
pub const TASKS_IN_FLIGHT: &str = "tollgate_tasks_in_flight";
/// Tasks this process claimed, by `via` (`hint`, `poll`).
pub const CLAIMS_TOTAL: &str = "tollgate_claims_total";
/// Tasks a heartbeat told this process to stop (canceled, expired, deleted).
pub const HEARTBEAT_STOPS_TOTAL: &str = "tollgate_heartbeat_stops_total";
/// What sweeps did, by `item` (`queue_timed_out`, `interrupted`, `canceled`,
/// `runs_repaired`, `admissions_pruned`, `tasks_deleted`).
pub const SWEEP_ROWS_TOTAL: &str = "tollgate_sweep_rows_total";
/// Notifications by `direction` (`published`, `received`, `dropped`).
pub const NOTIFICATIONS_TOTAL: &str = "tollgate_notifications_total";

/// Pipeline runs this process finished, by `outcome` (`succeeded`, `failed`).
pub const PIPELINE_RUNS_FINISHED_TOTAL: &str = "tollgate_pipeline_runs_finished_total";
/// Pipeline step attempts submitted by drivers, by `outcome` (`created`, or `existing`
/// when a driver found the attempt submitted already, e.g. after a crash).
pub const PIPELINE_STEPS_SUBMITTED_TOTAL: &str = "tollgate_pipeline_steps_submitted_total";
/// Pipeline steps refused by admission whose run waits to try again.
pub const PIPELINE_ADMISSION_WAITS_TOTAL: &str = "tollgate_pipeline_admission_waits_total";

/// Registers descriptions and units of every metric above with the installed recorder.
/// Call once after installing one.
pub fn describe() {
    describe_counter!(
        SUBMITS_TOTAL,
        Unit::Count,
        "Task submissions by kind and outcome."
    );
    describe_counter!(
        ADMISSIONS_TOTAL,
        Unit::Count,
        "Admission decisions of scoped tasks by outcome."
    );
    describe_counter!(
        CACHE_HITS_TOTAL,
        Unit::Count,
        "Tasks served from the cache."
    );
    describe_counter!(
        PROVIDER_CALLS_TOTAL,
        Unit::Count,
        "Provider calls by provider and outcome."
    );
    describe_histogram!(
        PROVIDER_LATENCY_SECONDS,
        Unit::Seconds,
        "Duration of one provider call, retries included."
    );
    describe_counter!(
        PROVIDER_TOKENS_TOTAL,
        Unit::Count,
        "Tokens reported by providers, by direction."
    );
    describe_counter!(
        PROVIDER_RETRIES_TOTAL,
        Unit::Count,
        "HTTP retries inside provider calls."
    );
    describe_counter!(
        OUTPUT_REASKS_TOTAL,
        Unit::Count,
        "Invalid model outputs sent back to the provider."
    );
    describe_counter!(
        TASK_OUTCOMES_TOTAL,
        Unit::Count,
        "How task executions ended, by outcome and error code."
    );
    describe_histogram!(
        TASK_EXECUTION_SECONDS,
        Unit::Seconds,
        "Duration from claim to the recorded end of an execution."
    );
    describe_gauge!(
        TASKS_IN_FLIGHT,
        Unit::Count,
        "Tasks this process is executing."
    );
    describe_counter!(
        CLAIMS_TOTAL,
        Unit::Count,
        "Tasks claimed, by hint or by poll."
    );
    describe_counter!(
        HEARTBEAT_STOPS_TOTAL,
        Unit::Count,
        "Tasks a heartbeat said to stop."
    );
    describe_counter!(
        SWEEP_ROWS_TOTAL,
        Unit::Count,
        "Rows changed by sweeps, by item."
    );
    describe_counter!(
        PIPELINE_RUNS_FINISHED_TOTAL,
        Unit::Count,
        "Pipeline runs finished by this process, by outcome."
    );
    describe_counter!(
        PIPELINE_STEPS_SUBMITTED_TOTAL,
        Unit::Count,
        "Pipeline step attempts submitted, new or found existing."
    );
    describe_counter!(
        PIPELINE_ADMISSION_WAITS_TOTAL,
        Unit::Count,
        "Pipeline steps refused by admission whose run waits to retry."
    );
    describe_counter!(
        NOTIFICATIONS_TOTAL,
        Unit::Count,
        "Notifications published, received and dropped."
    );
}
