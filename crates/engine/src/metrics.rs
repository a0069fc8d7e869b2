//! Every metric the engine records, declared in one place. Recording goes through the
//! [`metrics`] facade, so the embedding program chooses the exporter (the server exposes
//! Prometheus text at `/metrics`); with no recorder installed, recording costs nothing.
//!
//! No series carries a label value a tenant chose (docs/api.md, "Metrics"): scope names
//! never, app names only after [`set_app_labels`]`(true)` (`[metrics] app_labels`), so
//! what `/metrics` shows and how big it grows depend on the configuration alone.

use metrics::{Label, Unit, describe_counter, describe_gauge, describe_histogram};
use std::sync::atomic::{AtomicBool, Ordering};
use tollgate_core::AppId;

/// Whether the series that can be split by app carry an `app` label (off by default).
static APP_LABELS: AtomicBool = AtomicBool::new(false);

/// Labels the series that can be split by app with the app's name from now on
/// (`[metrics] app_labels = true`; docs/api.md, "Metrics"). Process-wide, like the
/// recorder itself.
pub fn set_app_labels(on: bool) {
    APP_LABELS.store(on, Ordering::Relaxed);
}

/// The labels of a series that can be split by app: `app` when the operator opted in
/// ([`set_app_labels`]), none otherwise.
pub fn app_labels(app: &AppId) -> Vec<Label> {
    if APP_LABELS.load(Ordering::Relaxed) {
        vec![Label::new("app", app.to_string())]
    } else {
        Vec::new()
    }
}

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
/// Attempts of tasks (docs/routes.md, "Attempts") by how they ended: `outcome`
/// (`succeeded`, `unavailable`, `failed`, `interrupted`, `canceled`, `refused`); the
/// sweep's requeues count as `interrupted`.
pub const ATTEMPTS_TOTAL: &str = "tollgate_attempts_total";
/// How executions ended, by `outcome` (`succeeded`, `failed`, `aborted`, `interrupted`,
/// `refused`) and `code` (the error code, or `none`).
pub const TASK_OUTCOMES_TOTAL: &str = "tollgate_task_outcomes_total";
/// Webhook delivery attempts this process made, by `outcome` (`delivered`, `failed`).
pub const WEBHOOK_ATTEMPTS_TOTAL: &str = "tollgate_webhook_attempts_total";
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

/// docs/conformance.md#fair-share: seconds a task waited from creation to its claim ([`app_labels`]; per-scope
/// figures are in the authenticated API, never here).
pub const QUEUE_WAIT_SECONDS: &str = "tollgate_queue_wait_seconds";
/// docs/conformance.md#fair-share: tasks this process claimed ([`app_labels`]; never by scope).
pub const SCOPE_CLAIMS_TOTAL: &str = "tollgate_scope_claims_total";
/// docs/conformance.md#provider-pace: provider calls that waited for pace capacity (or a pause), by `provider`.
pub const PACE_WAITS_TOTAL: &str = "tollgate_provider_pace_waits_total";
/// docs/conformance.md#provider-pace: seconds provider calls waited for pace capacity, by `provider`.
pub const PACE_WAIT_SECONDS: &str = "tollgate_provider_pace_wait_seconds";
/// docs/conformance.md#provider-pace: 429 answers from providers, by `provider`.
pub const PROVIDER_429S_TOTAL: &str = "tollgate_provider_429s_total";
/// docs/routes.md: deployments cooled down after failing (429, 5xx, timeout, connection
/// error), by `model` (the route's id) and `deployment` (`provider/model`).
pub const ROUTE_COOLDOWNS_TOTAL: &str = "tollgate_route_cooldowns_total";

/// Calls refused because their app had all its waiter slots taken
/// (`[notifications] waiters_per_app`; docs/api.md, "Waiting").
pub const WAITERS_REFUSED_TOTAL: &str = "tollgate_waiters_refused_total";
/// Reads of watched tasks by the shared wait loop (one per watched task per poll
/// interval at most, whatever the number of waiters).
pub const WAIT_READS_TOTAL: &str = "tollgate_wait_reads_total";
/// Chunks of live output this process wrote to the stream log (docs/api.md, "Streaming
/// a task"), for readers on other replicas.
pub const STREAM_LOG_CHUNKS_TOTAL: &str = "tollgate_stream_log_chunks_total";

/// Pipeline runs this process finished, by `outcome` (`succeeded`, `failed`).
pub const PIPELINE_RUNS_FINISHED_TOTAL: &str = "tollgate_pipeline_runs_finished_total";
/// Pipeline step attempts submitted by drivers, by `outcome` (`created`, or `existing`
/// when a driver found the attempt submitted already, e.g. after a crash).
pub const PIPELINE_STEPS_SUBMITTED_TOTAL: &str = "tollgate_pipeline_steps_submitted_total";
/// Pipeline steps refused by admission whose run waits to try again.
pub const PIPELINE_ADMISSION_WAITS_TOTAL: &str = "tollgate_pipeline_admission_waits_total";

/// docs/conformance.md#cost-reservation: nano-dollars reserved at admission (a task's worst case) ([`app_labels`]).
pub const SPEND_RESERVED_TOTAL: &str = "tollgate_spend_reserved_nano_usd_total";
/// docs/conformance.md#cost-settlement: nano-dollars settled — what ended tasks actually cost, as the workers that
/// ran them recorded it (failed and canceled attempts included) ([`app_labels`]).
pub const SPEND_SETTLED_TOTAL: &str = "tollgate_spend_settled_nano_usd_total";
/// docs/conformance.md#cost-settlement: nano-dollars settled above their reservation (a provider reported more
/// than the bound) ([`app_labels`]). Each occurrence is also logged.
pub const SPEND_OVERRUN_TOTAL: &str = "tollgate_spend_overrun_nano_usd_total";
/// docs/conformance.md#cost-cache-hits: nano-dollars cache hits saved (what the copied task cost) ([`app_labels`]).
pub const SPEND_SAVED_TOTAL: &str = "tollgate_spend_saved_nano_usd_total";

/// Registers descriptions and units of every metric above with the installed recorder.
/// Call once after installing one.
pub fn describe() {
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Time from a task's creation to its claim."
    );
    describe_counter!(
        WEBHOOK_ATTEMPTS_TOTAL,
        "Webhook delivery attempts this process made, by outcome (delivered, failed)."
    );
    describe_counter!(
        SCOPE_CLAIMS_TOTAL,
        Unit::Count,
        "Tasks claimed by this process."
    );
    describe_counter!(
        PACE_WAITS_TOTAL,
        Unit::Count,
        "Provider calls that waited for pace capacity or a pause."
    );
    describe_histogram!(
        PACE_WAIT_SECONDS,
        Unit::Seconds,
        "Time provider calls waited for pace capacity or a pause."
    );
    describe_counter!(
        ATTEMPTS_TOTAL,
        Unit::Count,
        "Attempts of tasks by how they ended."
    );
    describe_counter!(
        PROVIDER_429S_TOTAL,
        Unit::Count,
        "429 answers from providers."
    );
    describe_counter!(
        ROUTE_COOLDOWNS_TOTAL,
        Unit::Count,
        "Route deployments cooled down after failing, by model and deployment."
    );
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
        WAITERS_REFUSED_TOTAL,
        Unit::Count,
        "Calls refused because their app had all its waiter slots taken."
    );
    describe_counter!(
        WAIT_READS_TOTAL,
        Unit::Count,
        "Reads of watched tasks by the shared wait loop."
    );
    describe_counter!(
        STREAM_LOG_CHUNKS_TOTAL,
        Unit::Count,
        "Chunks of live output written to the stream log for readers on other replicas."
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
    describe_counter!(
        SPEND_RESERVED_TOTAL,
        Unit::Count,
        "Nano-dollars reserved at admission (docs/conformance.md#cost-reservation)."
    );
    describe_counter!(
        SPEND_SETTLED_TOTAL,
        Unit::Count,
        "Nano-dollars ended tasks actually cost (docs/conformance.md#money-and-tokens)."
    );
    describe_counter!(
        SPEND_OVERRUN_TOTAL,
        Unit::Count,
        "Nano-dollars settled above their reservation (docs/conformance.md#cost-settlement)."
    );
    describe_counter!(
        SPEND_SAVED_TOTAL,
        Unit::Count,
        "Nano-dollars saved by cache hits (docs/conformance.md#cost-cache-hits)."
    );
}

/// Creates every series above with the installed recorder, so an exporter shows each one
/// (with its description) from the first scrape: counters at 0, the in-flight gauge at 0,
/// histograms with no samples. Labelled series are created for every label value known
/// up front: each kind, each outcome, each admission rejection code, and each provider
/// name in `providers` (the configured models' providers). Call once after [`describe`].
pub fn register<'a>(providers: impl IntoIterator<Item = &'a str>) {
    use metrics::{counter, gauge, histogram};
    use tollgate_core::{ErrorCode, TaskKind};

    let providers: Vec<String> = {
        let mut p: Vec<String> = providers.into_iter().map(str::to_string).collect();
        p.sort();
        p.dedup();
        p
    };
    for kind in TaskKind::ALL {
        let kind = kind.as_str();
        for outcome in ["created", "existing", "cached", "rejected", "invalid"] {
            counter!(SUBMITS_TOTAL, "kind" => kind, "outcome" => outcome).absolute(0);
        }
        counter!(CACHE_HITS_TOTAL, "kind" => kind).absolute(0);
        counter!(OUTPUT_REASKS_TOTAL, "kind" => kind).absolute(0);
        let _ = histogram!(TASK_EXECUTION_SECONDS, "kind" => kind);
    }
    let rejections = [
        ErrorCode::SourceBudget,
        ErrorCode::DailyBudget,
        ErrorCode::Capacity,
        ErrorCode::RateLimit,
    ];
    counter!(ADMISSIONS_TOTAL, "outcome" => "admitted").absolute(0);
    for code in rejections {
        counter!(ADMISSIONS_TOTAL, "outcome" => code.as_str()).absolute(0);
    }
    for provider in &providers {
        for outcome in ["ok", "invalid_output", "error"] {
            counter!(PROVIDER_CALLS_TOTAL, "provider" => provider.clone(), "outcome" => outcome)
                .absolute(0);
        }
        for direction in ["input", "output"] {
            counter!(PROVIDER_TOKENS_TOTAL, "provider" => provider.clone(), "direction" => direction)
                .absolute(0);
        }
        counter!(PROVIDER_RETRIES_TOTAL, "provider" => provider.clone()).absolute(0);
        let _ = histogram!(PROVIDER_LATENCY_SECONDS, "provider" => provider.clone());
    }
    // The error codes of failed executions are open-ended; the outcomes without one are
    // created here, the rest appear when they first happen.
    for outcome in ["succeeded", "aborted", "refused"] {
        counter!(TASK_OUTCOMES_TOTAL, "outcome" => outcome, "code" => "none").absolute(0);
    }
    gauge!(TASKS_IN_FLIGHT).set(0.0);
    for via in ["hint", "poll", "creation"] {
        counter!(CLAIMS_TOTAL, "via" => via).absolute(0);
    }
    counter!(HEARTBEAT_STOPS_TOTAL).absolute(0);
    for item in [
        "queue_timed_out",
        "requeued",
        "interrupted",
        "canceled",
        "runs_repaired",
        "admissions_pruned",
        "tasks_deleted",
    ] {
        counter!(SWEEP_ROWS_TOTAL, "item" => item).absolute(0);
    }
    for direction in ["published", "received", "dropped"] {
        counter!(NOTIFICATIONS_TOTAL, "direction" => direction).absolute(0);
    }
    for outcome in ["succeeded", "failed"] {
        counter!(PIPELINE_RUNS_FINISHED_TOTAL, "outcome" => outcome).absolute(0);
    }
    for outcome in ["created", "existing"] {
        counter!(PIPELINE_STEPS_SUBMITTED_TOTAL, "outcome" => outcome).absolute(0);
    }
    counter!(PIPELINE_ADMISSION_WAITS_TOTAL).absolute(0);
    for outcome in [
        "succeeded",
        "unavailable",
        "failed",
        "interrupted",
        "canceled",
        "refused",
    ] {
        counter!(ATTEMPTS_TOTAL, "outcome" => outcome).absolute(0);
    }
    counter!(WAITERS_REFUSED_TOTAL).absolute(0);
    counter!(WAIT_READS_TOTAL).absolute(0);
    counter!(STREAM_LOG_CHUNKS_TOTAL).absolute(0);
    counter!(ROUTE_COOLDOWNS_TOTAL).absolute(0);
    for series in [
        SPEND_RESERVED_TOTAL,
        SPEND_SETTLED_TOTAL,
        SPEND_OVERRUN_TOTAL,
        SPEND_SAVED_TOTAL,
    ] {
        counter!(series).absolute(0);
    }
}

/// Every series name above, for checks that an exporter lists them all.
pub const ALL: [&str; 27] = [
    ATTEMPTS_TOTAL,
    SUBMITS_TOTAL,
    ADMISSIONS_TOTAL,
    CACHE_HITS_TOTAL,
    PROVIDER_CALLS_TOTAL,
    PROVIDER_LATENCY_SECONDS,
    PROVIDER_TOKENS_TOTAL,
    PROVIDER_RETRIES_TOTAL,
    OUTPUT_REASKS_TOTAL,
    TASK_OUTCOMES_TOTAL,
    TASK_EXECUTION_SECONDS,
    TASKS_IN_FLIGHT,
    CLAIMS_TOTAL,
    HEARTBEAT_STOPS_TOTAL,
    SWEEP_ROWS_TOTAL,
    NOTIFICATIONS_TOTAL,
    PIPELINE_RUNS_FINISHED_TOTAL,
    PIPELINE_STEPS_SUBMITTED_TOTAL,
    PIPELINE_ADMISSION_WAITS_TOTAL,
    SPEND_RESERVED_TOTAL,
    SPEND_SETTLED_TOTAL,
    SPEND_OVERRUN_TOTAL,
    SPEND_SAVED_TOTAL,
    WAITERS_REFUSED_TOTAL,
    WAIT_READS_TOTAL,
    STREAM_LOG_CHUNKS_TOTAL,
    ROUTE_COOLDOWNS_TOTAL,
];
