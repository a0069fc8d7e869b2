//! Step 6: the task insert and, for an admitted task, the admission's writes and the
//! global slot in the same final statement.

use super::super::{PostgresStore, Tx};
use super::SlotPath;
use super::slots::{app_slot_stripe, slot_stripe, take_share_rebalancing, take_slot_rebalancing};
pub(super) use crate::shared::admission::InsertRow;
use crate::shared::admission::{
    AdmissionFacts, ScopeUpdate, TASK_INSERT, UnsourcedFacts, bind_join, bind_token,
};
use crate::shared::cost::{SpendDelta, bind_spend, bind_spend_delta};
use crate::shared::dispatch::QUEUE_JOIN;
use crate::shared::named::{Binder, NamedStatement, Parts};
use crate::shared::rows::{TaskRow, task_columns};
use crate::shared::sql::Exec;
use crate::shared::tasks::Tasks;
use crate::{Created, StoreError, StoreResult};
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::cost::{SPEND_BUCKET_MS, spend_bucket, window_first_bucket};
use tollgate_core::{
    AdmissionRejection, AppId, BucketState, Budget, NewTask, ScopeId, SourceId, Subject, Task,
    TaskCost, TaskId, TaskScope, Timestamp, Weight, join_credit, stride,
};

/// The spend upserts (`sql/spend_add.sql`), CTEs of the statements that reserve or save.
const SPEND_ADD: &str = include_str!("../sql/spend_add.sql");

/// The parts of a task row whose creation time and dispatch key are bound.
const BOUND_ROW: Parts = &[
    ("task_insert", TASK_INSERT),
    ("insert_if", "true"),
    ("created_at", ":now"),
    ("dispatch_key", ":dispatch_key"),
    ("task_columns", task_columns!()),
];

/// A task created claimed opens its first attempt, as a claim's would.
const TASK_OPENED: &str = crate::shared::attempts::open_claimed_attempts!(
    "t WHERE t.status = 'running'",
    "(t.model_ref::json ->> 'provider')",
    "(t.model_ref::json ->> 'model')",
    "(t.reservation::json ->> 'nano_usd')",
    "(t.reservation::json ->> 'tokens')"
);

/// The parts of a queue's join after the task insert `t`.
const QUEUE: Parts = &[
    (
        "task_queue_join",
        include_str!("../sql/task_queue_join.sql"),
    ),
    ("queue_join", QUEUE_JOIN),
    ("task_opened", TASK_OPENED),
];

/// The task insert alone (a batch's run task: its queues join at the batch's end).
static TASK_ROW: NamedStatement = NamedStatement::new("task_insert", TASK_INSERT, &[BOUND_ROW]);

/// The task insert and its queue's join.
static INSERT_TASK: NamedStatement = NamedStatement::new(
    "insert_task",
    include_str!("../sql/insert_task.sql"),
    &[BOUND_ROW, QUEUE],
);

/// The lock and the clock of an application task's creation in one statement
/// (`sql/app_clock.sql`), and its task row with that clock's creation time.
const CLOCK_ROW: Parts = &[
    ("app_clock", include_str!("../sql/app_clock.sql")),
    ("task_insert", TASK_INSERT),
    ("insert_if", "true"),
    ("created_at", "(SELECT now FROM clock)"),
    ("dispatch_key", "(SELECT now FROM clock) + :dispatch_key"),
    ("task_columns", task_columns!()),
];

/// An unscoped application task in one statement, with the database's clock.
static INSERT_APP_TASK: NamedStatement = NamedStatement::new(
    "insert_app_task",
    include_str!("../sql/insert_app_task.sql"),
    &[CLOCK_ROW, QUEUE],
);

/// The same with its reservation recorded (a cost under no limit) in the spend bucket of
/// the statement's clock.
static RESERVE_APP_TASK: NamedStatement = NamedStatement::new(
    "reserve_app_task",
    include_str!("../sql/reserve_app_task.sql"),
    &[
        CLOCK_ROW,
        QUEUE,
        &[
            ("spend_add", SPEND_ADD),
            ("after", "t"),
            ("bucket", "(SELECT bucket FROM spend_at)"),
        ],
    ],
);

/// The spend bucket bound (`:bucket`, of the statement's bound "now").
const BOUND_BUCKET: (&str, &str) = ("bucket", ":bucket");

/// An admission's spend parts (after the scope row `st`).
const ADMISSION_SPEND: Parts = &[("spend_add", SPEND_ADD), ("after", "st"), BOUND_BUCKET];

/// An admitted task: the task, its queue, the admission's writes and (fast path) its slot.
static ADMIT_TASK: NamedStatement = NamedStatement::new(
    "admit_task",
    include_str!("../sql/admit_task.sql"),
    &[
        &[("guard", ""), ("took", "(SELECT admitted FROM slot)")],
        BOUND_ROW,
        QUEUE,
        ADMISSION_SPEND,
    ],
);

/// [`ADMIT_TASK`] in one statement of its own (docs/locking.md, "A creation in one
/// statement"): behind the guard of the scope's admission facts, on the fast slot path
/// only, failing (SQLSTATE [`NO_FAST_SLOT`]) when that found no slot.
static ADMIT_GUARDED: NamedStatement = NamedStatement::new(
    "admit_guarded",
    include_str!("../sql/admit_task.sql"),
    &[
        &[
            ("guard", include_str!("../sql/admission_facts_guard.sql")),
            ("took", "tollgate_slot_taken((SELECT admitted FROM slot))"),
        ],
        GUARDED_ROW,
        QUEUE,
        ADMISSION_SPEND,
    ],
);

/// The SQLSTATE of [`ADMIT_GUARDED`] when the fast path found no global slot
/// (`tollgate_slot_taken`, migration 0031): nothing was written.
const NO_FAST_SLOT: &str = "TG001";

/// A cache hit's row in one statement of its own (`sql/cache_hit.sql`): after the
/// scope's shared lock, and only when no endpoint of the app listens for
/// `task.succeeded` (docs/webhooks.md, "The outbox": that event is the transaction
/// path's to write).
const HIT_ROW: Parts = &[
    ("task_insert", TASK_INSERT),
    (
        "insert_if",
        concat!(
            "EXISTS (SELECT 1 FROM lock) AND NOT (SELECT ",
            crate::shared::webhooks::task_event_listened!("ev"),
            " FROM (SELECT CAST(:app AS TEXT) AS app, 'succeeded' AS status) AS ev)"
        ),
    ),
    ("created_at", ":now"),
    ("dispatch_key", ":dispatch_key"),
    ("task_columns", task_columns!()),
];

/// A cache hit in one statement: its row and its saving (when it saved anything).
static CACHE_HIT: NamedStatement = NamedStatement::new(
    "cache_hit",
    include_str!("../sql/cache_hit.sql"),
    &[
        HIT_ROW,
        &[
            ("spend_add", SPEND_ADD),
            ("after", "t WHERE CAST(:saved_nano AS BIGINT) > 0"),
            BOUND_BUCKET,
        ],
    ],
);

/// The spend parts of a task without a source's reservation.
const RESERVE_SPEND: Parts = &[
    ("spend_add", SPEND_ADD),
    ("after", "t, (SELECT COUNT(*) FROM st) AS after_st"),
    BOUND_BUCKET,
];

/// A task without a source: its task row, its queue and its reservation.
static RESERVE_UNSOURCED: NamedStatement = NamedStatement::new(
    "reserve_unsourced",
    include_str!("../sql/reserve_unsourced.sql"),
    &[&[("guard", "")], BOUND_ROW, QUEUE, RESERVE_SPEND],
);

/// The task row behind the guard of the facts decided on (docs/locking.md, "A creation
/// in one statement"): inserted only when the guard (a part of its own) finds the facts
/// held.
const GUARDED_ROW: Parts = &[
    ("task_insert", TASK_INSERT),
    ("insert_if", "(SELECT held FROM guard)"),
    ("created_at", ":now"),
    ("dispatch_key", ":dispatch_key"),
    ("task_columns", task_columns!()),
];

/// The guard of a task without a source's facts (`sql/cost_facts_guard.sql`).
const COST_GUARD: Parts = &[("guard", include_str!("../sql/cost_facts_guard.sql"))];

/// A task created claimed joins no queue: its first attempt opens (the statement then
/// carries no queue join's parts, which its executor would set up for nothing).
const OPENED: Parts = &[
    ("task_queue_join", "opened AS ({task_opened} RETURNING 1)"),
    ("task_opened", TASK_OPENED),
];

/// [`RESERVE_UNSOURCED`] in one statement of its own behind the guard.
static RESERVE_GUARDED: NamedStatement = NamedStatement::new(
    "reserve_guarded",
    include_str!("../sql/reserve_unsourced.sql"),
    &[COST_GUARD, GUARDED_ROW, QUEUE, RESERVE_SPEND],
);

/// The same for a task created claimed.
static RESERVE_GUARDED_CLAIMED: NamedStatement = NamedStatement::new(
    "reserve_guarded_claimed",
    include_str!("../sql/reserve_unsourced.sql"),
    &[COST_GUARD, GUARDED_ROW, OPENED, RESERVE_SPEND],
);

/// A cache hit's saving.
static RECORD_SAVED: NamedStatement = NamedStatement::new(
    "record_saved",
    include_str!("../sql/record_saved.sql"),
    &[&[
        ("spend_add", SPEND_ADD),
        ("after", "(SELECT 1) AS one"),
        BOUND_BUCKET,
    ]],
);

/// One queue of a batch joins.
static ACTIVATE_QUEUE: NamedStatement = NamedStatement::new(
    "activate_queue",
    include_str!("../sql/activate_queue.sql"),
    &[&[("queue_join", QUEUE_JOIN)]],
);

/// The names [`insert_and_commit`] binds of an admission's writes ([`ADMIT_TASK`]).
const ADMISSION_NAMES: &[&str] = &[
    "bucket_units",
    "bucket_at",
    "sources_delta",
    "source",
    "logical_key",
];
/// The names [`insert_and_commit`] binds of the global slot ([`ADMIT_TASK`]).
const SLOT_NAMES: &[&str] = &[
    "fast",
    "share",
    "no_share",
    "app_stripe",
    "slot_stripe",
    "cap",
];
/// The names [`insert_reserved_and_commit`] binds besides the row, the join, the token
/// and the spend groups ([`RESERVE_UNSOURCED`]).
const UNSOURCED_NAMES: &[&str] = &["bucket_units", "bucket_at"];
/// The names [`guarded_reserve`] binds of the guard ([`RESERVE_GUARDED`]).
const GUARD_NAMES: &[&str] = &[
    "lock_key",
    "first_bucket",
    "seen_token_units",
    "seen_token_at",
    "seen_window_nano",
];
/// The names [`guarded_admit`] binds of the guard ([`ADMIT_GUARDED`]).
const ADMISSION_GUARD_NAMES: &[&str] = &[
    "lock_key",
    "cutoff",
    "first_bucket",
    "seen_bucket_units",
    "seen_bucket_at",
    "seen_sources",
    "seen_active",
    "seen_token_units",
    "seen_token_at",
    "seen_seen",
    "seen_steps",
    "seen_counted",
    "seen_window_nano",
];
/// The name [`hit_in_one_statement`] binds besides the row and the spend ([`CACHE_HIT`]).
const HIT_NAMES: &[&str] = &["lock_key"];
/// The names `record_saved` binds besides the spend group ([`RECORD_SAVED`]).
const SAVED_NAMES: &[&str] = &["app", "scope"];
/// The names [`insert_app_task`] binds besides the row and the join ([`INSERT_APP_TASK`]).
const APP_TASK_NAMES: &[&str] = &["lock_key", "fixed_now"];
/// The name [`insert_app_task`] binds of a reservation's bucket ([`RESERVE_APP_TASK`]).
const SPEND_AT_NAMES: &[&str] = &["bucket_ms"];
/// The names [`activate_queues`] binds ([`ACTIVATE_QUEUE`]).
const ACTIVATE_NAMES: &[&str] = &["app", "scope", "weight", "credit", "stride"];

/// What [`ADMIT_TASK`] returns: the task row, and the slot's count when it took one.
#[derive(sqlx::FromRow)]
struct AdmittedRow {
    #[sqlx(flatten)]
    task: TaskRow,
    took: Option<i64>,
}

pub(super) struct AdmissionRecord<'a> {
    pub(super) source: &'a SourceId,
    pub(super) logical_key: &'a str,
    pub(super) budget: &'a Budget,
    pub(super) update: ScopeUpdate,
    pub(super) reserve: SpendDelta,
}

impl<'a> AdmissionRecord<'a> {
    /// The admission `update` of the scoped task `row` (of `scoped`, its logical step
    /// `logical_key`) decided on: the row marked admitted, its reservation recorded
    /// (taken from the token bucket when the update holds one).
    pub(super) fn admitted(
        row: &mut InsertRow<'_>,
        scoped: &'a TaskScope,
        logical_key: &'a str,
        update: ScopeUpdate,
    ) -> StoreResult<AdmissionRecord<'a>> {
        row.admitted = true;
        let from_token_bucket = update.token_bucket.is_some();
        let reserve = row.reserve(&scoped.reservation, &scoped.budget, from_token_bucket)?;
        Ok(AdmissionRecord {
            source: &scoped.source_id,
            logical_key,
            budget: &scoped.budget,
            update,
            reserve,
        })
    }
}

/// Step 6: insert the task; for an admitted task, then record the admission and take the
/// global slot in one final statement; commit.
pub(super) async fn insert_and_commit(
    store: &PostgresStore,
    mut tx: Tx,
    row: &InsertRow<'_>,
    app: &AppId,
    admission: Option<AdmissionRecord<'_>>,
    path: SlotPath,
) -> StoreResult<Option<Created>> {
    let Some(record) = admission else {
        let Some(task) = insert_task(&mut tx, row, true).await? else {
            // Another replica inserted the same effect key first: keep nothing of ours.
            tx.rollback().await?;
            return lost_race(store, app, row.new).await.map(Some);
        };
        if row.saved_nano > 0 {
            record_saved(&mut tx, app, &row.scope, row.now, row.saved_nano).await?;
        }
        if row.cached_from.is_some() {
            // docs/webhooks.md, "The outbox": a cache hit is created succeeded.
            let ids = [task.id.to_string()];
            crate::shared::webhooks::record_task_events(&mut *tx, &ids, row.now).await?;
        }
        let task = commit_created(store, tx, row.new, task).await?;
        return Ok(Some(Created::inserted(task).saving(row.saved_nano)));
    };
    let cap = i64::from(record.budget.global_concurrent.get());
    let stripe = slot_stripe(row.id);
    // The task, the admission's writes and (fast path) a slot of this stripe's
    // allowance, in one statement that locks one stripe row only.
    let mut b = ADMIT_TASK.binder();
    bind_admission(&mut b, row, &record, path);
    let inserted: Option<AdmittedRow> = tx.optional(b.statement()?).await?;
    let Some(inserted) = inserted else {
        // Another replica inserted the same effect key first: keep nothing of ours.
        tx.rollback().await?;
        return lost_race(store, app, row.new).await.map(Some);
    };
    let task = inserted.task.into_task()?;
    let took = match path {
        SlotPath::Fast => inserted.took.is_some(),
        SlotPath::Rebalance => {
            if let Err(refusal) = take_share_rebalancing(&mut tx, app, record.budget).await? {
                tx.rollback().await?;
                return Err(StoreError::Admission(refusal));
            }
            take_slot_rebalancing(&mut tx, stripe, cap).await?
        }
    };
    if !took {
        // Roll back before anything else: a failed fast path may still hold its
        // stripe's row lock (READ COMMITTED locks a concurrently updated row before
        // re-checking it), and the rebalancing retry locks every stripe in order.
        tx.rollback().await?;
        return match path {
            SlotPath::Fast => Ok(None),
            SlotPath::Rebalance => Err(StoreError::Admission(AdmissionRejection::GlobalCapacity {
                limit: record.budget.global_concurrent.get(),
            })),
        };
    }
    let task = commit_created(store, tx, row.new, task).await?;
    Ok(Some(Created::inserted(task)))
}

/// Binds an admitted task's row, its queue's join, the admission's writes and its slot
/// ([`ADMIT_TASK`], [`ADMIT_GUARDED`] after its guard).
fn bind_admission(
    b: &mut Binder,
    row: &InsertRow<'_>,
    record: &AdmissionRecord<'_>,
    path: SlotPath,
) {
    row.bind(b, false);
    bind_join(b, row.new.dispatch.weight);
    bind_token(b, record.update.token_bucket);
    b.group(ADMISSION_NAMES, |b| {
        b.bind("bucket_units", record.update.bucket.units)
            .bind("bucket_at", record.update.bucket.at.0)
            .bind("sources_delta", record.update.sources_delta)
            .bind("source", record.source.as_str())
            .bind("logical_key", record.logical_key);
    });
    bind_spend(b, row.scope.as_str(), spend_bucket(row.now), record.reserve);
    let share = record.budget.global_share;
    b.group(SLOT_NAMES, |b| {
        b.bind("fast", path == SlotPath::Fast)
            .bind("share", share.map_or(0, |s| i64::from(s.share)))
            .bind("no_share", share.is_none())
            .bind("app_stripe", app_slot_stripe(row.id))
            .bind("slot_stripe", slot_stripe(row.id))
            .bind("cap", i64::from(record.budget.global_concurrent.get()));
    });
}

/// The scope's admission facts a scoped creation in one statement decided on, as its
/// guard compares them (docs/locking.md, "A creation in one statement").
pub(super) struct SeenAdmission<'a> {
    /// The scope's advisory lock key.
    pub(super) lock: i64,
    pub(super) facts: &'a AdmissionFacts,
}

/// docs/locking.md, "A creation in one statement": [`insert_and_commit`]'s admission
/// statement as one statement of its own (no transaction around it) behind the guard
/// that takes the scope's lock and checks that the scope's facts are still `seen`'s, on
/// the fast slot path. `None`: the facts changed, the key was taken meanwhile, or the
/// fast path found no global slot; nothing was written.
pub(super) async fn guarded_admit(
    store: &PostgresStore,
    conn: &mut sqlx::PgConnection,
    row: &InsertRow<'_>,
    seen: SeenAdmission<'_>,
    record: &AdmissionRecord<'_>,
) -> StoreResult<Option<Created>> {
    let facts = seen.facts;
    let mut b = ADMIT_GUARDED.binder();
    b.group(ADMISSION_GUARD_NAMES, |b| {
        b.bind("lock_key", seen.lock)
            .bind("cutoff", row.now.minus(ADMISSION_WINDOW).0)
            .bind("first_bucket", window_first_bucket(row.now))
            .bind("seen_bucket_units", facts.bucket_units)
            .bind("seen_bucket_at", facts.bucket_at)
            .bind("seen_sources", facts.sources_in_window)
            .bind("seen_active", facts.active)
            .bind("seen_token_units", facts.token_units)
            .bind("seen_token_at", facts.token_at)
            .bind("seen_seen", facts.seen)
            .bind("seen_steps", facts.steps)
            .bind("seen_counted", facts.counted)
            .bind("seen_window_nano", facts.scope_window_nano);
    });
    bind_admission(&mut b, row, record, SlotPath::Fast);
    let (text, args) = b.statement()?.into_parts::<sqlx::postgres::PgArguments>()?;
    let inserted = sqlx::query_as_with::<_, AdmittedRow, _>(sqlx::AssertSqlSafe(text), args)
        .fetch_optional(&mut *conn)
        .await;
    let inserted = match inserted {
        Ok(inserted) => inserted,
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(NO_FAST_SLOT) => None,
        Err(e) => return Err(e.into()),
    };
    let Some(inserted) = inserted else {
        return Ok(None);
    };
    let task = inserted.task.into_task()?;
    store.queue_view.owe_creation_claim(row.new, &task);
    Ok(Some(Created::inserted(task)))
}

/// docs/locking.md, "A creation in one statement": a cache hit's row (`row`: its
/// `cached_from`, output and saving set) and saving in one statement of its own
/// ([`CACHE_HIT`]) under the scope's shared lock (`lock`). `None`: the key was taken
/// meanwhile, or an endpoint of the app listens for `task.succeeded`; nothing was
/// written.
pub(super) async fn hit_in_one_statement(
    conn: &mut sqlx::PgConnection,
    row: &InsertRow<'_>,
    lock: i64,
) -> StoreResult<Option<Created>> {
    let saved = SpendDelta {
        saved_nano: row.saved_nano,
        ..SpendDelta::default()
    };
    let mut b = CACHE_HIT.binder();
    b.group(HIT_NAMES, |b| {
        b.bind("lock_key", lock);
    });
    row.bind(&mut b, false);
    bind_spend(&mut b, row.scope.as_str(), spend_bucket(row.now), saved);
    let inserted: Option<TaskRow> = conn.optional(b.statement()?).await?;
    let Some(task) = inserted else {
        return Ok(None);
    };
    Ok(Some(
        Created::inserted(task.into_task()?).saving(row.saved_nano),
    ))
}

/// docs/budgets.md, "Tasks without a source": inserts a task without a source that can
/// cost money and records its reservation — the scope's token bucket taken (`token`:
/// the bucket and its capacity in units; a new scope row starts with a full task bucket,
/// as one never admitted into), the reservation added to the scope's and the app's spend
/// bucket, in the lock order (scope row, scope bucket, app bucket) — and commits.
pub(super) async fn insert_reserved_and_commit(
    store: &PostgresStore,
    mut tx: Tx,
    row: &InsertRow<'_>,
    app: &AppId,
    budget: &Budget,
    token: Option<(BucketState, i64)>,
    reserve: SpendDelta,
) -> StoreResult<Option<Created>> {
    let Some(task) = insert_reserved(&mut tx, row, budget, token, reserve).await? else {
        // Another replica inserted the same effect key first: keep nothing of ours.
        tx.rollback().await?;
        return lost_race(store, app, row.new).await.map(Some);
    };
    let task = commit_created(store, tx, row.new, task).await?;
    Ok(Some(Created::inserted(task)))
}

/// The statement of [`insert_reserved_and_commit`], inside a transaction that goes on
/// (a creation's own, or its group's: [`super::group`]). `None`: the effect key was
/// taken, and nothing was written.
pub(super) async fn insert_reserved(
    tx: &mut Tx,
    row: &InsertRow<'_>,
    budget: &Budget,
    token: Option<(BucketState, i64)>,
    reserve: SpendDelta,
) -> StoreResult<Option<Task>> {
    let mut b = RESERVE_UNSOURCED.binder();
    bind_reserved(&mut b, row, true, budget, token, reserve);
    let inserted: Option<TaskRow> = tx.optional(b.statement()?).await?;
    inserted.map(TaskRow::into_task).transpose()
}

/// The row of an application's task without a source (`new`, of `scope` and `subject`,
/// its model columns `model`) decided at `now` under `cost`, its reservation recorded
/// (`from_token_bucket`: the decision took the scope's token bucket), and what that
/// reservation adds to the spend windows.
pub(super) fn unsourced_row<'a>(
    new: &'a NewTask,
    (scope, subject): (&ScopeId, Option<&Subject>),
    model: (String, String),
    now: Timestamp,
    cost: &TaskCost,
    from_token_bucket: bool,
) -> StoreResult<(InsertRow<'a>, SpendDelta)> {
    let owner = (None, scope.clone(), subject.cloned());
    let mut row = InsertRow::new(TaskId::generate(), new, owner, model, now);
    let reserve = row.reserve(&cost.reservation, &cost.budget, from_token_bucket)?;
    Ok((row, reserve))
}

/// Binds a task without a source's row, queue join (`join`: the statement has one) and
/// reservation (`sql/reserve_unsourced.sql`).
fn bind_reserved(
    b: &mut Binder,
    row: &InsertRow<'_>,
    join: bool,
    budget: &Budget,
    token: Option<(BucketState, i64)>,
    reserve: SpendDelta,
) {
    let tasks = BucketState::full(budget.burst.get(), row.now);
    row.bind(b, false);
    if join {
        bind_join(b, row.new.dispatch.weight);
    }
    b.group(UNSOURCED_NAMES, |b| {
        b.bind("bucket_units", tasks.units)
            .bind("bucket_at", tasks.at.0);
    });
    bind_token(b, token);
    bind_spend(b, row.scope.as_str(), spend_bucket(row.now), reserve);
}

/// docs/locking.md, "A creation in one statement": [`insert_reserved`]'s writes as one
/// statement of their own (no transaction around it) behind the guard that takes the
/// scope's lock (`lock`) and checks that the facts are still `facts`, the ones `token`
/// and `reserve` were decided on. `None`: the facts changed or the key was taken
/// meanwhile, and nothing was written.
pub(super) async fn guarded_reserve(
    store: &PostgresStore,
    conn: &mut sqlx::PgConnection,
    row: &InsertRow<'_>,
    (lock, facts): (i64, &UnsourcedFacts),
    budget: &Budget,
    token: Option<(BucketState, i64)>,
    reserve: SpendDelta,
) -> StoreResult<Option<Created>> {
    let claimed = row.new.claim_by.is_some();
    let mut b = if claimed {
        RESERVE_GUARDED_CLAIMED.binder()
    } else {
        RESERVE_GUARDED.binder()
    };
    b.group(GUARD_NAMES, |b| {
        b.bind("lock_key", lock)
            .bind("first_bucket", window_first_bucket(row.now))
            .bind("seen_token_units", facts.token_units)
            .bind("seen_token_at", facts.token_at)
            .bind("seen_window_nano", facts.scope_window_nano);
    });
    bind_reserved(&mut b, row, !claimed, budget, token, reserve);
    let inserted: Option<TaskRow> = conn.optional(b.statement()?).await?;
    let Some(task) = inserted else {
        return Ok(None);
    };
    let task = task.into_task()?;
    store.queue_view.owe_creation_claim(row.new, &task);
    Ok(Some(Created::inserted(task)))
}

/// Commits a creation's transaction. A task created claimed (`NewTask::claim_by`: its
/// insert wrote it running and opened its attempt, docs/engine.md, "Door calls claimed at
/// creation") then counts in its queue's virtual time as a fair claim does
/// (docs/conformance.md#fair-share).
async fn commit_created(
    store: &PostgresStore,
    tx: Tx,
    new: &NewTask,
    task: Task,
) -> StoreResult<Task> {
    tx.commit().await?;
    store.queue_view.owe_creation_claim(new, &task);
    Ok(task)
}

pub(super) async fn lost_race(
    store: &PostgresStore,
    app: &AppId,
    new: &NewTask,
) -> StoreResult<Created> {
    let task = Tasks::get_task_by_effect_key(store, app, &new.effect_key)
        .await?
        .ok_or_else(|| {
            StoreError::Unavailable(
                "effect key taken by a transaction that rolled back; retry".into(),
            )
        })?;
    Ok(Created::existing(task))
}

/// docs/conformance.md#cost-cache-hits: a cache hit's saving, added to the scope's and the app's bucket of `now`
/// (scope bucket first: the lock order).
async fn record_saved(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    now: Timestamp,
    saved: i64,
) -> StoreResult<()> {
    let saved = SpendDelta {
        saved_nano: saved,
        ..SpendDelta::default()
    };
    let mut b = RECORD_SAVED.binder();
    b.group(SAVED_NAMES, |b| {
        b.bind("app", app.as_str()).bind("scope", scope.as_str());
    });
    bind_spend(&mut b, scope.as_str(), spend_bucket(now), saved);
    tx.run(b.statement()?).await?;
    Ok(())
}

/// Inserts the task and returns it; `None` when the effect key was taken meanwhile.
/// With `activate`, a queued task's dispatch queue is activated in the same statement
/// (docs/conformance.md#dispatch); batches activate theirs at the end instead, in lock order
/// ([`activate_queues`]).
pub(super) async fn insert_task(
    tx: &mut Tx,
    i: &InsertRow<'_>,
    activate: bool,
) -> StoreResult<Option<Task>> {
    let mut b = if activate {
        INSERT_TASK.binder()
    } else {
        TASK_ROW.binder()
    };
    i.bind(&mut b, false);
    if activate {
        bind_join(&mut b, i.new.dispatch.weight);
    }
    let row: Option<TaskRow> = tx.optional(b.statement()?).await?;
    row.map(TaskRow::into_task).transpose()
}

/// An unscoped application task (no cache, no admission: docs/conformance.md#create-idempotency, docs/conformance.md#create-insert) in ONE
/// statement, its own transaction (`sql/insert_app_task.sql`): the shared lock of its
/// (app, scope) (`lock`), the database's "now" (the fixed clock when set), the insert (a
/// taken effect key inserts nothing) and the queue's join. The row's `now` is
/// [`Timestamp`]`(0)`, so its dispatch key is the key's offset from the creation time
/// (`dispatch_key(t) = t + dispatch_key(0)`), added to the statement's "now". With
/// `reserve` (docs/budgets.md, "Tasks without a source": a cost under no limit, the row's
/// reservation set), that is added to the spend buckets of the statement's "now" too
/// (`sql/reserve_app_task.sql`). `None`: the key was taken, and nothing was written.
pub(super) async fn insert_app_task(
    store: &PostgresStore,
    i: &InsertRow<'_>,
    lock: i64,
    reserve: Option<SpendDelta>,
) -> StoreResult<Option<Task>> {
    debug_assert_eq!(i.now, Timestamp(0), "the statement reads now itself");
    let mut b = match reserve {
        Some(_) => RESERVE_APP_TASK.binder(),
        None => INSERT_APP_TASK.binder(),
    };
    b.group(APP_TASK_NAMES, |b| {
        b.bind("lock_key", lock)
            .bind("fixed_now", store.fixed_now());
    });
    if reserve.is_some() {
        b.group(SPEND_AT_NAMES, |b| {
            b.bind("bucket_ms", SPEND_BUCKET_MS);
        });
    }
    i.bind(&mut b, true);
    bind_join(&mut b, i.new.dispatch.weight);
    if let Some(reserve) = reserve {
        bind_spend_delta(&mut b, i.scope.as_str(), reserve);
    }
    let statement = b.statement()?;
    let mut lone = store.hot.lone().await?;
    let row: StoreResult<Option<TaskRow>> = lone.conn().optional(statement).await;
    lone.done(&row);
    row?.map(TaskRow::into_task).transpose()
}

/// docs/conformance.md#fair-share for a batch of creations: activates the dispatch queues of its queued tasks
/// as one creation after another would, in the order the batch names them (each queue
/// joins at the passes as the ones before it left them, as on SQLite), with the rows
/// held to the commit as a creation's statement holds one task's.
///
/// One queue (the usual batch) is one statement. With several, the existing rows are
/// locked first in (app, scope) order (the lock order among queue rows), then each queue
/// is activated by the same statement in the batch's order; only queues that did not
/// exist yet are written in that order, so two batches creating the same new queues in
/// opposite orders can deadlock, which PostgreSQL ends by failing one of them
/// (`StoreError::Unavailable`: retryable, nothing written).
pub(super) async fn activate_queues(
    tx: &mut Tx,
    queues: &[(String, String, i64)],
) -> StoreResult<()> {
    // Each queue once, where the batch first names it.
    let mut seen = std::collections::HashSet::new();
    let ordered: Vec<&(String, String, i64)> = queues
        .iter()
        .filter(|q| seen.insert((q.0.as_str(), q.1.as_str())))
        .collect();
    if ordered.len() > 1 {
        let mut sorted = ordered.clone();
        sorted.sort();
        let apps: Vec<&str> = sorted.iter().map(|q| q.0.as_str()).collect();
        let scopes: Vec<&str> = sorted.iter().map(|q| q.1.as_str()).collect();
        sqlx::query(
            "SELECT 1 FROM dispatch_queues d \
             JOIN UNNEST($1::TEXT[], $2::TEXT[]) AS q(app, scope) \
             ON d.app = q.app AND d.scope = q.scope \
             ORDER BY d.app, d.scope FOR NO KEY UPDATE OF d",
        )
        .bind(&apps)
        .bind(&scopes)
        .execute(&mut **tx)
        .await?;
    }
    for (app, scope, weight) in ordered {
        let mut b = ACTIVATE_QUEUE.binder();
        let w = Weight::new(*weight).unwrap_or_default();
        b.group(ACTIVATE_NAMES, |b| {
            b.bind("app", app.as_str())
                .bind("scope", scope.as_str())
                .bind("weight", *weight)
                .bind("credit", join_credit(w))
                .bind("stride", stride(w));
        });
        tx.run(b.statement()?).await?;
    }
    Ok(())
}

/// An application's queued task of a batch, ready for [`insert_app_tasks`].
pub(super) struct AppInsert<'a> {
    pub(super) id: TaskId,
    pub(super) new: &'a NewTask,
    pub(super) scope: &'a ScopeId,
    pub(super) subject: Option<&'a Subject>,
    pub(super) config_hash: String,
    pub(super) model_ref: String,
    /// A task without a source that can cost money (under no limit): its reservation as
    /// the row keeps it, and what it adds to its spend buckets.
    pub(super) reservation: Option<(String, crate::shared::cost::SpendDelta)>,
}

/// Inserts a batch's unscoped application tasks (queued, no run, no cache, no
/// admission) in ONE statement, `$16` the creation time, `$17` the trace parents, `$18` the attempt limits, `$20` the reservations (of those that can cost money); returns the rows inserted. A
/// taken effect key (before the batch, or earlier in it) inserts nothing for that item
/// (`ON CONFLICT DO NOTHING`): the caller looks the taken ones up.
/// The rows go in in (app, effect key) order, the first occurrence of a key first:
/// batches racing over the same keys then wait for each other's uncommitted keys in one
/// order and never deadlock (in their item order, two batches holding each other's next
/// key did: `racing_unsourced_batches_record_each_reservation_once`). The items are
/// matched to the rows by id, so the order changes no answer.
pub(super) async fn insert_app_tasks(
    tx: &mut Tx,
    items: &[AppInsert<'_>],
    now: Timestamp,
) -> StoreResult<Vec<Task>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let col = |f: &dyn Fn(&AppInsert<'_>) -> String| items.iter().map(f).collect::<Vec<_>>();
    let ids = col(&|i| i.id.to_string());
    let apps = col(&|i| i.new.owner.app().to_string());
    let keys = col(&|i| i.new.effect_key.to_string());
    let kinds = col(&|i| i.new.request.kind().as_str().to_owned());
    let steps = col(&|i| i.new.step.to_string());
    let scopes = col(&|i| i.scope.to_string());
    let subject_types: Vec<Option<&str>> = items
        .iter()
        .map(|i| i.subject.map(|s| s.kind.as_str()))
        .collect();
    let subject_ids: Vec<Option<&str>> = items
        .iter()
        .map(|i| i.subject.map(|s| s.id.as_str()))
        .collect();
    let models = col(&|i| i.new.model.to_string());
    let model_refs = col(&|i| i.model_ref.clone());
    let hashes = col(&|i| i.config_hash.clone());
    let requests: Vec<&str> = items.iter().map(|i| i.new.request.canonical()).collect();
    let inputs: Vec<&str> = items.iter().map(|i| i.new.request.input_hash()).collect();
    let priorities: Vec<i64> = items
        .iter()
        .map(|i| i64::from(i.new.dispatch.priority))
        .collect();
    let dispatch_keys: Vec<i64> = items.iter().map(|i| i.new.dispatch.key(now)).collect();
    let trace_parents: Vec<Option<String>> = items
        .iter()
        .map(|i| i.new.trace_parent.map(|t| t.to_string()))
        .collect();
    let max_attempts: Vec<i64> = items
        .iter()
        .map(|i| i64::from(i.new.max_attempts.get()))
        .collect();
    let released: Vec<bool> = items.iter().map(|i| i.new.released).collect();
    let reservations: Vec<Option<&str>> = items
        .iter()
        .map(|i| i.reservation.as_ref().map(|(r, _)| r.as_str()))
        .collect();
    let rows: Vec<TaskRow> = sqlx::query_as(concat!(
        "INSERT INTO tasks (id, app, effect_key, kind, step, run_id, scope, subject_type, \
         subject_id, source_id, source_revision, recompute, admitted, model_id, model_ref, \
         model_config_hash, request, input_hash, cache_key, status, cached_from, output, \
         usage, created_at, completed_at, reservation, priority, dispatch_key, trace_parent, \
         max_attempts, released_at) \
         SELECT u.id, u.app, u.effect_key, u.kind, u.step, NULL, u.scope, u.subject_type, \
         u.subject_id, NULL, NULL, FALSE, FALSE, u.model_id, u.model_ref, u.config_hash, \
         u.request, u.input_hash, NULL, 'queued', NULL, NULL, NULL, $16, NULL, u.reservation, \
         u.priority, u.dispatch_key, u.trace_parent, u.max_attempts, \
         CASE WHEN u.released THEN $16 END \
         FROM UNNEST($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], \
           $6::TEXT[], $7::TEXT[], $8::TEXT[], $9::TEXT[], $10::TEXT[], $11::TEXT[], \
           $12::TEXT[], $13::TEXT[], $14::BIGINT[], $15::BIGINT[], $17::TEXT[], $18::BIGINT[], \
           $19::BOOLEAN[], $20::TEXT[]) \
           WITH ORDINALITY \
           AS u(id, app, effect_key, kind, step, scope, subject_type, subject_id, model_id, \
                model_ref, config_hash, request, input_hash, priority, dispatch_key, \
                trace_parent, max_attempts, released, reservation, ord) \
         ORDER BY u.app, u.effect_key, u.ord \
         ON CONFLICT (app, effect_key) DO NOTHING RETURNING ",
        task_columns!()
    ))
    .bind(&ids)
    .bind(&apps)
    .bind(&keys)
    .bind(&kinds)
    .bind(&steps)
    .bind(&scopes)
    .bind(&subject_types)
    .bind(&subject_ids)
    .bind(&models)
    .bind(&model_refs)
    .bind(&hashes)
    .bind(&requests)
    .bind(&inputs)
    .bind(&priorities)
    .bind(&dispatch_keys)
    .bind(now.0)
    .bind(&trace_parents)
    .bind(&max_attempts)
    .bind(&released)
    .bind(&reservations)
    .fetch_all(&mut **tx)
    .await?;
    rows.into_iter().map(TaskRow::into_task).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared::admission::{JOIN_NAMES, NOW_NAMES, ROW_NAMES, TOKEN_NAMES};
    use crate::shared::cost::{SPEND_DELTA_NAMES, SPEND_NAMES};
    use crate::shared::named::check_binds;

    /// Every statement of this module, with the groups its binder binds, in order.
    #[test]
    fn every_statement_and_its_binder_agree() {
        check_binds(&TASK_ROW, &[ROW_NAMES, NOW_NAMES]);
        check_binds(&INSERT_TASK, &[ROW_NAMES, NOW_NAMES, JOIN_NAMES]);
        check_binds(&INSERT_APP_TASK, &[APP_TASK_NAMES, ROW_NAMES, JOIN_NAMES]);
        check_binds(
            &RESERVE_APP_TASK,
            &[
                APP_TASK_NAMES,
                SPEND_AT_NAMES,
                ROW_NAMES,
                JOIN_NAMES,
                SPEND_DELTA_NAMES,
            ],
        );
        check_binds(
            &ADMIT_TASK,
            &[
                ROW_NAMES,
                NOW_NAMES,
                JOIN_NAMES,
                TOKEN_NAMES,
                ADMISSION_NAMES,
                SPEND_NAMES,
                SLOT_NAMES,
            ],
        );
        check_binds(
            &RESERVE_UNSOURCED,
            &[
                ROW_NAMES,
                NOW_NAMES,
                JOIN_NAMES,
                UNSOURCED_NAMES,
                TOKEN_NAMES,
                SPEND_NAMES,
            ],
        );
        check_binds(
            &RESERVE_GUARDED,
            &[
                GUARD_NAMES,
                ROW_NAMES,
                NOW_NAMES,
                JOIN_NAMES,
                UNSOURCED_NAMES,
                TOKEN_NAMES,
                SPEND_NAMES,
            ],
        );
        check_binds(
            &RESERVE_GUARDED_CLAIMED,
            &[
                GUARD_NAMES,
                ROW_NAMES,
                NOW_NAMES,
                UNSOURCED_NAMES,
                TOKEN_NAMES,
                SPEND_NAMES,
            ],
        );
        check_binds(
            &ADMIT_GUARDED,
            &[
                ADMISSION_GUARD_NAMES,
                ROW_NAMES,
                NOW_NAMES,
                JOIN_NAMES,
                TOKEN_NAMES,
                ADMISSION_NAMES,
                SPEND_NAMES,
                SLOT_NAMES,
            ],
        );
        check_binds(&CACHE_HIT, &[HIT_NAMES, ROW_NAMES, NOW_NAMES, SPEND_NAMES]);
        check_binds(&RECORD_SAVED, &[SAVED_NAMES, SPEND_NAMES]);
        check_binds(&ACTIVATE_QUEUE, &[ACTIVATE_NAMES]);
    }
}
