//! The conformance suite: docs/conformance.md#store-rules, docs/conformance.md#dispatch written once against
//! [`Store`](tollgate_store::Store), run by every backend.
//!
//! A crate of its own (`publish = false`), beside the store rather than inside it: it uses
//! only the store's public API, so a backend passes it exactly as any caller would see it,
//! and normal builds never compile it. A backend's test file implements [`Backend`] and
//! calls [`conformance_suite!`](crate::conformance_suite), which expands to one
//! `#[tokio::test]` per rule so each passes or fails on its own and they run in parallel:
//!
//! ```ignore
//! // crates/conformance/tests/sqlite.rs
//! async fn backend(test_name: &str) -> Option<MyBackend> { /* None = skip */ }
//! tollgate_conformance::conformance_suite!(backend);
//! ```
//!
//! Every test is a `pub async fn name(b: &dyn Backend)` that panics with a message naming
//! the broken rule. Time only moves through [`Backend::clock`]; no test sleeps.
//! `docs/conformance.md` pairs every rule with these names.

#![warn(missing_docs)]

pub mod admission;
pub mod attempts;
pub mod budget_events;
pub mod cache;
pub mod concurrency;
pub mod cost;
pub mod create;
pub mod dispatch;
pub mod embeddings;
pub mod fixtures;
pub mod isolation;
pub mod lease;
pub mod lifecycle;
pub mod list;
pub mod owner;
pub mod pace;
pub mod pipelines;
pub mod route_race;
pub mod runs;
pub mod stream_log;
pub mod sweep;
pub mod trace;
pub mod tries;
pub mod unsourced;
pub mod webhooks;

pub use fixtures::START;

/// The PostgreSQL URL of the tests (`TOLLGATE_TEST_DATABASE_URL`); `None` (after saying
/// so) when it is not set, a panic when `TOLLGATE_REQUIRE_POSTGRES=1` requires it.
pub fn postgres_url(test: &str) -> Option<String> {
    let Ok(url) = std::env::var("TOLLGATE_TEST_DATABASE_URL") else {
        if std::env::var("TOLLGATE_REQUIRE_POSTGRES").is_ok_and(|v| v == "1") {
            panic!("TOLLGATE_REQUIRE_POSTGRES=1 but TOLLGATE_TEST_DATABASE_URL is not set");
        }
        eprintln!("skipping {test}: TOLLGATE_TEST_DATABASE_URL is not set");
        return None;
    };
    Some(url)
}

use async_trait::async_trait;
use std::sync::Arc;
use tollgate_core::ManualClock;
use tollgate_store::Store;

/// One test's database, as a backend provides it.
#[async_trait]
pub trait Backend: Send + Sync {
    /// A new, independent store instance (its own connection pool) on this test's
    /// database. Every instance reads [`Backend::clock`].
    async fn open(&self) -> Arc<dyn Store>;

    /// The clock every instance of this test's database reads; tests move it instead of
    /// sleeping. It starts at [`START`].
    fn clock(&self) -> &ManualClock;
}

/// Expands to one `#[tokio::test]` per conformance test. `$backend` is an async function
/// (or closure) taking the test's name and returning `Option<impl Backend>`; `None` skips
/// the test (e.g. Postgres without a database URL).
#[macro_export]
macro_rules! conformance_suite {
    ($backend:expr) => {
        $crate::__conformance_tests!(
            $backend;
            create::store_answers_ping,
            create::create_stores_a_queued_task,
            create::stored_request_is_canonical_and_hashed,
            create::request_at_the_size_limit_is_stored_exactly,
            create::invalid_model_config_is_rejected_and_writes_nothing,
            create::idempotent_create_returns_existing_task_and_spends_no_budget,
            create::effect_keys_are_unique_per_app,
            create::unscoped_tasks_skip_cache_and_admission,
            create::create_many_admits_or_refuses_each_item_on_its_own,
            trace::tasks_keep_their_trace_parent,
            trace::runs_keep_their_trace_parent,
            pipelines::pipelines_are_versioned_per_app,
            pipelines::pipeline_runs_are_driven_by_one_driver_at_a_time,
            pipelines::racing_drivers_claim_each_run_once,
            pipelines::pipeline_runs_start_once_per_key,
            cache::cache_hit_is_a_new_succeeded_task_with_the_copied_output,
            cache::cache_ignores_unfinished_and_unsuccessful_tasks,
            cache::cache_never_crosses_app_scope_subject_revision_or_model_config,
            cache::recompute_skips_the_cache_and_counts_as_a_new_step,
            cache::run_tasks_share_the_cache_of_their_scope_and_subject,
            admission::source_budget_limits_distinct_steps_per_source,
            admission::daily_budget_limits_distinct_sources_and_allows_seen_ones,
            admission::scope_capacity_counts_queued_and_running_tasks,
            admission::global_capacity_counts_scoped_tasks_of_every_app_and_scope,
            admission::rate_limit_admits_burst_then_reports_time_until_next_token,
            admission::every_ending_frees_the_concurrency_slot,
            admission::admission_checks_run_in_spec_order,
            admission::same_logical_step_counts_once,
            admission::succeeded_task_keeps_its_step,
            admission::failed_task_frees_its_step_but_source_stays_seen,
            admission::canceled_task_frees_its_step_but_source_stays_seen,
            admission::queue_timed_out_task_frees_its_step_but_source_stays_seen,
            admission::interrupted_task_frees_its_step_but_source_stays_seen,
            admission::admission_window_is_24_hours,
            admission::admission_window_slides_record_by_record,
            admission::admission_window_slides_the_same_with_sweeps,
            admission::rejections_write_nothing,
            cost::admission_reserves_the_worst_case,
            cost::settlement_replaces_the_reservation_up_and_down,
            cost::failed_and_canceled_tasks_are_charged,
            cost::cache_hits_are_free_and_report_savings,
            cost::scope_spend_limit_counts_settled_and_reserved,
            cost::token_bucket_reserves_model_tokens,
            cost::a_batch_of_completions_refunds_each_scopes_tokens,
            cost::app_spend_limit_spans_every_scope,
            cost::cost_checks_follow_admission_checks_in_order,
            cost::spend_window_slides,
            attempts::reask_reservations_are_checked_like_admission,
            attempts::racing_reasks_and_admissions_never_exceed_a_spend_limit,
            attempts::absurd_usage_is_clamped_and_the_answer_kept,
            attempts::deleting_an_owner_settles_its_in_flight_reservations,
            tries::attempts_are_recorded_and_settled_as_their_sum,
            tries::a_lost_lease_with_tries_left_requeues_the_task,
            tries::one_attempt_fails_a_lost_lease_as_before,
            tries::a_later_attempt_refused_by_the_budget_settles_the_spent_attempts,
            tries::a_worker_that_lost_its_lease_cannot_fail_the_task,
            tries::a_stale_claim_of_the_same_worker_completes_nothing,
            tries::a_batch_of_completions_charges_each_task_its_attempts,
            tries::lone_unsourced_completions_charge_each_task_its_attempts,
            lease::a_stale_lease_keeps_nothing_alive,
            lease::a_stale_lease_fails_nothing,
            lease::a_stale_lease_completes_nothing,
            lease::a_stale_lease_reserves_nothing,
            lease::a_stale_lease_begins_and_redirects_no_attempt,
            lease::a_stale_lease_hands_nothing_back,
            lease::racing_stale_and_current_executions_end_each_task_by_the_current_one,
            route_race::racing_attempts_with_fallbacks_and_crashes_never_exceed_a_spend_limit,
            unsourced::unsourced_tasks_count_against_the_app_spend_limit,
            unsourced::unsourced_tasks_count_against_the_scope_limits,
            unsourced::unsourced_tasks_settle_on_every_ending,
            unsourced::racing_unsourced_tasks_respect_the_spend_limits_exactly,
            unsourced::unsourced_tasks_in_a_batch_record_their_reservations,
            unsourced::racing_unsourced_batches_record_each_reservation_once,
            unsourced::racing_unsourced_tasks_of_one_scope_respect_the_token_bucket_exactly,
            lifecycle::claim_moves_queued_to_running_once,
            lifecycle::a_task_created_claimed_is_running_and_never_claimable,
            lifecycle::a_silent_task_created_claimed_is_requeued_and_claimable,
            lifecycle::claim_refuses_canceled_and_finished_tasks,
            lifecycle::claim_refuses_tasks_of_a_canceled_run,
            lifecycle::claim_next_claims_oldest_claimable_first,
            lifecycle::heartbeat_reports_alive_and_stop_in_one_call,
            lifecycle::complete_records_output_and_usage,
            lifecycle::complete_refuses_canceled_failed_and_expired_tasks,
            lifecycle::complete_refuses_a_task_not_held_by_the_worker,
            lifecycle::complete_tasks_answers_each_item_like_complete_task,
            lifecycle::complete_refuses_invalid_output_and_changes_nothing,
            lifecycle::fail_cuts_message_to_2000_characters,
            lifecycle::fail_refuses_terminal_tasks,
            lifecycle::request_cancel_cancels_queued_and_running_tasks,
            lifecycle::terminal_states_are_final,
            lifecycle::is_cancellation_requested_for_canceled_run_canceled_and_missing_tasks,
            lifecycle::mark_canceled_acknowledges_requested_cancellation_only,
            lifecycle::first_queued_is_the_oldest_queued_task,
            lifecycle::kept_settings_keep_the_first_value_across_instances,
            sweep::sweep_fails_tasks_queued_too_long_with_queue_timeout,
            sweep::sweep_interrupts_running_tasks_without_heartbeat,
            sweep::heartbeat_keeps_a_running_task_alive,
            sweep::sweep_keeps_cancellation_over_timeouts,
            sweep::sweep_batches_are_bounded,
            sweep::sweep_prunes_admission_records_older_than_24_hours,
            sweep::retention_deletes_released_terminal_application_tasks_only,
            sweep::sweep_wakes_runs_of_tasks_it_finishes,
            sweep::no_waiting_run_has_a_terminal_task,
            runs::runs_are_created_running_and_finish_with_their_result,
            runs::run_task_needs_an_existing_run_of_the_app,
            runs::run_task_is_refused_for_a_canceled_run,
            runs::run_scope_and_subject_apply_to_its_tasks,
            runs::idempotency_precedes_the_owner_check,
            runs::waiting_run_is_woken_by_every_terminal_move,
            runs::wait_on_a_terminal_task_is_ready_at_once,
            runs::wait_is_refused_for_a_task_of_another_owner,
            runs::application_tasks_wake_nobody,
            runs::run_cancel_cascades_to_queued_and_running_tasks,
            owner::release_matches_only_application_tasks_of_the_scope,
            owner::a_task_created_released_is_released_by_its_creation,
            owner::unreleased_sources_page_with_a_keyset_cursor,
            owner::unreleased_sources_last_full_page_has_no_next,
            owner::delete_owner_data_deletes_only_that_scope_and_source,
            embeddings::embedding_cache_is_per_app_and_scope,
            embeddings::embedding_cache_entries_go_with_owner_deletion,
            embeddings::embedding_cache_entries_go_with_retention,
            embeddings::a_mostly_cached_embed_task_is_charged_for_its_uncached_items,
            embeddings::grouped_embed_tasks_settle_each_its_own_share,
            stream_log::stream_chunks_are_written_by_the_running_claim_and_read_in_order,
            stream_log::stream_chunks_go_with_owner_deletion_and_are_swept_after_the_end,
            owner::delete_owner_data_keeps_admission_records,
            owner::deleted_in_flight_task_sees_cancellation_and_cannot_complete,
            isolation::another_app_cannot_see_a_task_even_with_its_effect_key,
            isolation::another_app_cannot_cancel_release_or_delete_a_task,
            isolation::apps_use_the_same_effect_key_independently,
            isolation::another_app_cannot_use_a_run,
            concurrency::racing_creates_on_one_effect_key_make_one_task,
            concurrency::racing_replays_are_never_refused_by_admission,
            concurrency::racing_admissions_respect_scope_concurrent_exactly,
            concurrency::racing_admissions_respect_global_concurrent_exactly,
            concurrency::racing_admissions_respect_each_apps_global_share_exactly,
            concurrency::one_app_filling_the_service_leaves_the_others_their_share,
            concurrency::an_apps_count_carries_across_its_share_being_set_and_removed,
            concurrency::racing_admissions_respect_the_token_bucket_exactly,
            concurrency::racing_admissions_respect_daily_and_source_budgets_exactly,
            concurrency::racing_claims_claim_each_task_once,
            concurrency::racing_claim_next_claims_each_task_once,
            concurrency::delete_owner_data_racing_creates_loses_no_task,
            concurrency::racing_sweeps_finish_each_task_once,
            list::walked_filter_pages_go_on_past_the_walk,
            list::a_subjects_cursor_carries_only_its_own_positions,
            list::the_error_code_filter_lists_only_tasks_that_ended_with_it,
            list::stats_samples_say_when_each_task_finished,
            dispatch::a_backlog_never_holds_back_another_scope,
            dispatch::weights_share_claims_in_proportion,
            dispatch::priority_then_age_within_a_scope,
            dispatch::ageing_lets_old_low_priority_tasks_start_before_new_high_priority_ones,
            dispatch::racing_fair_claims_claim_each_task_once_and_lose_none,
            dispatch::an_idle_scope_banks_no_credit,
            dispatch::a_flood_of_new_queues_shares_one_burst,
            dispatch::claims_fill_every_slot_behind_drained_queues,
            pace::pace_spaces_calls_across_replicas,
            pace::a_call_waits_for_every_schedule_it_takes,
            pace::token_pace_reserves_the_bound_and_settles_real_usage,
            pace::a_pause_holds_every_replica_until_it_ends,
            webhooks::terminal_moves_write_one_event_each,
            webhooks::only_subscribed_events_are_written,
            webhooks::a_batch_of_completions_writes_the_events_listened_for,
            webhooks::run_endings_write_one_event_each,
            webhooks::deliveries_are_leased_by_one_replica_at_a_time,
            webhooks::failures_back_off_then_dead_letter_and_replays_resend,
            webhooks::endpoints_are_per_app_and_config_ones_are_synced,
            webhooks::cache_hits_write_their_succeeded_event,
            webhooks::ended_events_are_swept_after_the_retention_and_go_with_their_owner,
            budget_events::crossing_a_spend_threshold_writes_one_event,
            budget_events::racing_settlements_announce_each_threshold_once,
            pace::cooldowns_are_read_per_deployment_on_every_replica,
        );
    };
}

/// Implementation detail of [`conformance_suite!`]: one test per `module::name`.
#[doc(hidden)]
#[macro_export]
macro_rules! __conformance_tests {
    ($backend:expr; $($module:ident :: $name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let Some(b) = ($backend)(stringify!($name)).await else {
                    return;
                };
                $crate::$module::$name(&b).await;
            }
        )*
    };
}
