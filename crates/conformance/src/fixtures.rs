//! Fixtures shared by the conformance tests: identifiers, requests, budgets, and store
//! calls that panic with a message naming what failed, so each test reads as the rule it
//! checks.

use super::Backend;
use serde_json::{Value, json};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::{
    AdmissionRejection, AppId, Budget, DEFAULT_MAX_REQUEST_BYTES, EffectKey, Lease, ModelId,
    ModelRef, NewRun, NewTask, Owner, Run, RunId, ScopeId, SourceId, SourceRevision, StepKey,
    Subject, SubjectKind, Task, TaskId, TaskKind, TaskScope, Timestamp, Usage, ValidatedRequest,
    WorkerId,
};
use tollgate_store::{Created, Store, StoreError, SweepConfig, SweepReport, Transition};

/// The instant every backend's test clock starts at (2026-01-01T00:00:00Z).
pub const START: Timestamp = Timestamp(1_767_225_600_000);

/// An app id.
pub fn app(name: &str) -> AppId {
    AppId::new(name).expect("valid app id")
}

/// A scope id.
pub fn scope(name: &str) -> ScopeId {
    ScopeId::new(name).expect("valid scope id")
}

/// A source id.
pub fn source(name: &str) -> SourceId {
    SourceId::new(name).expect("valid source id")
}

/// An effect key.
pub fn key(name: &str) -> EffectKey {
    EffectKey::new(name).expect("valid effect key")
}

/// A step key.
pub fn step(name: &str) -> StepKey {
    StepKey::new(name).expect("valid step key")
}

/// A worker id.
pub fn worker(name: &str) -> WorkerId {
    WorkerId::new(name).expect("valid worker id")
}

/// A user subject.
pub fn user(id: &str) -> Subject {
    Subject {
        kind: SubjectKind::User,
        id: id.to_string(),
    }
}

/// A classify request over `input` with labels `spam` and `ham`.
pub fn classify(input: &str) -> ValidatedRequest {
    ValidatedRequest::new(
        TaskKind::Classify,
        &json!({"input": input, "labels": ["spam", "ham"]}),
        DEFAULT_MAX_REQUEST_BYTES,
    )
    .expect("valid classify request")
}

/// The default classify request.
pub fn classify_request() -> ValidatedRequest {
    classify("Win a free cruise!")
}

/// The default model reference.
pub fn model_ref() -> ModelRef {
    ModelRef::new("dev", "dev-1")
}

/// A valid classify output.
pub fn spam() -> Value {
    json!({"label": "spam"})
}

/// Another valid classify output.
pub fn ham() -> Value {
    json!({"label": "ham"})
}

/// Usage recorded with completions.
pub fn usage() -> Usage {
    Usage {
        input_tokens: 12,
        output_tokens: 3,
        cost_usd: Some(0.0005),
        cached_input_tokens: None,
        cache_write_input_tokens: None,
        estimated: false,
        cost_nano_usd: None,
    }
}

/// A positive integer.
pub fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).expect("positive")
}

/// A budget from its six numbers, in docs/conformance.md#admission-order order.
pub fn budget(
    steps: u32,
    sources: u32,
    scope_concurrent: u32,
    global_concurrent: u32,
    burst: u32,
    tasks_per_minute: u32,
) -> Budget {
    Budget::new(
        i64::from(steps),
        i64::from(sources),
        i64::from(scope_concurrent),
        i64::from(global_concurrent),
        i64::from(burst),
        i64::from(tasks_per_minute),
    )
    .expect("valid budget")
}

/// A budget that admits everything.
pub fn unlimited() -> Budget {
    Budget::unlimited()
}

/// The scope part of a scoped task: `source` at revision `v1`, not recompute.
pub fn scoped(source_id: &str, budget: Budget) -> Option<TaskScope> {
    Some(TaskScope {
        source_id: source(source_id),
        source_revision: SourceRevision::new("v1").expect("valid revision"),
        recompute: false,
        budget,
        reservation: tollgate_core::Reservation::default(),
    })
}

/// An application owner without subject.
pub fn app_owner(app_name: &str, scope_name: &str) -> Owner {
    Owner::Application {
        app: app(app_name),
        scope: scope(scope_name),
        subject: None,
    }
}

/// An unscoped application-owned classify task (no cache, no admission).
pub fn new_app_task(app_name: &str, scope_name: &str, effect_key: &str) -> NewTask {
    NewTask {
        cost: None,
        dispatch: tollgate_core::Dispatch::default(),
        owner: app_owner(app_name, scope_name),
        step: step("label-email"),
        effect_key: key(effect_key),
        request: classify_request(),
        model: ModelId::new("default").expect("valid model id"),
        model_ref: model_ref(),
        scope: None,
        trace_parent: None,
        max_attempts: tollgate_core::MaxAttempts::ONE,
        released: false,
        claim_by: None,
    }
}

/// A scoped application-owned classify task about `source_id` (revision `v1`).
pub fn new_scoped_task(
    app_name: &str,
    scope_name: &str,
    effect_key: &str,
    source_id: &str,
    budget: Budget,
) -> NewTask {
    NewTask {
        dispatch: tollgate_core::Dispatch::default(),
        scope: scoped(source_id, budget),
        ..new_app_task(app_name, scope_name, effect_key)
    }
}

/// An unscoped run-owned classify task.
pub fn new_run_task(app_name: &str, run: RunId, effect_key: &str) -> NewTask {
    NewTask {
        dispatch: tollgate_core::Dispatch::default(),
        owner: Owner::Run {
            app: app(app_name),
            run_id: run,
        },
        ..new_app_task(app_name, "unused", effect_key)
    }
}

/// The task with a different classify input (so a different request, cache key and
/// logical step).
pub fn with_input(mut task: NewTask, input: &str) -> NewTask {
    task.request = classify(input);
    task
}

/// The scoped task with `recompute` set.
pub fn recompute(mut task: NewTask) -> NewTask {
    task.scope.as_mut().expect("a scoped task").recompute = true;
    task
}

/// The scoped task at another source revision.
pub fn with_revision(mut task: NewTask, revision: &str) -> NewTask {
    task.scope.as_mut().expect("a scoped task").source_revision =
        SourceRevision::new(revision).expect("valid revision");
    task
}

/// The application-owned task done for `subject`.
pub fn with_subject(mut task: NewTask, subject: Option<Subject>) -> NewTask {
    match &mut task.owner {
        Owner::Application { subject: s, .. } => *s = subject,
        Owner::Run { .. } => panic!("with_subject needs an application-owned task"),
    }
    task
}

/// A run of `app` in `scope` without subject.
pub fn new_run(app_name: &str, scope_name: &str) -> NewRun {
    NewRun {
        trace_parent: None,
        app: app(app_name),
        scope: scope(scope_name),
        subject: None,
        input: json!({"workflow": "triage"}),
    }
}

/// A sweep configuration: 10 min queue timeout, 30 s liveness, 24 h retention, batches
/// of 100.
pub fn sweep_config() -> SweepConfig {
    SweepConfig {
        queue_timeout: Duration::from_secs(600),
        liveness_timeout: Duration::from_secs(30),
        retention: Duration::from_secs(24 * 3600),
        batch_size: 100,
    }
}

/// Seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Hours.
pub fn hours(n: u64) -> Duration {
    Duration::from_secs(n * 3600)
}

/// `n` independent store instances on the backend's database.
pub async fn open_stores(b: &dyn Backend, n: usize) -> Vec<Arc<dyn Store>> {
    let mut stores = Vec::with_capacity(n);
    for _ in 0..n {
        stores.push(b.open().await);
    }
    stores
}

/// `create_task`, panicking on error.
pub async fn create(s: &dyn Store, new: NewTask) -> Created {
    let what = format!("create_task({})", new.effect_key);
    s.create_task(new)
        .await
        .unwrap_or_else(|e| panic!("{what} failed: {e:?}"))
}

/// `create_task` that must create a new task; returns it.
pub async fn create_new(s: &dyn Store, new: NewTask) -> Task {
    let what = format!("create_task({})", new.effect_key);
    let created = create(s, new).await;
    assert!(
        created.created,
        "{what} returned an existing task: {:?}",
        created.task
    );
    created.task
}

/// `create_task` that must be refused; returns the error.
pub async fn create_err(s: &dyn Store, new: NewTask) -> StoreError {
    let what = format!("create_task({})", new.effect_key);
    match s.create_task(new).await {
        Ok(created) => panic!("{what} should have been refused, got {created:?}"),
        Err(e) => e,
    }
}

/// `create_task` that admission must refuse; returns the rejection.
pub async fn rejection(s: &dyn Store, new: NewTask) -> AdmissionRejection {
    let what = format!("create_task({})", new.effect_key);
    match create_err(s, new).await {
        StoreError::Admission(r) => r,
        other => panic!("{what} should have been refused by admission, got {other:?}"),
    }
}

/// `get_task`, panicking when the task is missing.
pub async fn get(s: &dyn Store, app_id: &AppId, id: TaskId) -> Task {
    try_get(s, app_id, id)
        .await
        .unwrap_or_else(|| panic!("task {id} of app {app_id} should exist"))
}

/// `get_task`.
pub async fn try_get(s: &dyn Store, app_id: &AppId, id: TaskId) -> Option<Task> {
    s.get_task(app_id, id)
        .await
        .unwrap_or_else(|e| panic!("get_task({id}) failed: {e:?}"))
}

/// `get_task_by_effect_key`.
pub async fn get_by_key(s: &dyn Store, app_id: &AppId, effect_key: &str) -> Option<Task> {
    s.get_task_by_effect_key(app_id, &key(effect_key))
        .await
        .unwrap_or_else(|e| panic!("get_task_by_effect_key({effect_key}) failed: {e:?}"))
}

/// `get_run`, panicking when the run is missing.
pub async fn get_run(s: &dyn Store, app_id: &AppId, id: RunId) -> Run {
    s.get_run(app_id, id)
        .await
        .unwrap_or_else(|e| panic!("get_run({id}) failed: {e:?}"))
        .unwrap_or_else(|| panic!("run {id} of app {app_id} should exist"))
}

/// `create_run`, panicking on error.
pub async fn create_run(s: &dyn Store, new: NewRun) -> Run {
    s.create_run(new)
        .await
        .unwrap_or_else(|e| panic!("create_run failed: {e:?}"))
}

/// The lease of `w`'s claim number `claim` of a task (1: the task's first claim).
pub fn lease(w: &WorkerId, claim: u32) -> Lease {
    Lease::new(w.clone(), claim)
}

/// `claim_task` that must succeed.
pub async fn claim(s: &dyn Store, id: TaskId, w: &WorkerId) -> Task {
    try_claim(s, id, w)
        .await
        .unwrap_or_else(|| panic!("claim_task({id}) by {w} should have claimed it"))
}

/// `claim_task`.
pub async fn try_claim(s: &dyn Store, id: TaskId, w: &WorkerId) -> Option<Task> {
    s.claim_task(id, w)
        .await
        .unwrap_or_else(|e| panic!("claim_task({id}) failed: {e:?}"))
}

/// `complete_task`, panicking on error.
pub async fn complete(s: &dyn Store, id: TaskId, w: &WorkerId, output: Value) -> Transition {
    s.complete_task(id, &lease(w, 1), output, usage())
        .await
        .unwrap_or_else(|e| panic!("complete_task({id}) failed: {e:?}"))
}

/// Claims and completes a task with [`spam`]; returns the succeeded task.
pub async fn succeed(s: &dyn Store, id: TaskId) -> Task {
    let w = worker("finisher");
    claim(s, id, &w).await;
    let t = complete(s, id, &w, spam()).await;
    assert!(
        t.applied,
        "completing claimed task {id} should apply: {t:?}"
    );
    t.task.expect("completed task is returned")
}

/// `fail_task`, panicking on error.
pub async fn fail(s: &dyn Store, id: TaskId, message: &str) -> Transition {
    s.fail_task(
        id,
        None,
        tollgate_core::ErrorCode::ProviderError,
        message,
        None,
    )
    .await
    .unwrap_or_else(|e| panic!("fail_task({id}) failed: {e:?}"))
}

/// `request_cancel` of a task the app can see.
pub async fn cancel(s: &dyn Store, app_id: &AppId, id: TaskId) -> Transition {
    s.request_cancel(app_id, id)
        .await
        .unwrap_or_else(|e| panic!("request_cancel({id}) failed: {e:?}"))
        .unwrap_or_else(|| panic!("request_cancel({id}) did not find the task"))
}

/// `is_cancellation_requested`.
pub async fn cancel_requested(s: &dyn Store, id: TaskId) -> bool {
    s.is_cancellation_requested(id)
        .await
        .unwrap_or_else(|e| panic!("is_cancellation_requested({id}) failed: {e:?}"))
}

/// One `sweep`, panicking on error.
pub async fn sweep(s: &dyn Store, config: &SweepConfig) -> SweepReport {
    s.sweep(config)
        .await
        .unwrap_or_else(|e| panic!("sweep failed: {e:?}"))
}

/// Sweeps until `more` is false and sums the reports (bounded: panics after 1,000
/// sweeps).
pub async fn sweep_all(s: &dyn Store, config: &SweepConfig) -> SweepReport {
    let mut total = SweepReport::default();
    for _ in 0..1000 {
        let r = sweep(s, config).await;
        total.queue_timed_out += r.queue_timed_out;
        total.interrupted += r.interrupted;
        total.canceled += r.canceled;
        total.runs_repaired += r.runs_repaired;
        total.admissions_pruned += r.admissions_pruned;
        total.tasks_deleted += r.tasks_deleted;
        total.stream_chunks_deleted += r.stream_chunks_deleted;
        total.finished.extend(r.finished);
        total.requeued.extend(r.requeued);
        total.woken_runs.extend(r.woken_runs);
        if !r.more {
            return total;
        }
    }
    panic!("sweep still reports more work after 1,000 sweeps");
}

/// Asserts that a state change was refused and wrote nothing (docs/conformance.md#lifecycle: "refused and
/// changes nothing").
pub fn assert_refused(result: Result<Transition, StoreError>, what: &str) {
    match result {
        Ok(t) => assert!(
            !t.applied,
            "{what} should have been refused, but it applied: {t:?}"
        ),
        Err(e) => {
            panic!("{what} should answer a refused transition (applied = false), got error {e:?}")
        }
    }
}

/// The fields a terminal task must keep whatever happens to it later.
pub fn terminal_facts(t: &Task) -> impl PartialEq + std::fmt::Debug + use<> {
    (
        t.status,
        t.output.clone(),
        t.usage,
        t.error.clone(),
        t.completed_at,
        t.worker.clone(),
    )
}
