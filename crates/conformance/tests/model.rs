//! Model-based test of the store (issue 8): random operation sequences (creations with
//! random budgets, owners, sources and subjects; batches; runs; claim, heartbeat,
//! complete, fail, cancel, acknowledge; release, unreleased listing, owner deletion;
//! sweeps; recovery listing; waiting runs; clock moves) run against a pure reference model
//! written here from docs/conformance.md#store-rules, and against each backend. After every step the answer of
//! the store must equal the model's (created flags, admission outcomes with their exact
//! limits and retry times, error kinds, transitions, sweep reports), and every task and run
//! must read back exactly as the model says, from the owning app, and not at all from the
//! other app. Proptest shrinks a failure to a minimal sequence.
//!
//! The model is deliberately naive: it keeps every admission record and counts the 24 h
//! window, the steps per source, the distinct sources and the active tasks from scratch
//! on every admission, which is what docs/conformance.md#admission says; the backends keep counters instead
//! (docs/locking.md), and this test is what shows the counters never drift.
//!
//! Every case gets a fresh SQLite file (and, with `TOLLGATE_TEST_DATABASE_URL`, a fresh
//! PostgreSQL schema); two store instances on it take turns, as two replicas would.
//! Cases: `TOLLGATE_MODEL_CASES` or `PROPTEST_CASES` (default 32 on SQLite, 16 on
//! PostgreSQL; ten times as many with `TOLLGATE_LONG_TESTS=1`); steps per case up to
//! `TOLLGATE_MODEL_STEPS` (default 60).

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tollgate_conformance::START;
use tollgate_conformance::postgres_url;
use tollgate_core::{
    AdmissionRejection, AppId, Budget, EffectKey, ErrorCode, Lease, ManualClock, ModelId, ModelRef,
    NewRun, NewTask, Owner, QueueShare, RunId, RunState, ScopeId, SourceId, SourceRevision,
    StepKey, Subject, SubjectKind, Task, TaskId, TaskKind, TaskScope, TaskStatus, Usage,
    ValidatedRequest, Weight, WorkerId, allocate_claims, join_credit, stride, validate_output,
};
use tollgate_store::postgres::{PostgresOptions, PostgresStore};
use tollgate_store::sqlite::{SqliteOptions, SqliteStore};
use tollgate_store::{
    MAX_CLAIM_QUEUES, RunResult, ScopedSource, Store, StoreError, SweepConfig, UnreleasedQuery,
    WaitOutcome,
};

const APPS: [&str; 2] = ["acme", "globex"];
const SCOPES: [&str; 2] = ["s0", "s1"];
const SOURCES: [&str; 3] = ["d0", "d1", "d2"];
const REVISIONS: [&str; 2] = ["v1", "v2"];
const INPUTS: [&str; 3] = ["in-0", "in-1", "in-2"];
const MODELS: [&str; 2] = ["dev-1", "dev-2"];
const SUBJECTS: [&str; 2] = ["alice", "bob"];
const STEPS: [&str; 2] = ["step-0", "step-1"];
const WORKERS: [&str; 2] = ["w0", "w1"];
const KEYS: u8 = 8;
const WINDOW_MS: i64 = 24 * 3600 * 1000;
const TOKEN: i64 = 60_000;
const QUEUE_TIMEOUT_MS: i64 = 10 * 60 * 1000;
const LIVENESS_MS: i64 = 30 * 1000;
const RETENTION_MS: i64 = 3600 * 1000;
/// Clock moves: around the token refill, the liveness and queue timeouts, retention and
/// the 24 h window (just inside it, and exactly on its edge, which is outside).
const ADVANCES_MS: [i64; 12] = [
    1,
    999,
    1_000,
    15_000,
    31_000,
    61_000,
    11 * 60_000,
    61 * 60_000,
    23 * 3_600_000,
    24 * 3_600_000 - 30_000,
    24 * 3_600_000,
    25 * 3_600_000,
];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

// ---------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------

/// A pick among the tasks (or runs) made so far: `n % len`, so sequences stay valid
/// while proptest shrinks them.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Pick(u16);

impl Pick {
    fn of(self, len: usize) -> usize {
        usize::from(self.0) % len
    }
}

impl fmt::Debug for Pick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

fn pick() -> impl Strategy<Value = Pick> {
    any::<u16>().prop_map(Pick)
}

#[derive(Clone, Copy, PartialEq, Eq)]
struct BudgetSpec {
    steps: u32,
    sources: u32,
    scope: u32,
    global: u32,
    burst: u32,
    rate: u32,
    cost: CostSpec,
}

/// docs/conformance.md#cost-limits limits of a budget: scope USD (nano-dollars), the token bucket (tokens per
/// minute, burst) and the app's USD.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct CostSpec {
    usd: Option<u64>,
    tokens: Option<(u32, u32)>,
    app_usd: Option<u64>,
}

impl CostSpec {
    const NONE: CostSpec = CostSpec {
        usd: None,
        tokens: None,
        app_usd: None,
    };

    fn limits(self) -> tollgate_core::CostLimits {
        use std::num::{NonZeroU32, NonZeroU64};
        tollgate_core::CostLimits {
            scope_nano_per_24_hours: self.usd.and_then(NonZeroU64::new),
            token_rate: self.tokens.map(|(rate, burst)| tollgate_core::TokenRate {
                tokens_per_minute: NonZeroU32::new(rate).expect("positive"),
                token_burst: NonZeroU32::new(burst).expect("positive"),
            }),
            app_nano_per_24_hours: self.app_usd.and_then(NonZeroU64::new),
        }
    }
}

/// The prices every scoped task of the model is reserved at: 1,000 / 2,000 / 500
/// nano-dollars per input / output / cached input token.
const PRICES: tollgate_core::Prices = tollgate_core::Prices {
    input: 1_000_000,
    output: 2_000_000,
    cached_input: 500_000,
    cache_write_input: 1_000_000,
};

/// The reservation of a scoped spec: `reserve` 0 has no output bound; 1–3 reserve
/// 30 × k input and 10 × k output tokens (50,000 × k nano-dollars).
fn reservation_of(reserve: u8) -> tollgate_core::Reservation {
    let k = u64::from(reserve);
    let bound = tollgate_core::TokenBound {
        input_tokens: 30 * k,
        reask_input_tokens: 0,
        output_tokens: 10 * k,
        attempts: 1,
    };
    tollgate_core::cost::reservation((reserve > 0).then_some(&bound), Some(PRICES))
}

impl fmt::Debug for BudgetSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "budget(steps {}, sources {}, scope {}, global {}, burst {}, rate {}/min, {:?})",
            self.steps, self.sources, self.scope, self.global, self.burst, self.rate, self.cost
        )
    }
}

impl BudgetSpec {
    fn budget(self) -> Budget {
        Budget {
            cost: self.cost.limits(),
            ..Budget::new(
                self.steps.into(),
                self.sources.into(),
                self.scope.into(),
                self.global.into(),
                self.burst.into(),
                self.rate.into(),
            )
            .expect("positive budget")
        }
    }
}

#[derive(Debug, Clone)]
enum OwnerSpec {
    App {
        scope: u8,
        subject: Option<u8>,
    },
    /// A run picked among every run created so far; the caller is the run's app, or with
    /// `foreign` the spec's app (which may be the other one).
    Run {
        run: Pick,
        foreign: bool,
    },
}

#[derive(Debug, Clone)]
struct ScopedSpec {
    source: u8,
    revision: u8,
    recompute: bool,
    budget: BudgetSpec,
    /// docs/conformance.md#cost-reservation: which reservation ([`reservation_of`]).
    reserve: u8,
}

#[derive(Debug, Clone)]
struct CreateSpec {
    app: u8,
    key: u8,
    owner: OwnerSpec,
    step: u8,
    input: u8,
    model: u8,
    scoped: Option<ScopedSpec>,
}

#[derive(Debug, Clone)]
enum Op {
    Create(CreateSpec),
    CreateMany(Vec<CreateSpec>),
    CreateRun {
        app: u8,
        scope: u8,
        subject: Option<u8>,
    },
    /// `worker` 0/1 names a worker.
    Claim {
        task: Pick,
        worker: u8,
    },
    ClaimNext {
        worker: u8,
        limit: u8,
    },
    Heartbeat {
        worker: u8,
        tasks: Vec<Pick>,
    },
    /// `worker` 0 = the worker holding the task (or w0), 1/2 = w0/w1. `output` 0/1 is a
    /// valid label, 2 an unknown one.
    Complete {
        task: Pick,
        worker: u8,
        output: u8,
    },
    Fail {
        task: Pick,
    },
    /// docs/budgets.md, "The reservation": a worker reserves a re-ask of `reserve`
    /// ([`reservation_of`]).
    ReserveAttempt {
        task: Pick,
        worker: u8,
        reserve: u8,
    },
    /// `own_app` false asks with the other app's identity.
    Cancel {
        task: Pick,
        own_app: bool,
    },
    MarkCanceled {
        task: Pick,
    },
    IsCancellationRequested {
        task: Pick,
    },
    /// Release by the task's effect key, from its app and scope (or the other scope).
    Release {
        task: Pick,
        own_scope: bool,
    },
    ListUnreleased {
        app: u8,
        scope: Option<u8>,
        step: Option<u8>,
        limit: u8,
    },
    DeleteOwnerData {
        app: u8,
        scope: u8,
        source: Option<u8>,
    },
    CancelRun {
        run: Pick,
        own_app: bool,
    },
    /// `own` picks among the run's own tasks (when it has any).
    WaitOnTask {
        run: Pick,
        task: Pick,
        own: bool,
    },
    FinishRun {
        run: Pick,
        succeed: bool,
    },
    FirstQueued,
    Sweep {
        batch: u8,
    },
    Advance {
        ms: i64,
    },
}

fn budget_spec() -> impl Strategy<Value = BudgetSpec> {
    (
        1u32..=3,
        1u32..=3,
        1u32..=3,
        2u32..=5,
        1u32..=3,
        prop_oneof![Just(1u32), Just(60), Just(600)],
        cost_spec(),
    )
        .prop_map(
            |(steps, sources, scope, global, burst, rate, cost)| BudgetSpec {
                steps,
                sources,
                scope,
                global,
                burst,
                rate,
                cost,
            },
        )
}

/// docs/conformance.md#cost-reservation limits: none half the time; otherwise limits that one to four reservations
/// fill.
fn cost_spec() -> impl Strategy<Value = CostSpec> {
    prop_oneof![
        1 => Just(CostSpec::NONE),
        1 => (
            proptest::option::of(60_000u64..=200_000),
            proptest::option::of((prop_oneof![Just(60u32), Just(600)], 40u32..=120)),
            proptest::option::of(100_000u64..=300_000),
        )
            .prop_map(|(usd, tokens, app_usd)| CostSpec { usd, tokens, app_usd }),
    ]
}

fn create_spec() -> impl Strategy<Value = CreateSpec> {
    let owner = prop_oneof![
        3 => (0u8..2, proptest::option::of(0u8..2))
            .prop_map(|(scope, subject)| OwnerSpec::App { scope, subject }),
        2 => (pick(), proptest::bool::weighted(0.15))
            .prop_map(|(run, foreign)| OwnerSpec::Run { run, foreign }),
    ];
    let scoped = proptest::option::weighted(
        0.8,
        (
            0u8..3,
            0u8..2,
            proptest::bool::weighted(0.15),
            budget_spec(),
            prop_oneof![1 => Just(0u8), 4 => 1u8..=3],
        )
            .prop_map(
                |(source, revision, recompute, budget, reserve)| ScopedSpec {
                    source,
                    revision,
                    recompute,
                    budget,
                    reserve,
                },
            ),
    );
    (0u8..2, 0..KEYS, owner, 0u8..2, 0u8..3, 0u8..2, scoped).prop_map(
        |(app, key, owner, step, input, model, scoped)| CreateSpec {
            app,
            key,
            owner,
            step,
            input,
            model,
            scoped,
        },
    )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        30 => create_spec().prop_map(Op::Create),
        3 => proptest::collection::vec(create_spec(), 1..4).prop_map(Op::CreateMany),
        4 => (0u8..2, 0u8..2, proptest::option::of(0u8..2))
            .prop_map(|(app, scope, subject)| Op::CreateRun { app, scope, subject }),
        10 => (pick(), 0u8..2).prop_map(|(task, worker)| Op::Claim { task, worker }),
        5 => (0u8..2, 1u8..4).prop_map(|(worker, limit)| Op::ClaimNext { worker, limit }),
        5 => (0u8..2, proptest::collection::vec(pick(), 1..4))
            .prop_map(|(worker, tasks)| Op::Heartbeat { worker, tasks }),
        10 => (pick(), prop_oneof![6 => Just(0u8), 1 => Just(1), 1 => Just(2)],
               prop_oneof![4 => Just(0u8), 4 => Just(1), 1 => Just(2)])
            .prop_map(|(task, worker, output)| Op::Complete { task, worker, output }),
        4 => pick().prop_map(|task| Op::Fail { task }),
        4 => (pick(), prop_oneof![6 => Just(0u8), 1 => Just(1)], 1u8..4)
            .prop_map(|(task, worker, reserve)| Op::ReserveAttempt { task, worker, reserve }),
        5 => (pick(), proptest::bool::weighted(0.8))
            .prop_map(|(task, own_app)| Op::Cancel { task, own_app }),
        1 => pick().prop_map(|task| Op::MarkCanceled { task }),
        2 => pick().prop_map(|task| Op::IsCancellationRequested { task }),
        4 => (pick(), proptest::bool::weighted(0.8))
            .prop_map(|(task, own_scope)| Op::Release { task, own_scope }),
        2 => (0u8..2, proptest::option::of(0u8..2), proptest::option::weighted(0.3, 0u8..2), 1u8..4)
            .prop_map(|(app, scope, step, limit)| Op::ListUnreleased { app, scope, step, limit }),
        3 => (0u8..2, 0u8..2, proptest::option::of(0u8..3))
            .prop_map(|(app, scope, source)| Op::DeleteOwnerData { app, scope, source }),
        2 => (pick(), proptest::bool::weighted(0.8))
            .prop_map(|(run, own_app)| Op::CancelRun { run, own_app }),
        6 => (pick(), pick(), proptest::bool::weighted(0.85))
            .prop_map(|(run, task, own)| Op::WaitOnTask { run, task, own }),
        1 => (pick(), any::<bool>()).prop_map(|(run, succeed)| Op::FinishRun { run, succeed }),
        1 => Just(Op::FirstQueued),
        5 => prop_oneof![Just(2u8), Just(100)].prop_map(|batch| Op::Sweep { batch }),
        8 => proptest::sample::select(&ADVANCES_MS[..]).prop_map(|ms| Op::Advance { ms }),
    ]
}

// ---------------------------------------------------------------------------------------
// Comparable answers
// ---------------------------------------------------------------------------------------

/// A task as the test refers to it: its index in the model, or an id the model does not
/// know (always a disagreement).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum TRef {
    Known(usize),
    Unknown(TaskId),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum RRef {
    Known(usize),
    Unknown(RunId),
}

#[derive(Debug, Clone, PartialEq)]
enum ErrKind {
    Admission(AdmissionRejection),
    /// docs/conformance.md#money-and-tokens refusals, compared by code (the retry time is core's arithmetic over the
    /// buckets, exercised by the conformance suite).
    Cost(ErrorCode),
    RunNotFound,
    RunCanceled,
    TaskNotFound,
    InvalidState,
    InvalidOutput,
    Other(String),
}

impl From<&StoreError> for ErrKind {
    fn from(e: &StoreError) -> Self {
        match e {
            StoreError::Admission(r) => ErrKind::Admission(*r),
            StoreError::Cost(r) => ErrKind::Cost(r.code()),
            StoreError::RunNotFound(_) => ErrKind::RunNotFound,
            StoreError::RunCanceled(_) => ErrKind::RunCanceled,
            StoreError::TaskNotFound(_) => ErrKind::TaskNotFound,
            StoreError::InvalidState(_) => ErrKind::InvalidState,
            StoreError::InvalidOutput(_) => ErrKind::InvalidOutput,
            other => ErrKind::Other(other.to_string()),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Outcome {
    Skipped,
    Created(Result<(TRef, bool), ErrKind>),
    CreatedMany(Vec<Result<(TRef, bool), ErrKind>>),
    Run(RRef),
    Claimed(Option<TRef>),
    ClaimedNext(Vec<TRef>),
    Heartbeat {
        alive: Vec<TRef>,
        stop: Vec<TRef>,
    },
    Transition(Result<TransitionView, ErrKind>),
    Canceled(Option<TransitionView>),
    Flag(bool),
    Unreleased(Vec<Vec<(String, String)>>),
    Deleted(u64),
    /// A re-ask's reservation: the task's reservation after it (tokens, nano-dollars).
    Reserved(Result<Option<(u64, i64)>, ErrKind>),
    Recoverable(Option<TRef>),
    Sweep(SweepView),
    RunCancel(Option<(RRef, BTreeSet<TRef>)>),
    Wait(Result<WaitView, ErrKind>),
    Finish(Result<Option<RRef>, ErrKind>),
}

#[derive(Debug, Clone, PartialEq)]
struct TransitionView {
    applied: bool,
    task: Option<TRef>,
    woken: BTreeSet<RRef>,
}

#[derive(Debug, Clone, PartialEq, Default)]
struct SweepView {
    queue_timed_out: u64,
    interrupted: u64,
    canceled: u64,
    runs_repaired: u64,
    admissions_pruned: u64,
    tasks_deleted: u64,
    finished: BTreeSet<TRef>,
    woken: BTreeSet<RRef>,
}

#[derive(Debug, Clone, PartialEq)]
enum WaitView {
    Waiting(RRef),
    Ready(TRef),
}

/// Every field of a task a user can observe (the request and model reference are fixed at
/// creation and checked through the cache key).
#[derive(Debug, Clone, PartialEq)]
struct TaskView {
    effect_key: String,
    step: String,
    status: TaskStatus,
    cancel_requested: bool,
    attempt: u32,
    worker: Option<String>,
    output: Option<Value>,
    usage: Option<Usage>,
    error: Option<ErrorCode>,
    cached_from: Option<TRef>,
    created_at: i64,
    claimed_at: Option<i64>,
    heartbeat_at: Option<i64>,
    completed_at: Option<i64>,
    released_at: Option<i64>,
    run: Option<RRef>,
    scope: String,
    subject: Option<String>,
    source: Option<(String, String, bool)>,
    request_input: String,
    model: String,
    has_cache_key: bool,
    /// docs/conformance.md#cost-reservation: the stored reservation (tokens, nano-dollars, taken from the bucket).
    reservation: Option<(u64, i64, bool)>,
}

#[derive(Debug, Clone, PartialEq)]
struct RunView {
    scope: String,
    subject: Option<String>,
    state: RunState,
    cancel_requested: bool,
    waiting_on: Option<TRef>,
    created_at: i64,
    updated_at: i64,
    woken_at: Option<i64>,
}

// ---------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------

/// (source, revision, input, model, subject): what the cache key hashes, besides the app
/// and scope every lookup filters on.
type CacheKey = (usize, usize, usize, usize, Option<usize>);

#[derive(Debug, Clone, PartialEq)]
enum LogicalKey {
    Cache(CacheKey),
    Task(usize),
}

#[derive(Debug, Clone)]
struct MTask {
    app: usize,
    key: u8,
    step: usize,
    input: usize,
    model: usize,
    run: Option<usize>,
    scope: usize,
    subject: Option<usize>,
    source: Option<(usize, usize, bool)>,
    cache_key: Option<CacheKey>,
    status: TaskStatus,
    cancel_requested: bool,
    attempt: u32,
    worker: Option<usize>,
    output: Option<Value>,
    usage: Option<Usage>,
    error: Option<ErrorCode>,
    cached_from: Option<usize>,
    admitted: bool,
    created_at: i64,
    claimed_at: Option<i64>,
    heartbeat_at: Option<i64>,
    completed_at: Option<i64>,
    released_at: Option<i64>,
    deleted: bool,
    /// docs/conformance.md#cost-settlement: what admission reserved, and what settlement charged (nano-dollars,
    /// tokens).
    reservation: Option<tollgate_core::Reservation>,
    charged: Option<(i64, u64)>,
    /// The cost limits it was admitted under (re-asks are checked against them).
    cost: CostSpec,
}

impl MTask {
    fn active(&self) -> bool {
        !self.deleted && matches!(self.status, TaskStatus::Queued | TaskStatus::Running)
    }
}

#[derive(Debug, Clone)]
struct MAdmission {
    app: usize,
    scope: usize,
    source: usize,
    task: usize,
    logical: Option<LogicalKey>,
    at: i64,
    pruned: bool,
}

#[derive(Debug, Clone)]
struct MRun {
    app: usize,
    scope: usize,
    subject: Option<usize>,
    state: RunState,
    cancel_requested: bool,
    waiting_on: Option<usize>,
    created_at: i64,
    updated_at: i64,
    woken_at: Option<i64>,
}

#[derive(Debug, Clone, Default)]
struct Model {
    tasks: Vec<MTask>,
    admissions: Vec<MAdmission>,
    /// (app, scope) → token bucket (units, at).
    buckets: HashMap<(usize, usize), (i64, i64)>,
    /// docs/conformance.md#cost-limits: (app, scope) → model-token bucket (units, at, capacity).
    token_buckets: HashMap<(usize, usize), (i64, i64, i64)>,
    runs: Vec<MRun>,
    now: i64,
    /// docs/conformance.md#fair-share dispatch queues: (app, scope) → (pass, active).
    queues: HashMap<(usize, usize), (i64, bool)>,
    /// docs/conformance.md#fair-share the floor each queue found when it last became active, and the pass it
    /// joined at (docs/engine.md, "Dispatch order").
    joins: HashMap<(usize, usize), (i64, i64)>,
}

fn valid_output(pick: u8) -> Value {
    match pick {
        0 => json!({"label": "spam"}),
        1 => json!({"label": "ham"}),
        _ => json!({"label": "eggs"}),
    }
}

fn completion_usage() -> Usage {
    Usage {
        input_tokens: 7,
        output_tokens: 2,
        cost_usd: Some(0.25),
        cached_input_tokens: None,
        cache_write_input_tokens: None,
        estimated: false,
        cost_nano_usd: None,
    }
}

fn request(input: usize) -> ValidatedRequest {
    ValidatedRequest::new(
        TaskKind::Classify,
        &json!({"input": INPUTS[input], "labels": ["spam", "ham"]}),
        256 * 1024,
    )
    .expect("valid request")
}

impl Model {
    fn by_key(&self, app: usize, key: u8) -> Option<usize> {
        self.tasks
            .iter()
            .position(|t| !t.deleted && t.app == app && t.key == key)
    }

    fn cancel_wanted(&self, t: &MTask) -> bool {
        t.cancel_requested
            || t.run.is_some_and(|r| {
                let run = &self.runs[r];
                run.cancel_requested || run.state == RunState::Canceled
            })
    }

    /// docs/conformance.md#cost-reservation: the reservation is replaced by what the task cost; unknown usage of a
    /// started task is its whole reservation; unused reserved tokens go back.
    fn settle(&mut self, i: usize) {
        let t = &mut self.tasks[i];
        if let Some(r) = t.reservation {
            let c = tollgate_core::cost::settle(&r, t.usage.as_ref(), t.claimed_at.is_some());
            t.charged = Some((c.nano_usd, c.tokens));
            if c.refund_tokens > 0
                && let Some(b) = self.token_buckets.get_mut(&(t.app, t.scope))
            {
                let refunded = b.0 + c.refund_tokens as i64 * TOKEN;
                b.0 = b.0.max(refunded.min(b.2));
            }
        }
    }

    /// A task leaves queued/running: failed, canceled and expired tasks free their
    /// logical key; runs waiting on it are woken.
    fn finish(
        &mut self,
        i: usize,
        status: TaskStatus,
        error: Option<ErrorCode>,
        clear_key: bool,
    ) -> Vec<usize> {
        let now = self.now;
        let t = &mut self.tasks[i];
        t.status = status;
        t.error = error;
        t.completed_at = Some(now);
        self.settle(i);
        if clear_key {
            for a in self.admissions.iter_mut().filter(|a| a.task == i) {
                a.logical = None;
            }
        }
        self.wake(i)
    }

    fn wake(&mut self, task: usize) -> Vec<usize> {
        let now = self.now;
        let mut woken = Vec::new();
        for (r, run) in self.runs.iter_mut().enumerate() {
            if run.state == RunState::Waiting && run.waiting_on == Some(task) {
                run.state = RunState::Running;
                run.waiting_on = None;
                run.woken_at = Some(now);
                run.updated_at = now;
                woken.push(r);
            }
        }
        woken
    }

    fn transition(&self, applied: bool, task: Option<usize>, woken: Vec<usize>) -> TransitionView {
        TransitionView {
            applied,
            task: task.filter(|i| !self.tasks[*i].deleted).map(TRef::Known),
            woken: woken.into_iter().map(RRef::Known).collect(),
        }
    }

    /// docs/conformance.md#admission, straight from its text, over every admission record still in the window.
    fn admit(
        &self,
        app: usize,
        scope: usize,
        source: usize,
        logical: &LogicalKey,
        b: BudgetSpec,
    ) -> Result<(i64, i64), AdmissionRejection> {
        let now = self.now;
        let window: Vec<&MAdmission> = self
            .admissions
            .iter()
            // The window is (now - 24 h, now]: a record exactly 24 h old no longer counts,
            // the same edge the sweep prunes at (`at <= now - 24 h`), so pruning never
            // changes a decision.
            .filter(|a| a.app == app && a.scope == scope && a.at > now - WINDOW_MS)
            .collect();
        let mut steps: Vec<&LogicalKey> = Vec::new();
        for a in window.iter().filter(|a| a.source == source) {
            if let Some(k) = &a.logical
                && !steps.contains(&k)
            {
                steps.push(k);
            }
        }
        if !steps.contains(&logical) && steps.len() as u32 >= b.steps {
            return Err(AdmissionRejection::SourceBudget { limit: b.steps });
        }
        let sources: BTreeSet<usize> = window.iter().map(|a| a.source).collect();
        if !sources.contains(&source) && sources.len() as u32 >= b.sources {
            return Err(AdmissionRejection::DailyBudget { limit: b.sources });
        }
        let admitted_active = |t: &&MTask| t.admitted && t.active();
        let scope_active = self
            .tasks
            .iter()
            .filter(admitted_active)
            .filter(|t| t.app == app && t.scope == scope)
            .count() as u32;
        if scope_active >= b.scope {
            return Err(AdmissionRejection::ScopeCapacity { limit: b.scope });
        }
        let global_active = self.tasks.iter().filter(admitted_active).count() as u32;
        if global_active >= b.global {
            return Err(AdmissionRejection::GlobalCapacity { limit: b.global });
        }
        // The token bucket: `burst` tokens, refilled continuously at `rate` a minute,
        // counted in 1/60,000 of a token so a millisecond refills exactly `rate` units.
        let capacity = i64::from(b.burst) * TOKEN;
        let (units, at) = self
            .buckets
            .get(&(app, scope))
            .copied()
            .unwrap_or((capacity, now));
        let units = (units + (now - at).max(0) * i64::from(b.rate)).min(capacity);
        let at = at.max(now);
        if units >= TOKEN {
            Ok((units - TOKEN, at))
        } else {
            let rate = i64::from(b.rate);
            let wait = (TOKEN - units + rate - 1) / rate;
            Err(AdmissionRejection::RateLimit {
                retry_after: Duration::from_millis(wait as u64),
            })
        }
    }

    /// docs/conformance.md#money-and-tokens after docs/conformance.md#admission, straight from its text: the spend of the window summed from
    /// every admitted task (deleted ones too: their spend stays), each at its charge once
    /// settled and at its reservation before; the window is the hourly buckets from the
    /// hour of now − 24 h (docs/budgets.md); then the token bucket; then the app's spend.
    fn admit_cost(
        &self,
        app: usize,
        scope: usize,
        c: CostSpec,
        r: &tollgate_core::Reservation,
    ) -> Result<Option<(i64, i64, i64)>, ErrKind> {
        use tollgate_core::cost::{spend_bucket, window_first_bucket};
        let now = self.now;
        let limits = c.limits();
        if limits.needs_bound() && !r.bounded {
            return Err(ErrKind::Cost(ErrorCode::OutputBoundRequired));
        }
        let first = window_first_bucket(tollgate_core::Timestamp(START.0 + now));
        let spend = |in_scope: &dyn Fn(&MTask) -> bool| -> i64 {
            self.tasks
                .iter()
                .filter(|t| t.admitted && t.app == app && in_scope(t))
                .filter(|t| spend_bucket(tollgate_core::Timestamp(START.0 + t.created_at)) >= first)
                .map(|t| match (t.charged, t.reservation) {
                    (Some((nano, _)), _) => nano,
                    (None, Some(r)) => r.nano_usd,
                    (None, None) => 0,
                })
                .sum()
        };
        if let Some(limit) = c.usd
            && spend(&|t| t.scope == scope) + r.nano_usd > limit as i64
        {
            return Err(ErrKind::Cost(ErrorCode::SpendBudget));
        }
        let bucket = match c.tokens {
            None => None,
            Some((rate, burst)) => {
                let capacity = i64::from(burst) * TOKEN;
                let (units, at, _) = self
                    .token_buckets
                    .get(&(app, scope))
                    .copied()
                    .unwrap_or((capacity, now, capacity));
                let units = (units + (now - at).max(0) * i64::from(rate)).min(capacity);
                let needed = r.tokens as i64 * TOKEN;
                if r.tokens > u64::from(burst) || units < needed {
                    return Err(ErrKind::Cost(ErrorCode::TokenRateLimit));
                }
                Some((units - needed, at.max(now), capacity))
            }
        };
        if let Some(limit) = c.app_usd
            && spend(&|_| true) + r.nano_usd > limit as i64
        {
            return Err(ErrKind::Cost(ErrorCode::SpendBudget));
        }
        Ok(bucket)
    }

    /// docs/conformance.md#create-transaction.
    /// The app a creation is made by: the run's own app for a run owner, unless `foreign`.
    fn caller(&self, spec: &CreateSpec) -> usize {
        match spec.owner {
            OwnerSpec::Run {
                run,
                foreign: false,
            } if !self.runs.is_empty() => self.runs[run.of(self.runs.len())].app,
            _ => usize::from(spec.app),
        }
    }

    fn create(&mut self, spec: &CreateSpec) -> Result<(TRef, bool), ErrKind> {
        let app = self.caller(spec);
        if let Some(i) = self.by_key(app, spec.key) {
            return Ok((TRef::Known(i), false));
        }
        let (run, scope, subject) = match &spec.owner {
            OwnerSpec::App { scope, subject } => {
                (None, usize::from(*scope), subject.map(usize::from))
            }
            OwnerSpec::Run { run: pick, .. } if self.runs.is_empty() => {
                let _ = pick;
                (None, 0, None)
            }
            OwnerSpec::Run { run: pick, .. } => {
                let r = pick.of(self.runs.len());
                let run = &self.runs[r];
                if run.app != app {
                    return Err(ErrKind::RunNotFound);
                }
                if run.cancel_requested || run.state == RunState::Canceled {
                    return Err(ErrKind::RunCanceled);
                }
                (Some(r), run.scope, run.subject)
            }
        };
        let idx = self.tasks.len();
        let now = self.now;
        let mut task = MTask {
            app,
            key: spec.key,
            step: usize::from(spec.step),
            input: usize::from(spec.input),
            model: usize::from(spec.model),
            run,
            scope,
            subject,
            source: None,
            cache_key: None,
            status: TaskStatus::Queued,
            cancel_requested: false,
            attempt: 0,
            worker: None,
            output: None,
            usage: None,
            error: None,
            cached_from: None,
            admitted: false,
            created_at: now,
            claimed_at: None,
            heartbeat_at: None,
            completed_at: None,
            released_at: None,
            deleted: false,
            reservation: None,
            charged: None,
            cost: CostSpec::NONE,
        };
        if let Some(s) = &spec.scoped {
            let (source, revision) = (usize::from(s.source), usize::from(s.revision));
            task.source = Some((source, revision, s.recompute));
            let key: CacheKey = (source, revision, task.input, task.model, subject);
            task.cache_key = Some(key);
            let hit = if s.recompute {
                None
            } else {
                // Newest success first: latest completion, then the later task.
                self.tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| {
                        !t.deleted
                            && t.app == app
                            && t.scope == scope
                            && t.status == TaskStatus::Succeeded
                            && t.cache_key == Some(key)
                    })
                    .max_by_key(|(i, t)| (t.completed_at, *i))
                    .map(|(i, t)| (i, t.output.clone()))
            };
            if let Some((from, output)) = hit {
                task.status = TaskStatus::Succeeded;
                task.cached_from = Some(from);
                task.output = output;
                task.usage = Some(Usage::default());
                task.completed_at = Some(now);
            } else {
                let logical = if s.recompute {
                    LogicalKey::Task(idx)
                } else {
                    LogicalKey::Cache(key)
                };
                let bucket = self
                    .admit(app, scope, source, &logical, s.budget)
                    .map_err(ErrKind::Admission)?;
                let mut r = reservation_of(s.reserve);
                let tokens = self.admit_cost(app, scope, s.budget.cost, &r)?;
                r.from_token_bucket = tokens.is_some();
                if let Some(t) = tokens {
                    self.token_buckets.insert((app, scope), t);
                }
                task.reservation = Some(r);
                task.cost = s.budget.cost;
                self.buckets.insert((app, scope), bucket);
                self.admissions.push(MAdmission {
                    app,
                    scope,
                    source,
                    task: idx,
                    logical: Some(logical),
                    at: now,
                    pruned: false,
                });
                task.admitted = true;
            }
        }
        if task.status == TaskStatus::Queued {
            self.activate_queue(app, scope);
        }
        self.tasks.push(task);
        Ok((TRef::Known(idx), true))
    }

    /// docs/conformance.md#fair-share: a queued task activates its queue; a new or idle one joins one burst
    /// (`join_credit`) below the floor (the least standing of the active queues: a
    /// queue's pass, or its base while its pass is below it), but no earlier than one
    /// stride after its app's furthest fresh queue (active, nothing claimed since it
    /// joined); at the greatest pass of all when none is active; or at its own pass when
    /// that is ahead.
    fn activate_queue(&mut self, app: usize, scope: usize) {
        if self
            .queues
            .get(&(app, scope))
            .is_some_and(|(_, active)| *active)
        {
            return;
        }
        let active: Vec<((usize, usize), i64)> = self
            .queues
            .iter()
            .filter(|(_, (_, a))| *a)
            .map(|(k, (p, _))| (*k, *p))
            .collect();
        let floor = active
            .iter()
            .map(|(k, pass)| (*pass).max(self.joins[k].0))
            .min();
        let top = self
            .queues
            .values()
            .map(|(pass, _)| *pass)
            .max()
            .unwrap_or(0);
        let start = match floor {
            None => top,
            Some(floor) => {
                let below = floor - join_credit(Weight::default());
                let fresh = active
                    .iter()
                    .filter(|(k, pass)| k.0 == app && *pass == self.joins[k].1)
                    .map(|(_, pass)| *pass)
                    .max();
                match fresh {
                    Some(f) if f + stride(Weight::default()) > below => {
                        f + stride(Weight::default())
                    }
                    _ => below,
                }
            }
        };
        let entry = self.queues.entry((app, scope)).or_insert((start, false));
        entry.0 = entry.0.max(start);
        entry.1 = true;
        let pass = entry.0;
        self.joins
            .insert((app, scope), (floor.unwrap_or(top), pass));
    }

    /// docs/conformance.md#fair-share fair claim, as the store runs it: rounds of the stride plan over the
    /// active queues with the least pass (then app and scope names).
    fn claim_fair(&mut self, worker: usize, limit: usize) -> Vec<usize> {
        let mut claimed: Vec<usize> = Vec::new();
        // Queues that gave fewer than planned: left out of later rounds.
        let mut spent: Vec<(usize, usize)> = Vec::new();
        loop {
            let want = limit - claimed.len();
            if want == 0 {
                break;
            }
            let mut active: Vec<((usize, usize), i64)> = self
                .queues
                .iter()
                .filter(|(k, (_, a))| *a && !spent.contains(k))
                .map(|(k, (p, _))| (*k, *p))
                .collect();
            active.sort_by_key(|((a, s), p)| (*p, APPS[*a], SCOPES[*s]));
            active.truncate(want.min(MAX_CLAIM_QUEUES as usize));
            let mut short = false;
            if active.is_empty() {
                break;
            }
            let shares: Vec<QueueShare> = active
                .iter()
                .map(|(_, p)| QueueShare {
                    pass: *p,
                    weight: Weight::default(),
                })
                .collect();
            let plan = allocate_claims(&shares, want as u32);
            for ((q, _), take) in active.into_iter().zip(plan) {
                if take == 0 {
                    continue;
                }
                let mut order: Vec<usize> = (0..self.tasks.len())
                    .filter(|i| {
                        let t = &self.tasks[*i];
                        (t.app, t.scope) == q && self.claimable(t)
                    })
                    .collect();
                order.sort_by_key(|i| (self.tasks[*i].created_at, *i));
                order.truncate(take as usize);
                for i in &order {
                    self.claim(*i, worker);
                }
                let got = order.len() as u32;
                if let Some(entry) = self.queues.get_mut(&q) {
                    entry.0 += i64::from(got) * stride(Weight::default());
                }
                if got < take {
                    short = true;
                    spent.push(q);
                }
                // Only a queue that gave nothing is checked for emptiness.
                if got == 0 {
                    let queued = self.tasks.iter().any(|t| {
                        !t.deleted && (t.app, t.scope) == q && t.status == TaskStatus::Queued
                    });
                    if !queued && let Some(entry) = self.queues.get_mut(&q) {
                        entry.1 = false;
                    }
                }
                claimed.extend(order);
            }
            if !short {
                break;
            }
        }
        claimed.sort_by_key(|i| (self.tasks[*i].created_at, *i));
        claimed
    }

    /// The run and task of a wait: with `own`, a run-owned task and its run (when there
    /// is one); otherwise any run and any task.
    fn wait_target(&self, run: Pick, task: Pick, own: bool) -> Option<(usize, usize)> {
        if self.runs.is_empty() || self.tasks.is_empty() {
            return None;
        }
        let owned: Vec<usize> = (0..self.tasks.len())
            .filter(|i| self.tasks[*i].run.is_some())
            .collect();
        if own && !owned.is_empty() {
            let i = owned[task.of(owned.len())];
            return Some((self.tasks[i].run.expect("run-owned"), i));
        }
        Some((run.of(self.runs.len()), task.of(self.tasks.len())))
    }

    fn claimable(&self, t: &MTask) -> bool {
        !t.deleted && t.status == TaskStatus::Queued && !self.cancel_wanted(t)
    }

    fn claim(&mut self, i: usize, worker: usize) -> bool {
        if !self.claimable(&self.tasks[i]) {
            return false;
        }
        let now = self.now;
        let t = &mut self.tasks[i];
        t.status = TaskStatus::Running;
        t.worker = Some(worker);
        t.attempt += 1;
        t.claimed_at = Some(now);
        t.heartbeat_at = Some(now);
        true
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        let n_tasks = self.tasks.len();
        let pick = |i: &Pick| (n_tasks > 0).then(|| i.of(n_tasks));
        let n_runs = self.runs.len();
        let pick_run = |i: &Pick| (n_runs > 0).then(|| i.of(n_runs));
        match op {
            Op::Create(spec) => Outcome::Created(self.create(spec)),
            Op::CreateMany(specs) => {
                Outcome::CreatedMany(specs.iter().map(|s| self.create(s)).collect())
            }
            Op::CreateRun {
                app,
                scope,
                subject,
            } => {
                self.runs.push(MRun {
                    app: usize::from(*app),
                    scope: usize::from(*scope),
                    subject: subject.map(usize::from),
                    state: RunState::Running,
                    cancel_requested: false,
                    waiting_on: None,
                    created_at: self.now,
                    updated_at: self.now,
                    woken_at: None,
                });
                Outcome::Run(RRef::Known(self.runs.len() - 1))
            }
            Op::Claim { task, worker } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                Outcome::Claimed(
                    self.claim(i, usize::from(*worker))
                        .then_some(TRef::Known(i)),
                )
            }
            Op::ClaimNext { worker, limit } => {
                let order = self.claim_fair(usize::from(*worker), usize::from(*limit));
                Outcome::ClaimedNext(order.into_iter().map(TRef::Known).collect())
            }
            Op::Heartbeat { worker, tasks } => {
                let Some(_) = pick(&tasks[0]) else {
                    return Outcome::Skipped;
                };
                let ids = heartbeat_ids(tasks, n_tasks);
                let (mut alive, mut stop) = (Vec::new(), Vec::new());
                for i in ids {
                    let t = &self.tasks[i];
                    if !t.deleted
                        && t.status == TaskStatus::Running
                        && t.worker == Some(usize::from(*worker))
                        && !self.cancel_wanted(t)
                    {
                        self.tasks[i].heartbeat_at = Some(self.now);
                        alive.push(TRef::Known(i));
                    } else {
                        stop.push(TRef::Known(i));
                    }
                }
                Outcome::Heartbeat { alive, stop }
            }
            Op::Complete {
                task,
                worker,
                output,
            } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                let w = complete_worker(self.tasks[i].worker, *worker);
                let t = &self.tasks[i];
                if t.deleted {
                    return Outcome::Transition(Ok(self.transition(false, None, vec![])));
                }
                let parsed = request(t.input);
                let Ok(normalized) = validate_output(parsed.request(), &valid_output(*output))
                else {
                    return Outcome::Transition(Err(ErrKind::InvalidOutput));
                };
                if t.status == TaskStatus::Running && t.worker == Some(w) && !self.cancel_wanted(t)
                {
                    let t = &mut self.tasks[i];
                    t.output = Some(normalized);
                    t.usage = Some(completion_usage());
                    let woken = self.finish(i, TaskStatus::Succeeded, None, false);
                    Outcome::Transition(Ok(self.transition(true, Some(i), woken)))
                } else {
                    Outcome::Transition(Ok(self.transition(false, Some(i), vec![])))
                }
            }
            Op::Fail { task } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                if self.tasks[i].active() {
                    // docs/conformance.md#money-and-tokens: a failure records what its attempts used.
                    self.tasks[i].usage = Some(completion_usage());
                    let woken =
                        self.finish(i, TaskStatus::Failed, Some(ErrorCode::ProviderError), true);
                    Outcome::Transition(Ok(self.transition(true, Some(i), woken)))
                } else {
                    Outcome::Transition(Ok(self.transition(false, Some(i), vec![])))
                }
            }
            Op::ReserveAttempt {
                task,
                worker,
                reserve,
            } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                let t = &self.tasks[i];
                let held = !t.deleted
                    && t.status == TaskStatus::Running
                    && t.worker == Some(usize::from(*worker))
                    && !self.cancel_wanted(t);
                let (Some(current), true) = (t.reservation, held) else {
                    return Outcome::Reserved(Ok(None));
                };
                let (app, scope, cost) = (t.app, t.scope, t.cost);
                let attempt = reservation_of(*reserve);
                let tokens = match self.admit_cost(app, scope, cost, &attempt) {
                    Ok(tokens) => tokens,
                    Err(e) => return Outcome::Reserved(Err(e)),
                };
                if let Some(b) = tokens {
                    self.token_buckets.insert((app, scope), b);
                }
                let mut after = current.plus(&attempt);
                after.from_token_bucket |= tokens.is_some();
                self.tasks[i].reservation = Some(after);
                Outcome::Reserved(Ok(Some((after.tokens, after.nano_usd))))
            }
            Op::Cancel { task, own_app } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                let t = &self.tasks[i];
                if t.deleted || !own_app {
                    return Outcome::Canceled(None);
                }
                if t.active() {
                    self.tasks[i].cancel_requested = true;
                    let woken =
                        self.finish(i, TaskStatus::Canceled, Some(ErrorCode::Canceled), true);
                    Outcome::Canceled(Some(self.transition(true, Some(i), woken)))
                } else {
                    Outcome::Canceled(Some(self.transition(false, Some(i), vec![])))
                }
            }
            Op::MarkCanceled { task } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                let t = &self.tasks[i];
                if t.active() && self.cancel_wanted(t) {
                    self.tasks[i].cancel_requested = true;
                    let woken =
                        self.finish(i, TaskStatus::Canceled, Some(ErrorCode::Canceled), true);
                    Outcome::Transition(Ok(self.transition(true, Some(i), woken)))
                } else {
                    Outcome::Transition(Ok(self.transition(false, Some(i), vec![])))
                }
            }
            Op::IsCancellationRequested { task } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                let t = &self.tasks[i];
                Outcome::Flag(
                    t.deleted || t.status == TaskStatus::Canceled || self.cancel_wanted(t),
                )
            }
            Op::Release { task, own_scope } => {
                let Some(i) = pick(task) else {
                    return Outcome::Skipped;
                };
                let t = &self.tasks[i];
                let scope = if *own_scope { t.scope } else { 1 - t.scope };
                let (app, key) = (t.app, t.key);
                let now = self.now;
                let mut matched = false;
                for t in self.tasks.iter_mut().filter(|t| {
                    !t.deleted
                        && t.app == app
                        && t.key == key
                        && t.scope == scope
                        && t.run.is_none()
                }) {
                    t.released_at = t.released_at.or(Some(now));
                    matched = true;
                }
                Outcome::Flag(matched)
            }
            Op::ListUnreleased {
                app,
                scope,
                step,
                limit,
            } => {
                let mut all: Vec<(String, String)> = self
                    .tasks
                    .iter()
                    .filter(|t| {
                        !t.deleted
                            && t.app == usize::from(*app)
                            && t.run.is_none()
                            && t.released_at.is_none()
                            && t.source.is_some()
                            && scope.is_none_or(|s| t.scope == usize::from(s))
                            && step.is_none_or(|s| t.step == usize::from(s))
                    })
                    .map(|t| {
                        (
                            SCOPES[t.scope].to_string(),
                            SOURCES[t.source.expect("scoped").0].to_string(),
                        )
                    })
                    .collect::<BTreeSet<_>>()
                    .into_iter()
                    .collect();
                // Pages of `limit`; a page has a next cursor only when more follows, so
                // there is never a trailing empty page (one empty page when none match).
                let mut pages = Vec::new();
                loop {
                    let page: Vec<_> = all.drain(..all.len().min(usize::from(*limit))).collect();
                    pages.push(page);
                    if all.is_empty() {
                        break;
                    }
                }
                Outcome::Unreleased(pages)
            }
            Op::DeleteOwnerData { app, scope, source } => {
                let picked: Vec<usize> = (0..self.tasks.len())
                    .filter(|&i| {
                        let t = &self.tasks[i];
                        !t.deleted
                            && t.app == usize::from(*app)
                            && t.scope == usize::from(*scope)
                            && t.run.is_none()
                            && source.is_none_or(|s| t.source.map(|x| x.0) == Some(usize::from(s)))
                    })
                    .collect();
                for &i in &picked {
                    // docs/budgets.md, "Settlement": a deleted in-flight task settles as a
                    // cancel does.
                    if self.tasks[i].active() {
                        self.settle(i);
                    }
                    self.tasks[i].deleted = true;
                }
                Outcome::Deleted(picked.len() as u64)
            }
            Op::CancelRun { run, own_app } => {
                let Some(r) = pick_run(run) else {
                    return Outcome::Skipped;
                };
                if !own_app {
                    return Outcome::RunCancel(None);
                }
                let now = self.now;
                let run = &mut self.runs[r];
                run.cancel_requested = true;
                if matches!(run.state, RunState::Running | RunState::Waiting) {
                    run.state = RunState::Canceled;
                    run.waiting_on = None;
                }
                run.updated_at = now;
                let mut canceled = BTreeSet::new();
                for i in 0..self.tasks.len() {
                    if self.tasks[i].run == Some(r) && self.tasks[i].active() {
                        self.tasks[i].cancel_requested = true;
                        self.finish(i, TaskStatus::Canceled, Some(ErrorCode::Canceled), true);
                        canceled.insert(TRef::Known(i));
                    }
                }
                Outcome::RunCancel(Some((RRef::Known(r), canceled)))
            }
            Op::WaitOnTask { run, task, own } => {
                let Some((r, i)) = self.wait_target(*run, *task, *own) else {
                    return Outcome::Skipped;
                };
                let run_app = self.runs[r].app;
                if self.runs[r].state.is_terminal() {
                    return Outcome::Wait(Err(ErrKind::InvalidState));
                }
                let t = &self.tasks[i];
                if t.deleted || t.app != run_app || t.run != Some(r) {
                    return Outcome::Wait(Err(ErrKind::TaskNotFound));
                }
                if t.status.is_terminal() {
                    return Outcome::Wait(Ok(WaitView::Ready(TRef::Known(i))));
                }
                let now = self.now;
                let run = &mut self.runs[r];
                run.state = RunState::Waiting;
                run.waiting_on = Some(i);
                run.updated_at = now;
                Outcome::Wait(Ok(WaitView::Waiting(RRef::Known(r))))
            }
            Op::FinishRun { run, succeed } => {
                let Some(r) = pick_run(run) else {
                    return Outcome::Skipped;
                };
                let now = self.now;
                let run = &mut self.runs[r];
                if run.state.is_terminal() {
                    return Outcome::Finish(Err(ErrKind::InvalidState));
                }
                run.state = if *succeed {
                    RunState::Succeeded
                } else {
                    RunState::Failed
                };
                run.waiting_on = None;
                run.updated_at = now;
                Outcome::Finish(Ok(Some(RRef::Known(r))))
            }
            Op::FirstQueued => {
                // The oldest queued task: creation time, then id (creation) order.
                let first = (0..self.tasks.len())
                    .filter(|i| {
                        !self.tasks[*i].deleted && self.tasks[*i].status == TaskStatus::Queued
                    })
                    .min_by_key(|i| (self.tasks[*i].created_at, *i))
                    .map(TRef::Known);
                Outcome::Recoverable(first)
            }
            Op::Sweep { .. } => Outcome::Sweep(self.sweep()),
            Op::Advance { ms } => {
                self.now += ms;
                Outcome::Skipped
            }
        }
    }

    /// docs/conformance.md#sweeps, all batches.
    fn sweep(&mut self) -> SweepView {
        let now = self.now;
        let mut v = SweepView::default();
        for i in 0..self.tasks.len() {
            let t = &self.tasks[i];
            let expired = !t.deleted
                && match t.status {
                    TaskStatus::Queued => t.created_at <= now - QUEUE_TIMEOUT_MS,
                    TaskStatus::Running => t.heartbeat_at.is_some_and(|h| h <= now - LIVENESS_MS),
                    _ => false,
                };
            if !expired {
                continue;
            }
            let woken = if self.cancel_wanted(t) {
                v.canceled += 1;
                self.tasks[i].cancel_requested = true;
                self.finish(i, TaskStatus::Canceled, Some(ErrorCode::Canceled), true)
            } else if t.status == TaskStatus::Queued {
                v.queue_timed_out += 1;
                self.finish(i, TaskStatus::Failed, Some(ErrorCode::QueueTimeout), true)
            } else {
                v.interrupted += 1;
                self.finish(i, TaskStatus::Failed, Some(ErrorCode::Interrupted), true)
            };
            v.finished.insert(TRef::Known(i));
            v.woken.extend(woken.into_iter().map(RRef::Known));
        }
        for a in self.admissions.iter_mut() {
            if !a.pruned && a.at <= now - WINDOW_MS {
                a.pruned = true;
                v.admissions_pruned += 1;
            }
        }
        for t in self.tasks.iter_mut() {
            if !t.deleted
                && t.run.is_none()
                && t.status.is_terminal()
                && t.released_at.is_some_and(|r| r <= now - RETENTION_MS)
                && t.completed_at.is_some_and(|c| c <= now - RETENTION_MS)
            {
                t.deleted = true;
                v.tasks_deleted += 1;
            }
        }
        v
    }

    fn task_view(&self, i: usize) -> TaskView {
        let t = &self.tasks[i];
        TaskView {
            effect_key: format!("k{}", t.key),
            step: STEPS[t.step].to_string(),
            status: t.status,
            cancel_requested: t.cancel_requested,
            attempt: t.attempt,
            worker: t.worker.map(|w| WORKERS[w].to_string()),
            output: t.output.clone(),
            usage: t.usage,
            error: t.error,
            cached_from: t.cached_from.map(TRef::Known),
            created_at: t.created_at,
            claimed_at: t.claimed_at,
            heartbeat_at: t.heartbeat_at,
            completed_at: t.completed_at,
            released_at: t.released_at,
            run: t.run.map(RRef::Known),
            scope: SCOPES[t.scope].to_string(),
            subject: t.subject.map(|s| format!("user:{}", SUBJECTS[s])),
            source: t
                .source
                .map(|(s, r, re)| (SOURCES[s].to_string(), REVISIONS[r].to_string(), re)),
            request_input: INPUTS[t.input].to_string(),
            model: MODELS[t.model].to_string(),
            has_cache_key: t.cache_key.is_some(),
            reservation: t
                .reservation
                .map(|r| (r.tokens, r.nano_usd, r.from_token_bucket)),
        }
    }

    fn run_view(&self, r: usize) -> RunView {
        let run = &self.runs[r];
        RunView {
            scope: SCOPES[run.scope].to_string(),
            subject: run.subject.map(|s| format!("user:{}", SUBJECTS[s])),
            state: run.state,
            cancel_requested: run.cancel_requested,
            waiting_on: run.waiting_on.map(TRef::Known),
            created_at: run.created_at,
            updated_at: run.updated_at,
            woken_at: run.woken_at,
        }
    }
}

/// The distinct tasks a heartbeat names, in order.
fn heartbeat_ids(tasks: &[Pick], n: usize) -> Vec<usize> {
    let mut ids = Vec::new();
    for t in tasks {
        let i = t.of(n);
        if !ids.contains(&i) {
            ids.push(i);
        }
    }
    ids
}

/// Which worker completes: the holder (or w0), w0 or w1.
fn complete_worker(holder: Option<usize>, pick: u8) -> usize {
    match pick {
        0 => holder.unwrap_or(0),
        1 => 0,
        _ => 1,
    }
}

// ---------------------------------------------------------------------------------------
// The store side
// ---------------------------------------------------------------------------------------

fn app_id(i: usize) -> AppId {
    AppId::new(APPS[i]).expect("app id")
}

fn scope_id(i: usize) -> ScopeId {
    ScopeId::new(SCOPES[i]).expect("scope id")
}

fn worker_id(i: usize) -> WorkerId {
    WorkerId::new(WORKERS[i]).expect("worker id")
}

fn subject(i: usize) -> Subject {
    Subject {
        kind: SubjectKind::User,
        id: SUBJECTS[i].to_string(),
    }
}

struct Harness {
    stores: Vec<Arc<dyn Store>>,
    clock: ManualClock,
    model: Model,
    task_ids: Vec<TaskId>,
    tasks: HashMap<TaskId, usize>,
    run_ids: Vec<RunId>,
    runs: HashMap<RunId, usize>,
    step: usize,
}

impl Harness {
    fn store(&self) -> &dyn Store {
        &*self.stores[self.step % self.stores.len()]
    }

    fn tref(&self, id: TaskId) -> TRef {
        self.tasks
            .get(&id)
            .map_or(TRef::Unknown(id), |i| TRef::Known(*i))
    }

    fn rref(&self, id: RunId) -> RRef {
        self.runs
            .get(&id)
            .map_or(RRef::Unknown(id), |i| RRef::Known(*i))
    }

    /// A created task the model does not know yet gets the model's next index, so the
    /// comparison that follows decides whether the model expected it.
    fn register(&mut self, id: TaskId, created: bool, fresh: &mut usize) -> TRef {
        if created && !self.tasks.contains_key(&id) {
            let idx = self.model.tasks.len() + *fresh;
            *fresh += 1;
            self.tasks.insert(id, idx);
            if self.task_ids.len() <= idx {
                self.task_ids.resize(idx + 1, id);
            }
            self.task_ids[idx] = id;
        }
        self.tref(id)
    }

    fn new_task(&self, spec: &CreateSpec) -> NewTask {
        let app = self.model.caller(spec);
        let owner = match &spec.owner {
            OwnerSpec::Run { run, .. } if !self.run_ids.is_empty() => Owner::Run {
                app: app_id(app),
                run_id: self.run_ids[run.of(self.run_ids.len())],
            },
            OwnerSpec::Run { .. } => Owner::Application {
                app: app_id(app),
                scope: scope_id(0),
                subject: None,
            },
            OwnerSpec::App { scope, subject: s } => Owner::Application {
                app: app_id(app),
                scope: scope_id(usize::from(*scope)),
                subject: s.map(|s| subject(usize::from(s))),
            },
        };
        NewTask {
            cost: None,
            dispatch: tollgate_core::Dispatch::default(),
            owner,
            step: StepKey::new(STEPS[usize::from(spec.step)]).expect("step"),
            effect_key: EffectKey::new(format!("k{}", spec.key)).expect("key"),
            request: request(usize::from(spec.input)),
            model: ModelId::new("default").expect("model id"),
            model_ref: ModelRef::new("dev", MODELS[usize::from(spec.model)]),
            scope: spec.scoped.as_ref().map(|s| TaskScope {
                source_id: SourceId::new(SOURCES[usize::from(s.source)]).expect("source"),
                source_revision: SourceRevision::new(REVISIONS[usize::from(s.revision)])
                    .expect("revision"),
                recompute: s.recompute,
                budget: s.budget.budget(),
                reservation: reservation_of(s.reserve),
            }),
            trace_parent: None,
            max_attempts: tollgate_core::MaxAttempts::ONE,
            released: false,
            claim_by: None,
        }
    }

    fn transition_view(&self, t: &tollgate_store::Transition) -> TransitionView {
        TransitionView {
            applied: t.applied,
            task: t.task.as_ref().map(|t| self.tref(t.id)),
            woken: t.woken_runs.iter().map(|r| self.rref(*r)).collect(),
        }
    }

    /// Runs one operation on the store and returns its answer in the model's terms.
    async fn apply(&mut self, op: &Op) -> Result<Outcome, String> {
        let n_tasks = self.task_ids.len();
        let pick = |i: &Pick| (n_tasks > 0).then(|| i.of(n_tasks));
        let n_runs = self.run_ids.len();
        let pick_run = |i: &Pick| (n_runs > 0).then(|| i.of(n_runs));
        let fatal = |what: &str, e: StoreError| format!("{what} failed: {e:?}");
        Ok(match op {
            Op::Create(spec) => {
                let new = self.new_task(spec);
                let mut fresh = 0;
                Outcome::Created(match self.store().create_task(new).await {
                    Ok(c) => Ok((self.register(c.task.id, c.created, &mut fresh), c.created)),
                    Err(e) => Err(ErrKind::from(&e)),
                })
            }
            Op::CreateMany(specs) => {
                let news = specs.iter().map(|s| self.new_task(s)).collect();
                let answers = self
                    .store()
                    .create_tasks(news)
                    .await
                    .map_err(|e| fatal("create_tasks", e))?;
                let mut fresh = 0;
                let mut out = Vec::new();
                for a in answers {
                    out.push(match a {
                        Ok(c) => Ok((self.register(c.task.id, c.created, &mut fresh), c.created)),
                        Err(e) => Err(ErrKind::from(&e)),
                    });
                }
                Outcome::CreatedMany(out)
            }
            Op::CreateRun {
                app,
                scope,
                subject: s,
            } => {
                let run = self
                    .store()
                    .create_run(NewRun {
                        trace_parent: None,
                        app: app_id(usize::from(*app)),
                        scope: scope_id(usize::from(*scope)),
                        subject: s.map(|s| subject(usize::from(s))),
                        input: json!({"step": self.step}),
                    })
                    .await
                    .map_err(|e| fatal("create_run", e))?;
                let idx = self.run_ids.len();
                self.run_ids.push(run.id);
                self.runs.insert(run.id, idx);
                Outcome::Run(self.rref(run.id))
            }
            Op::Claim { task, worker } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                let claimed = self
                    .store()
                    .claim_task(self.task_ids[i], &worker_id(usize::from(*worker)))
                    .await
                    .map_err(|e| fatal("claim_task", e))?;
                Outcome::Claimed(claimed.map(|t| self.tref(t.id)))
            }
            Op::ClaimNext { worker, limit } => {
                let claimed = self
                    .store()
                    .claim_next(&worker_id(usize::from(*worker)), u32::from(*limit))
                    .await
                    .map_err(|e| fatal("claim_next", e))?;
                Outcome::ClaimedNext(claimed.iter().map(|t| self.tref(t.id)).collect())
            }
            Op::Heartbeat { worker, tasks } => {
                if n_tasks == 0 {
                    return Ok(Outcome::Skipped);
                }
                // Each task under the claim the model last saw it claimed by (its tasks
                // have one try: claim 1).
                let held: Vec<(TaskId, u32)> = heartbeat_ids(tasks, n_tasks)
                    .into_iter()
                    .map(|i| (self.task_ids[i], self.model.tasks[i].attempt.max(1)))
                    .collect();
                let report = self
                    .store()
                    .heartbeat(&worker_id(usize::from(*worker)), &held)
                    .await
                    .map_err(|e| fatal("heartbeat", e))?;
                Outcome::Heartbeat {
                    alive: report.alive.iter().map(|(id, _)| self.tref(*id)).collect(),
                    stop: report.stop.iter().map(|(id, _)| self.tref(*id)).collect(),
                }
            }
            Op::Complete {
                task,
                worker,
                output,
            } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                let w = complete_worker(self.model.tasks[i].worker, *worker);
                let answer = self
                    .store()
                    .complete_task(
                        self.task_ids[i],
                        &Lease::new(worker_id(w), self.model.tasks[i].attempt.max(1)),
                        valid_output(*output),
                        completion_usage(),
                    )
                    .await;
                Outcome::Transition(match answer {
                    Ok(t) => Ok(self.transition_view(&t)),
                    Err(e) => Err(ErrKind::from(&e)),
                })
            }
            Op::Fail { task } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                let answer = self
                    .store()
                    .fail_task(
                        self.task_ids[i],
                        None,
                        ErrorCode::ProviderError,
                        "the provider broke",
                        Some(&completion_usage()),
                    )
                    .await;
                Outcome::Transition(match answer {
                    Ok(t) => Ok(self.transition_view(&t)),
                    Err(e) => Err(ErrKind::from(&e)),
                })
            }
            Op::ReserveAttempt {
                task,
                worker,
                reserve,
            } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                let answer = self
                    .store()
                    .reserve_attempt(
                        self.task_ids[i],
                        &Lease::new(
                            worker_id(usize::from(*worker)),
                            self.model.tasks[i].attempt.max(1),
                        ),
                        &reservation_of(*reserve),
                    )
                    .await;
                Outcome::Reserved(match answer {
                    Ok(r) => Ok(r.map(|r| (r.tokens, r.nano_usd))),
                    Err(e @ StoreError::Cost(_)) => Err(ErrKind::from(&e)),
                    Err(e) => return Err(fatal("reserve_attempt", e)),
                })
            }
            Op::Cancel { task, own_app } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                let app = self.model.tasks[i].app;
                let asker = if *own_app { app } else { 1 - app };
                let answer = self
                    .store()
                    .request_cancel(&app_id(asker), self.task_ids[i])
                    .await
                    .map_err(|e| fatal("request_cancel", e))?;
                Outcome::Canceled(answer.map(|t| self.transition_view(&t)))
            }
            Op::MarkCanceled { task } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                let answer = self.store().mark_canceled(self.task_ids[i]).await;
                Outcome::Transition(match answer {
                    Ok(t) => Ok(self.transition_view(&t)),
                    Err(e) => Err(ErrKind::from(&e)),
                })
            }
            Op::IsCancellationRequested { task } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                Outcome::Flag(
                    self.store()
                        .is_cancellation_requested(self.task_ids[i])
                        .await
                        .map_err(|e| fatal("is_cancellation_requested", e))?,
                )
            }
            Op::Release { task, own_scope } => {
                let Some(i) = pick(task) else {
                    return Ok(Outcome::Skipped);
                };
                let t = &self.model.tasks[i];
                let scope = if *own_scope { t.scope } else { 1 - t.scope };
                let key = EffectKey::new(format!("k{}", t.key)).expect("key");
                Outcome::Flag(
                    self.store()
                        .release(&app_id(t.app), &scope_id(scope), &key)
                        .await
                        .map_err(|e| fatal("release", e))?,
                )
            }
            Op::ListUnreleased {
                app,
                scope,
                step,
                limit,
            } => {
                let mut pages = Vec::new();
                let mut after: Option<ScopedSource> = None;
                for _ in 0..50 {
                    let page = self
                        .store()
                        .list_unreleased_sources(
                            &app_id(usize::from(*app)),
                            &UnreleasedQuery {
                                scope: scope.map(|s| scope_id(usize::from(s))),
                                step: step
                                    .map(|s| StepKey::new(STEPS[usize::from(s)]).expect("step")),
                                after: after.clone(),
                                limit: u32::from(*limit),
                                subject: None,
                            },
                        )
                        .await
                        .map_err(|e| fatal("list_unreleased_sources", e))?;
                    pages.push(
                        page.sources
                            .iter()
                            .map(|p| (p.scope.to_string(), p.source.to_string()))
                            .collect(),
                    );
                    match page.next {
                        Some(next) => after = Some(next),
                        None => break,
                    }
                }
                Outcome::Unreleased(pages)
            }
            Op::DeleteOwnerData { app, scope, source } => Outcome::Deleted(
                self.store()
                    .delete_owner_data(
                        &app_id(usize::from(*app)),
                        &scope_id(usize::from(*scope)),
                        source
                            .map(|s| SourceId::new(SOURCES[usize::from(s)]).expect("source"))
                            .as_ref(),
                    )
                    .await
                    .map_err(|e| fatal("delete_owner_data", e))?,
            ),
            Op::CancelRun { run, own_app } => {
                let Some(r) = pick_run(run) else {
                    return Ok(Outcome::Skipped);
                };
                let app = self.model.runs[r].app;
                let asker = if *own_app { app } else { 1 - app };
                let answer = self
                    .store()
                    .request_run_cancel(&app_id(asker), self.run_ids[r])
                    .await
                    .map_err(|e| fatal("request_run_cancel", e))?;
                Outcome::RunCancel(answer.map(|c| {
                    (
                        self.rref(c.run.id),
                        c.canceled_tasks.iter().map(|id| self.tref(*id)).collect(),
                    )
                }))
            }
            Op::WaitOnTask { run, task, own } => {
                let Some((r, i)) = self.model.wait_target(*run, *task, *own) else {
                    return Ok(Outcome::Skipped);
                };
                let app = self.model.runs[r].app;
                let answer = self
                    .store()
                    .wait_on_task(&app_id(app), self.run_ids[r], self.task_ids[i])
                    .await;
                Outcome::Wait(match answer {
                    Ok(WaitOutcome::Waiting(run)) => Ok(WaitView::Waiting(self.rref(run.id))),
                    Ok(WaitOutcome::Ready(task)) => Ok(WaitView::Ready(self.tref(task.id))),
                    Err(e) => Err(ErrKind::from(&e)),
                })
            }
            Op::FinishRun { run, succeed } => {
                let Some(r) = pick_run(run) else {
                    return Ok(Outcome::Skipped);
                };
                let result = if *succeed {
                    RunResult::Succeeded(json!({"done": true}))
                } else {
                    RunResult::Failed(tollgate_core::TaskError::new(
                        ErrorCode::ProviderError,
                        "the workflow failed",
                    ))
                };
                let app = self.model.runs[r].app;
                let answer = self
                    .store()
                    .finish_run(&app_id(app), self.run_ids[r], result)
                    .await;
                Outcome::Finish(match answer {
                    Ok(run) => Ok(run.map(|run| self.rref(run.id))),
                    Err(e) => Err(ErrKind::from(&e)),
                })
            }
            Op::FirstQueued => {
                let first = self
                    .store()
                    .first_queued()
                    .await
                    .map_err(|e| fatal("first_queued", e))?;
                Outcome::Recoverable(first.map(|id| self.tref(id)))
            }
            Op::Sweep { batch } => {
                let config = SweepConfig {
                    queue_timeout: Duration::from_millis(QUEUE_TIMEOUT_MS as u64),
                    liveness_timeout: Duration::from_millis(LIVENESS_MS as u64),
                    retention: Duration::from_millis(RETENTION_MS as u64),
                    batch_size: u32::from(*batch),
                };
                let mut v = SweepView::default();
                for round in 0.. {
                    if round == 1000 {
                        return Err("sweep still reports more after 1,000 rounds".into());
                    }
                    let r = self
                        .store()
                        .sweep(&config)
                        .await
                        .map_err(|e| fatal("sweep", e))?;
                    v.queue_timed_out += r.queue_timed_out;
                    v.interrupted += r.interrupted;
                    v.canceled += r.canceled;
                    v.runs_repaired += r.runs_repaired;
                    v.admissions_pruned += r.admissions_pruned;
                    v.tasks_deleted += r.tasks_deleted;
                    v.finished
                        .extend(r.finished.iter().map(|id| self.tref(*id)));
                    v.woken.extend(r.woken_runs.iter().map(|id| self.rref(*id)));
                    if !r.more {
                        break;
                    }
                }
                Outcome::Sweep(v)
            }
            Op::Advance { ms } => {
                self.clock.advance(Duration::from_millis(*ms as u64));
                Outcome::Skipped
            }
        })
    }

    fn task_view(&self, t: &Task) -> TaskView {
        TaskView {
            effect_key: t.effect_key.to_string(),
            step: t.step.to_string(),
            status: t.status,
            cancel_requested: t.cancel_requested,
            attempt: t.attempt,
            worker: t.worker.as_ref().map(|w| w.to_string()),
            output: t.output.clone(),
            usage: t.usage,
            error: t.error.as_ref().map(|e| e.code),
            cached_from: t.cached_from.map(|id| self.tref(id)),
            created_at: t.created_at.0 - START.0,
            claimed_at: t.claimed_at.map(|x| x.0 - START.0),
            heartbeat_at: t.heartbeat_at.map(|x| x.0 - START.0),
            completed_at: t.completed_at.map(|x| x.0 - START.0),
            released_at: t.released_at.map(|x| x.0 - START.0),
            run: t.run_id().map(|r| self.rref(r)),
            scope: t.scope.to_string(),
            subject: t
                .subject
                .as_ref()
                .map(|s| format!("{}:{}", s.kind.as_str(), s.id)),
            source: t
                .source
                .as_ref()
                .map(|s| (s.id.to_string(), s.revision.to_string(), s.recompute)),
            request_input: t.request["input"].as_str().unwrap_or_default().to_string(),
            model: t.model_ref.model.clone(),
            has_cache_key: t.cache_key.is_some(),
            reservation: t
                .reservation
                .map(|r| (r.tokens, r.nano_usd, r.from_token_bucket)),
        }
    }

    /// Every task and run reads back as the model says, from its own app only.
    async fn check_state(&self) -> Result<(), String> {
        let s = self.store();
        for (i, id) in self.task_ids.iter().enumerate() {
            let m = &self.model.tasks[i];
            let own = s
                .get_task(&app_id(m.app), *id)
                .await
                .map_err(|e| format!("get_task: {e:?}"))?;
            let other = s
                .get_task(&app_id(1 - m.app), *id)
                .await
                .map_err(|e| format!("get_task: {e:?}"))?;
            if let Some(t) = &other {
                return Err(format!("task {i} is visible to the other app: {t:?}"));
            }
            match (m.deleted, own) {
                (true, None) => {}
                (true, Some(t)) => return Err(format!("task {i} should be deleted: {t:?}")),
                (false, None) => return Err(format!("task {i} is missing: model {m:?}")),
                (false, Some(t)) => {
                    let (store_view, model_view) = (self.task_view(&t), self.model.task_view(i));
                    if store_view != model_view {
                        return Err(format!(
                            "task {i} differs\n store: {store_view:?}\n model: {model_view:?}"
                        ));
                    }
                    let key = EffectKey::new(format!("k{}", m.key)).expect("key");
                    let by_key = s
                        .get_task_by_effect_key(&app_id(m.app), &key)
                        .await
                        .map_err(|e| format!("get_task_by_effect_key: {e:?}"))?;
                    if by_key.as_ref().map(|t| t.id) != Some(*id) {
                        return Err(format!(
                            "effect key k{} of app {} names {:?}, not task {i}",
                            m.key,
                            APPS[m.app],
                            by_key.map(|t| t.id)
                        ));
                    }
                }
            }
        }
        for (r, id) in self.run_ids.iter().enumerate() {
            let m = &self.model.runs[r];
            let Some(run) = s
                .get_run(&app_id(m.app), *id)
                .await
                .map_err(|e| format!("get_run: {e:?}"))?
            else {
                return Err(format!("run {r} is missing"));
            };
            if s.get_run(&app_id(1 - m.app), *id)
                .await
                .map_err(|e| format!("get_run: {e:?}"))?
                .is_some()
            {
                return Err(format!("run {r} is visible to the other app"));
            }
            let view = RunView {
                scope: run.scope.to_string(),
                subject: run
                    .subject
                    .as_ref()
                    .map(|s| format!("{}:{}", s.kind.as_str(), s.id)),
                state: run.state,
                cancel_requested: run.cancel_requested,
                waiting_on: run.waiting_on.as_ref().map(|d| self.tref(d.key)),
                created_at: run.created_at.0 - START.0,
                updated_at: run.updated_at.0 - START.0,
                woken_at: run.woken_at.map(|x| x.0 - START.0),
            };
            let expected = self.model.run_view(r);
            if view != expected {
                return Err(format!(
                    "run {r} differs\n store: {view:?}\n model: {expected:?}"
                ));
            }
        }
        Ok(())
    }
}

/// With `TOLLGATE_MODEL_STATS` set, counts what the sequences exercised (printed at the
/// end), to see that rejections, refusals and sweeps really happen.
static TALLY: std::sync::Mutex<std::collections::BTreeMap<String, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn tally(outcome: &Outcome) {
    let name = |r: &Result<(TRef, bool), ErrKind>| match r {
        Ok((_, true)) => "create: created".to_string(),
        Ok((_, false)) => "create: replay".to_string(),
        Err(ErrKind::Admission(a)) => format!("create: {}", a.code()),
        Err(ErrKind::Cost(code)) => format!("create: {code}"),
        Err(e) => format!("create: {e:?}"),
    };
    let mut names = Vec::new();
    match outcome {
        Outcome::Created(r) => names.push(name(r)),
        Outcome::CreatedMany(rs) => names.extend(rs.iter().map(name)),
        Outcome::Claimed(c) => names.push(format!("claim: {}", c.is_some())),
        Outcome::Transition(Ok(t)) => {
            names.push(format!("transition applied: {}", t.applied));
            if !t.woken.is_empty() {
                names.push("transition woke a run".into());
            }
        }
        Outcome::Transition(Err(e)) => names.push(format!("transition: {e:?}")),
        Outcome::Canceled(c) => names.push(format!("cancel: {:?}", c.as_ref().map(|t| t.applied))),
        Outcome::Heartbeat { alive, stop } => names.push(format!(
            "heartbeat: {} alive {} stop",
            alive.len(),
            stop.len()
        )),
        Outcome::Sweep(v) => {
            for (what, n) in [
                ("queue timeout", v.queue_timed_out),
                ("interrupted", v.interrupted),
                ("pruned", v.admissions_pruned),
                ("retention", v.tasks_deleted),
                ("woken", v.woken.len() as u64),
            ] {
                if n > 0 {
                    names.push(format!("sweep: {what}"));
                }
            }
        }
        Outcome::Wait(r) => names.push(format!(
            "wait: {:?}",
            r.as_ref().map(|w| matches!(w, WaitView::Ready(_)))
        )),
        Outcome::Deleted(n) => names.push(format!("delete: {}", n.min(&2))),
        other => names.push(format!("{:?}", std::mem::discriminant(other))),
    }
    let mut t = TALLY
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    for n in names {
        *t.entry(n).or_default() += 1;
    }
}

/// Runs one sequence against fresh stores; `Err` names the first step where the store and
/// the model disagree.
async fn run_case(
    stores: Vec<Arc<dyn Store>>,
    clock: ManualClock,
    ops: &[Op],
) -> Result<(), String> {
    let mut h = Harness {
        stores,
        clock,
        model: Model::default(),
        task_ids: Vec::new(),
        tasks: HashMap::new(),
        run_ids: Vec::new(),
        runs: HashMap::new(),
        step: 0,
    };
    for (step, op) in ops.iter().enumerate() {
        h.step = step;
        let got = h
            .apply(op)
            .await
            .map_err(|e| format!("step {step} {op:?}: {e}"))?;
        let expected = h.model.apply(op);
        if got != expected {
            return Err(format!(
                "step {step} {op:?}\n store answered: {got:?}\n model expects:  {expected:?}"
            ));
        }
        if std::env::var("TOLLGATE_MODEL_STATS").is_ok() {
            tally(&expected);
        }
        if h.task_ids.len() != h.model.tasks.len() {
            return Err(format!(
                "step {step} {op:?}: the store made {} tasks, the model {}",
                h.task_ids.len(),
                h.model.tasks.len()
            ));
        }
        h.check_state()
            .await
            .map_err(|e| format!("after step {step} {op:?}: {e}"))?;
    }
    Ok(())
}

fn runner(default_cases: usize) -> TestRunner {
    // The long version (docs/guarantees.md): ten times the cases.
    let long = std::env::var("TOLLGATE_LONG_TESTS").is_ok_and(|v| v == "1");
    let default_cases = if long {
        default_cases * 10
    } else {
        default_cases
    };
    let cases = env_usize(
        "TOLLGATE_MODEL_CASES",
        env_usize("PROPTEST_CASES", default_cases),
    );
    TestRunner::new(Config {
        cases: cases as u32,
        max_shrink_iters: 2_000,
        failure_persistence: None,
        ..Config::default()
    })
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..=env_usize("TOLLGATE_MODEL_STEPS", 60))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn check(result: Result<(), proptest::test_runner::TestError<Vec<Op>>>) {
    if std::env::var("TOLLGATE_MODEL_STATS").is_ok() {
        eprintln!(
            "{:#?}",
            TALLY
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        );
    }
    if let Err(e) = result {
        panic!("the store disagrees with the model:\n{e}");
    }
}

/// Runs `ops` on two SQLite store instances over one fresh database file.
async fn sqlite_case(ops: &[Op]) -> Result<(), String> {
    let dir = tempfile::tempdir().expect("temporary folder");
    let clock = ManualClock::new(START);
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    let mut sqlite = Vec::new();
    for _ in 0..2 {
        // The model is the database's truth: every claim reads the queues and writes
        // its pass moves (an instance's view would miss the other's new queues and
        // claims for its period).
        let options = SqliteOptions::new(dir.path().join("model.db"))
            .with_clock(Arc::new(clock.clone()))
            .with_queue_view_ttl(Duration::ZERO);
        let store = SqliteStore::open(options).await.expect("open SQLite");
        sqlite.push(store.clone());
        stores.push(Arc::new(store));
    }
    let result = run_case(stores, clock, ops).await;
    for s in sqlite {
        s.close().await;
    }
    result
}

/// Runs `ops` on two PostgreSQL store instances over one fresh schema.
async fn postgres_case(url: &str, ops: &[Op]) -> Result<(), String> {
    let schema = format!("model_{}", uuid::Uuid::new_v4().simple());
    let clock = ManualClock::new(START);
    let mut stores: Vec<Arc<dyn Store>> = Vec::new();
    let mut pg = Vec::new();
    for _ in 0..2 {
        let mut options = PostgresOptions::new(url.to_owned())
            .with_clock(Arc::new(clock.clone()))
            .with_schema(schema.clone())
            .with_queue_view_ttl(Duration::ZERO);
        options.max_connections = 2;
        let store = PostgresStore::open(options).await.expect("open PostgreSQL");
        pg.push(store.clone());
        stores.push(Arc::new(store));
    }
    let result = run_case(stores, clock, ops).await;
    let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
    )))
    .execute(pg[0].pool())
    .await;
    for s in pg {
        s.close().await;
    }
    result
}

#[test]
fn sqlite_agrees_with_the_model() {
    let rt = runtime();
    check(runner(32).run(&ops(), |ops| {
        rt.block_on(sqlite_case(&ops)).map_err(TestCaseError::fail)
    }));
}

#[test]
fn postgres_agrees_with_the_model() {
    let Some(url) = postgres_url("postgres_agrees_with_the_model") else {
        return;
    };
    let rt = runtime();
    check(runner(16).run(&ops(), |ops| {
        rt.block_on(postgres_case(&url, &ops))
            .map_err(TestCaseError::fail)
    }));
}

/// docs/conformance.md#fair-share across replicas: claims of one task taking turns between two instances
/// (each step runs on the other instance). Each claim must see the other instance's
/// last claim in the passes (the model's truth), not only its own: a claim with no view
/// period moves the passes before it returns.
fn claims_taking_turns() -> Vec<Op> {
    let create = |key, scope| {
        Op::Create(CreateSpec {
            app: 0,
            key,
            owner: OwnerSpec::App {
                scope,
                subject: None,
            },
            step: 0,
            input: 0,
            model: 0,
            scoped: None,
        })
    };
    let claim = |worker| Op::ClaimNext { worker, limit: 1 };
    vec![
        // Queue 0 gets two tasks, both claimed, then is found empty: it idles at pass 2.
        create(0, 0),
        create(1, 0),
        claim(0),
        claim(1),
        claim(0),
        // Queue 1 joins at the greatest pass (2); queue 0 rejoins at its own pass (2).
        create(2, 1),
        create(3, 0),
        create(4, 0),
        // A tie: queue 0 goes first by name and moves to pass 3; the other instance's
        // claim must then take queue 1's task.
        claim(0),
        claim(1),
    ]
}

/// docs/conformance.md#fair-share for a batch: its new queues join as if created one after another, in the
/// batch's order (the second one below the first), on both backends.
fn batch_queues_join_in_order() -> Vec<Op> {
    let spec = |app, key| CreateSpec {
        app,
        key,
        owner: OwnerSpec::App {
            scope: 0,
            subject: None,
        },
        step: 0,
        input: 0,
        model: 0,
        scoped: None,
    };
    vec![
        Op::CreateMany(vec![spec(0, 0), spec(1, 0)]),
        Op::Create(spec(1, 1)),
        Op::Create(spec(0, 0)),
        Op::ClaimNext {
            worker: 0,
            limit: 1,
        },
    ]
}

/// A hand-written sequence on SQLite's two instances must agree with the model.
fn sqlite_agrees_on(ops: &[Op]) {
    runtime()
        .block_on(sqlite_case(ops))
        .expect("the store agrees with the model");
}

/// A hand-written sequence on PostgreSQL's two instances must agree with the model
/// (skipped, as `test` says, without a test database).
fn postgres_agrees_on(test: &str, ops: &[Op]) {
    if let Some(url) = postgres_url(test) {
        runtime()
            .block_on(postgres_case(&url, ops))
            .expect("the store agrees with the model");
    }
}

#[test]
fn sqlite_batch_queues_join_in_order() {
    sqlite_agrees_on(&batch_queues_join_in_order());
}

#[test]
fn postgres_batch_queues_join_in_order() {
    postgres_agrees_on(
        "postgres_batch_queues_join_in_order",
        &batch_queues_join_in_order(),
    );
}

#[test]
fn sqlite_instances_see_each_others_claims() {
    sqlite_agrees_on(&claims_taking_turns());
}

#[test]
fn postgres_instances_see_each_others_claims() {
    postgres_agrees_on(
        "postgres_instances_see_each_others_claims",
        &claims_taking_turns(),
    );
}

/// The model itself against a hand-written sequence, so a wrong model is caught even
/// when no backend runs: admission exhausts the source budget, a failure frees the step
/// but keeps the source, and a cache hit spends nothing.
#[test]
fn the_model_follows_the_spec_on_a_known_sequence() {
    let tight = BudgetSpec {
        steps: 1,
        sources: 1,
        scope: 3,
        global: 5,
        burst: 3,
        rate: 1,
        cost: CostSpec::NONE,
    };
    let create = |key, input, source| {
        Op::Create(CreateSpec {
            app: 0,
            key,
            owner: OwnerSpec::App {
                scope: 0,
                subject: None,
            },
            step: 0,
            input,
            model: 0,
            scoped: Some(ScopedSpec {
                source,
                revision: 0,
                recompute: false,
                budget: tight,
                reserve: 1,
            }),
        })
    };
    let mut m = Model::default();
    assert_eq!(
        m.apply(&create(0, 0, 0)),
        Outcome::Created(Ok((TRef::Known(0), true)))
    );
    assert_eq!(
        m.apply(&create(1, 1, 0)),
        Outcome::Created(Err(ErrKind::Admission(AdmissionRejection::SourceBudget {
            limit: 1
        })))
    );
    assert_eq!(
        m.apply(&create(1, 1, 1)),
        Outcome::Created(Err(ErrKind::Admission(AdmissionRejection::DailyBudget {
            limit: 1
        })))
    );
    // The same key replays whatever the request.
    assert_eq!(
        m.apply(&create(0, 2, 2)),
        Outcome::Created(Ok((TRef::Known(0), false)))
    );
    let first = Pick(0);
    assert!(matches!(m.apply(&Op::Fail { task: first }), Outcome::Transition(Ok(t)) if t.applied));
    // The step is free again; the source is still the one seen.
    assert_eq!(
        m.apply(&create(1, 1, 0)),
        Outcome::Created(Ok((TRef::Known(1), true)))
    );
    // A success keeps its step and serves the cache without spending anything.
    let second = Pick(1);
    assert_eq!(
        m.apply(&Op::Claim {
            task: second,
            worker: 0
        }),
        Outcome::Claimed(Some(TRef::Known(1)))
    );
    assert!(matches!(
        m.apply(&Op::Complete { task: second, worker: 0, output: 1 }),
        Outcome::Transition(Ok(t)) if t.applied
    ));
    assert_eq!(
        m.apply(&create(2, 1, 0)),
        Outcome::Created(Ok((TRef::Known(2), true)))
    );
    assert_eq!(m.tasks[2].cached_from, Some(1));
    assert_eq!(m.admissions.len(), 2);
    // The bucket: three tokens, two spent; the third goes, the fourth waits a minute.
    let other_scope = |key, source| match create(key, 0, source) {
        Op::Create(mut spec) => {
            spec.owner = OwnerSpec::App {
                scope: 1,
                subject: None,
            };
            spec.scoped.as_mut().expect("scoped").budget.sources = 3;
            Op::Create(spec)
        }
        _ => unreachable!(),
    };
    assert_eq!(
        m.apply(&other_scope(3, 0)),
        Outcome::Created(Ok((TRef::Known(3), true)))
    );
    assert_eq!(
        m.apply(&other_scope(4, 1)),
        Outcome::Created(Ok((TRef::Known(4), true)))
    );
    assert_eq!(
        m.apply(&other_scope(5, 2)),
        Outcome::Created(Ok((TRef::Known(5), true)))
    );
    assert_eq!(
        m.apply(&other_scope(6, 2)),
        Outcome::Created(Err(ErrKind::Admission(AdmissionRejection::ScopeCapacity {
            limit: 3
        })))
    );
    let sixth = Pick(5);
    assert!(matches!(m.apply(&Op::Fail { task: sixth }), Outcome::Transition(Ok(t)) if t.applied));
    assert_eq!(
        m.apply(&other_scope(7, 2)),
        Outcome::Created(Err(ErrKind::Admission(AdmissionRejection::RateLimit {
            retry_after: Duration::from_secs(60)
        })))
    );
    m.apply(&Op::Advance { ms: 60_000 });
    assert_eq!(
        m.apply(&other_scope(7, 2)),
        Outcome::Created(Ok((TRef::Known(6), true)))
    );
}
