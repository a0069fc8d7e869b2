//! What every move of tasks to a terminal state does besides the rows themselves
//! (docs/conformance.md#admission, docs/conformance.md#lifecycle, docs/conformance.md#workflow-runs), written once: admitted tasks give back their scope's and the service's
//! capacity (scope rows in sorted (app, scope) order, the lock order), failed, canceled
//! and expired tasks free their logical key (their source stays seen), and runs waiting
//! on any of the tasks are woken. Each backend supplies only the statements
//! that differ ([`TerminalStatements`], on its transaction type).
//!
//! docs/conformance.md#cost-settlement's settlement of cost reservations is one step of [`after_terminal`]: the
//! finished tasks' reservations (admitted tasks', and those of tasks without a source
//! that can cost money) are read, core's `settle` says what each cost,
//! and the backend writes the plan.

use super::cost::{SettleRow, SettlementPlan, app_spend_rows, plan_settlement, scope_spend_rows};
use super::rows::FinishedRow;
use super::sql::{Exec, Statement, TxExec};
use super::tasks::fetch_task;
use crate::{StoreResult, Transition};
use async_trait::async_trait;
use std::collections::{BTreeMap, HashSet};
use tollgate_core::{RunId, TaskId, Timestamp};

/// (app, scope) as stored.
pub(crate) type ScopeKey = (String, String);

/// How many of each (app, scope) there are, in sorted (app, scope) order (the lock order
/// for scope rows).
pub(crate) fn count_per_scope(keys: impl IntoIterator<Item = ScopeKey>) -> Vec<(ScopeKey, i64)> {
    let mut per: BTreeMap<ScopeKey, i64> = BTreeMap::new();
    for key in keys {
        *per.entry(key).or_default() += 1;
    }
    per.into_iter().collect()
}

/// Number of `global_finished` stripes.
pub(crate) const FINISHED_STRIPES: u64 = 64;

/// The stripe a batch of finished tasks counts into, spread by the first task's id.
fn finished_stripe(finished: &[FinishedRow]) -> i64 {
    let h = finished
        .first()
        .map(|f| {
            f.id.bytes()
                .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)))
        })
        .unwrap_or(0);
    (h % FINISHED_STRIPES) as i64
}

/// Waking the runs that wait on the finished tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wake {
    /// No run can wait on these tasks (or they were deleted, not finished).
    No,
    /// Wake them, waiting for run rows other transactions hold (single-task transitions
    /// lock the run first).
    Waiting,
    /// Wake them, skipping run rows other transactions hold (sweeps, which lock tasks
    /// before runs; a skipped run is healed by the repair sweep). SQLite has no row
    /// locks and treats this as [`Wake::Waiting`].
    SkipLocked,
}

/// Which steps a terminal move takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TerminalMove {
    /// Free the admission logical keys (every ending but success).
    pub(crate) clear_logical_keys: bool,
    /// Wake the waiting runs.
    pub(crate) wake: Wake,
    /// Settle the cost reservations (docs/conformance.md#cost-settlement; every move, deletion included: a deleted
    /// in-flight task settles as a cancel does, before its row goes — docs/budgets.md,
    /// "Settlement").
    pub(crate) settle: bool,
    /// Write the tasks' webhook events to the outbox (docs/webhooks.md; every move to
    /// a terminal status, not a deletion).
    pub(crate) events: bool,
}

impl TerminalMove {
    /// `running → succeeded`: the step stays counted.
    pub(crate) const SUCCEEDED: TerminalMove = TerminalMove {
        clear_logical_keys: false,
        wake: Wake::Waiting,
        settle: true,
        events: true,
    };
    /// Failed or canceled: the step is freed.
    pub(crate) const ENDED: TerminalMove = TerminalMove {
        clear_logical_keys: true,
        wake: Wake::Waiting,
        settle: true,
        events: true,
    };
    /// Failed or canceled by a sweep.
    pub(crate) const SWEPT: TerminalMove = TerminalMove {
        clear_logical_keys: true,
        wake: Wake::SkipLocked,
        settle: true,
        events: true,
    };
    /// In-flight tasks deleted with their owner: capacity and settlement, run before the
    /// rows are deleted (admission records and logical keys stay; no run owns them).
    pub(crate) const DELETED: TerminalMove = TerminalMove {
        clear_logical_keys: false,
        wake: Wake::No,
        settle: true,
        events: false,
    };
}

/// The statements of a terminal move on a backend's transaction: the counters and the
/// settlement are written once here; a backend supplies the statements on sets of ids
/// (PostgreSQL binds a `TEXT[]`, SQLite a JSON list), its token refund and its charge.
#[async_trait]
pub(crate) trait TerminalStatements: Exec {
    /// Locks the row of the task's run (`$1` task), if it has one (lock order: runs
    /// before tasks), so a transition that wakes the run cannot deadlock with a cancel of
    /// that run; `None` where the backend's write lock already holds every row.
    const LOCK_RUN_OF: Option<&'static str>;
    /// Gives `$1` admitted tasks of app `$2` back on its `app_slots` count (PostgreSQL
    /// counts on stripes, migration 0026; SQLite on one row).
    const GIVE_BACK_APP: &'static str;
    /// Takes [`Self::LOCK_RUN_OF`] for the task, where the backend has one.
    async fn lock_run_of(&mut self, id: TaskId) -> StoreResult<()> {
        if let Some(lock) = Self::LOCK_RUN_OF {
            self.run(Statement::new(lock).bind(id.to_string())).await?;
        }
        Ok(())
    }

    /// `scope_state.active -= n` for one (app, scope).
    async fn give_back_scope(&mut self, key: &ScopeKey, n: i64) -> StoreResult<()> {
        let (app, scope) = key;
        self.run(
            Statement::new(
                "UPDATE scope_state SET active = active - $1 WHERE app = $2 AND scope = $3",
            )
            .bind(n)
            .bind(app)
            .bind(scope),
        )
        .await?;
        Ok(())
    }

    /// `app_slots.active -= n` for one app (docs/budgets.md, "Each app's share of the
    /// global capacity"; [`Self::GIVE_BACK_APP`]).
    async fn give_back_app(&mut self, app: &str, n: i64) -> StoreResult<()> {
        self.run(Statement::new(Self::GIVE_BACK_APP).bind(n).bind(app))
            .await?;
        Ok(())
    }

    /// `global_finished.finished += n` on one stripe.
    async fn count_finished(&mut self, stripe: i64, n: i64) -> StoreResult<()> {
        self.run(
            Statement::new("UPDATE global_finished SET finished = finished + $1 WHERE stripe = $2")
                .bind(n)
                .bind(stripe),
        )
        .await?;
        Ok(())
    }

    /// docs/conformance.md#cost-settlement: writes a settlement — token refunds (scope
    /// rows in (app, scope) order, the lock order of scope rows, docs/locking.md), never
    /// above a bucket's capacity nor below what it holds; spend buckets (scope, then app,
    /// in key order: [`Self::apply_spend`]); and each task's charge (which marks it
    /// settled).
    async fn apply_settlement(&mut self, plan: &SettlementPlan) -> StoreResult<()>;

    /// docs/conformance.md#money-and-tokens: adds the plan's spend deltas to their buckets,
    /// scope buckets then app buckets, each in key order (the lock order,
    /// docs/locking.md); its refunds and charges are not written. Each backend writes
    /// them in as few round trips as its dialect allows ([`spend_rows_each`] otherwise).
    async fn apply_spend(&mut self, plan: &SettlementPlan) -> StoreResult<()>;

    /// docs/conformance.md#cost-settlement: the reservations and usage of the tasks not yet settled.
    async fn unsettled(&mut self, ids: &[String]) -> StoreResult<Vec<SettleRow>>;
    /// Ends the tasks' open attempts (docs/routes.md, "Attempts"): each charged its
    /// reservation, its outcome from the task's end.
    async fn end_open_attempts(&mut self, ids: &[String], now: Timestamp) -> StoreResult<()>;
    /// Frees the admission logical keys of the tasks.
    async fn clear_logical_keys(&mut self, ids: &[String]) -> StoreResult<()>;
    /// Wakes the runs waiting on any of the tasks; returns them.
    async fn wake_runs(
        &mut self,
        ids: &[String],
        now: Timestamp,
        skip_locked: bool,
    ) -> StoreResult<Vec<RunId>>;
}

/// [`TerminalStatements::apply_spend`] one statement per side (and per
/// [`scope_spend_rows`]' chunk): scope rows, then app rows.
pub(crate) async fn spend_rows_each<S: Exec + ?Sized>(
    tx: &mut S,
    plan: &SettlementPlan,
) -> StoreResult<()> {
    for s in scope_spend_rows(&plan.scope)
        .into_iter()
        .chain(app_spend_rows(&plan.app)?)
    {
        tx.run(s).await?;
    }
    Ok(())
}

/// What a move's own statement already returned, so [`after_terminal_with`] need not
/// read it again:
/// - settlement facts (docs/conformance.md#cost-settlement): each row as
///   [`TerminalStatements::unsettled`] would read it after the move, and the charges the
///   statement already wrote (id, nano-dollars, tokens). A planned charge equal to the
///   one written is not written again; any other is.
/// - whether any moved task's event has a listener ([`task_event_listened!`], read in the
///   statement's snapshot): `Some(false)` skips the outbox statement, which would write
///   nothing; `None` (not read) runs it.
///
/// [`task_event_listened!`]: super::webhooks::task_event_listened
#[derive(Debug, Default)]
pub(crate) struct Returned {
    pub(crate) rows: Vec<SettleRow>,
    pub(crate) written: HashSet<(String, i64, i64)>,
    pub(crate) listened: Option<bool>,
}

/// Runs the [`TerminalMove`] for tasks that just left queued/running (or were deleted
/// while there). Returns the woken runs.
pub(crate) async fn after_terminal<S: TerminalStatements + ?Sized>(
    tx: &mut S,
    finished: &[FinishedRow],
    plan: TerminalMove,
    now: Timestamp,
) -> StoreResult<Vec<RunId>> {
    after_terminal_with(tx, finished, plan, now, Returned::default()).await
}

/// [`after_terminal`], with what the move's statement returned ([`Returned`]): only the
/// reserved tasks not among its rows are read, and the outbox statement is skipped when
/// it found no listener.
pub(crate) async fn after_terminal_with<S: TerminalStatements + ?Sized>(
    tx: &mut S,
    finished: &[FinishedRow],
    plan: TerminalMove,
    now: Timestamp,
    returned: Returned,
) -> StoreResult<Vec<RunId>> {
    if finished.is_empty() {
        return Ok(Vec::new());
    }
    let listened = returned.listened;
    let per_scope = count_per_scope(
        finished
            .iter()
            .filter(|f| f.admitted)
            .map(|f| (f.app.clone(), f.scope.clone())),
    );
    let total: i64 = per_scope.iter().map(|(_, n)| n).sum();
    for (scope, n) in &per_scope {
        tx.give_back_scope(scope, *n).await?;
    }
    // An attempt still open ends with its task (charged its reservation, as the
    // settlement below counts it).
    if plan.wake != Wake::No {
        let ids: Vec<String> = finished.iter().map(|f| f.id.clone()).collect();
        tx.end_open_attempts(&ids, now).await?;
    }
    // Every reservation settles, a sourced task's or not (docs/budgets.md, "Tasks without
    // a source"). Spend buckets before the finished stripe: the lock order
    // (docs/locking.md).
    if plan.settle {
        let Returned {
            mut rows, written, ..
        } = returned;
        let known: HashSet<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let reserved: Vec<String> = finished
            .iter()
            .filter(|f| f.reserved && !known.contains(f.id.as_str()))
            .map(|f| f.id.clone())
            .collect();
        if !reserved.is_empty() {
            rows.extend(tx.unsettled(&reserved).await?);
        }
        if !rows.is_empty() {
            let mut settlement = plan_settlement(&rows)?;
            let charged = settlement.charged.clone();
            settlement.charged.retain(|c| !written.contains(c));
            tx.apply_settlement(&settlement).await?;
            // docs/webhooks.md, "Budget thresholds": after the spend buckets, in the
            // lock order (docs/locking.md); not for an owner's deletion.
            if plan.events {
                super::webhooks::record_budget_events(tx, &rows, &charged, now).await?;
            }
        }
    }
    if total > 0 {
        // The apps' slot rows after the spend buckets and before the finished stripe:
        // the order admissions take them in (docs/locking.md).
        let mut per_app: BTreeMap<&str, i64> = BTreeMap::new();
        for ((app, _), n) in &per_scope {
            *per_app.entry(app.as_str()).or_default() += n;
        }
        for (app, n) in per_app {
            tx.give_back_app(app, n).await?;
        }
        tx.count_finished(finished_stripe(finished), total).await?;
    }
    let ids: Vec<String> = finished.iter().map(|f| f.id.clone()).collect();
    if plan.events && listened != Some(false) {
        // New outbox rows only: after every lock of the move (docs/locking.md).
        super::webhooks::record_task_events(tx, &ids, now).await?;
    }
    if plan.clear_logical_keys {
        tx.clear_logical_keys(&ids).await?;
    }
    match plan.wake {
        Wake::No => Ok(Vec::new()),
        Wake::Waiting => tx.wake_runs(&ids, now, false).await,
        Wake::SkipLocked => tx.wake_runs(&ids, now, true).await,
    }
}

/// Commits a single-task transition, running [`after_terminal`] when it applied.
pub(crate) async fn finish<T: TxExec + TerminalStatements>(
    mut tx: T,
    id: TaskId,
    finished: Option<FinishedRow>,
    plan: TerminalMove,
    now: Timestamp,
) -> StoreResult<Transition> {
    let applied = finished.is_some();
    let woken_runs = match finished {
        Some(f) => after_terminal(&mut tx, &[f], plan, now).await?,
        None => Vec::new(),
    };
    let task = fetch_task(&mut tx, &id.to_string()).await?;
    tx.commit_tx().await?;
    Ok(Transition {
        applied,
        task,
        woken_runs,
    })
}
