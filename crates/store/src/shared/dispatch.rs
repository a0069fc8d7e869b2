//! docs/conformance.md#fair-share fair claiming, the dialect-free part both backends call: the queue rows a
//! claim reads and the plan of how many tasks to take from each (core's stride
//! schedule), and how far each queue's virtual time then moves.

use crate::shared::rows::TaskRow;
use crate::{MAX_CLAIM_QUEUES, StoreResult};
use tollgate_core::{
    NewTask, Owner, QueueShare, Task, TaskStatus, Weight, allocate_claims, stride,
};

/// docs/conformance.md#fair-share, both backends: the upsert by which a queued task's (app, scope) queue
/// joins (`sql/queue_join.sql`, its rule in its comments), as the `{queue_join}` part of
/// a statement that names the queue in a one-row `join_params` CTE (`app`, `scope`,
/// `weight`, `credit`: core's [`join_credit`](tollgate_core::join_credit) of the
/// weight, `stride`: core's [`stride`]).
pub(crate) const QUEUE_JOIN: &str = include_str!("sql/queue_join.sql");

/// An active (app, scope) queue as a claim reads it.
#[derive(sqlx::FromRow, Debug, Clone)]
pub(crate) struct QueueRow {
    pub(crate) app: String,
    pub(crate) scope: String,
    pub(crate) weight: i64,
    pub(crate) pass: i64,
}

impl QueueRow {
    fn weight(&self) -> Weight {
        // Rows are written from a checked weight; a corrupt one counts as the default.
        Weight::new(self.weight).unwrap_or_default()
    }

    /// How far the queue's pass moves for `claimed` tasks.
    pub(crate) fn advance(&self, claimed: u32) -> i64 {
        stride(self.weight()).saturating_mul(i64::from(claimed))
    }
}

/// One queue's share of a claim.
#[derive(Debug, Clone)]
pub(crate) struct QueueTake {
    pub(crate) queue: QueueRow,
    pub(crate) take: u32,
}

/// docs/conformance.md#fair-share: splits `n` claim slots across the queues (least virtual time first) by the
/// stride schedule; queues that get nothing are left out.
pub(crate) fn plan_claim(queues: Vec<QueueRow>, n: u32) -> Vec<QueueTake> {
    let shares: Vec<QueueShare> = queues
        .iter()
        .map(|q| QueueShare {
            pass: q.pass,
            weight: q.weight(),
        })
        .collect();
    let takes = allocate_claims(&shares, n);
    queues
        .into_iter()
        .zip(takes)
        .filter(|(_, take)| *take > 0)
        .map(|(queue, take)| QueueTake { queue, take })
        .collect()
}

/// The backend's statements of a fair claim (docs/conformance.md#fair-share), for [`claim_fair`].
#[async_trait::async_trait]
pub(crate) trait FairClaim: Send {
    /// Writes what `view` owes the queues' passes.
    async fn pay_debt(&mut self, view: &QueueView) -> StoreResult<()>;
    /// Reads the active queues with the least pass (at most `limit`, in pass order).
    async fn read_queues(&mut self, limit: i64) -> StoreResult<Vec<QueueRow>>;
    /// Claims each planned queue's share, its tasks in dispatch-key order.
    async fn claim(&mut self, plan: &[QueueTake]) -> StoreResult<Vec<TaskRow>>;
    /// Deactivates, in one batch, those of `queues` (they gave nothing to this claim, in
    /// (app, scope) order) that hold no queued task, and drops them from `view`
    /// ([`QueueView::forget`]). Runs after the claim has its tasks; a backend may also
    /// run it after the claim returns (PostgreSQL's background batch), as long as the
    /// instance's next read of the queues waits for it.
    async fn deactivate_empty(&mut self, view: &QueueView, queues: EmptyQueues) -> StoreResult<()>;
}

/// Queues that gave nothing to a claim, in (app, scope) order: the candidates for
/// deactivation ([`FairClaim::deactivate_empty`]).
pub(crate) type EmptyQueues = Vec<(String, String)>;

/// docs/conformance.md#fair-share: claims up to `limit` tasks across the active queues with the least virtual
/// time, by the stride plan, in rounds; both backends run this loop with their own
/// statements ([`FairClaim`]).
///
/// Each round plans over at most [`MAX_CLAIM_QUEUES`] queues from the instance's view
/// (read again when it is stale or cannot name the queues a read would list:
/// [`QueueView::fresh`]), claims, and owes each queue's pass move. A queue that gave
/// fewer than planned sits out the later rounds (nothing more of it is claimable now);
/// only one that gave nothing is a candidate for deactivation (so a scope submitting one
/// task at a time is not deactivated and reactivated for every task). Rounds go on until
/// the claim is full or every active queue has come up short: each round that is not
/// full sets at least one queue aside, so the loop ends, and a claim never comes back
/// short while a task is claimable (docs/engine.md, "Dispatch order": a short claim lets
/// workers sleep for the poll interval). When the view is fresh and lists every active
/// queue and all of them came up short, nothing more is claimable: a claim that holds
/// tasks returns at once instead of reading the queues again (one that holds none reads
/// them, so a worker does not sleep on a view that missed another replica's queue).
///
/// The queues that gave nothing are deactivated (when empty) after the rounds, all in
/// one batch ([`FairClaim::deactivate_empty`]), not one transaction each between the
/// claim and its tasks. A view with no period ([`QueueView::writes_through`]) writes the
/// claim's moves before it returns.
pub(crate) async fn claim_fair(
    view: &QueueView,
    steps: &mut dyn FairClaim,
    limit: u32,
) -> StoreResult<Vec<TaskRow>> {
    let mut claimed: Vec<TaskRow> = Vec::new();
    let mut spent: std::collections::BTreeSet<(String, String)> = Default::default();
    let mut empty: std::collections::BTreeSet<(String, String)> = Default::default();
    loop {
        let want = limit.saturating_sub(claimed.len() as u32);
        if want == 0 {
            break;
        }
        let n = want.min(MAX_CLAIM_QUEUES) as usize;
        let queues = match view.fresh(n, &spent) {
            Some(q) if !q.is_empty() => q,
            // Fresh, listing every active queue, all of them set aside: a read would
            // list only queues other instances opened within the period (which this
            // claim's first round did not see either).
            Some(_) if !claimed.is_empty() => break,
            _ => {
                // The debt first: the rows read then hold this instance's moves. Read
                // past the queues set aside, so n others are listed when they exist,
                // and as many as a claim may plan over, so the view serves the next
                // claims as far as it can (QueueView::fresh).
                steps.pay_debt(view).await?;
                let asked = MAX_CLAIM_QUEUES as usize + spent.len();
                let read = steps
                    .read_queues(i64::try_from(asked).unwrap_or(i64::MAX))
                    .await?;
                let mut all = view.keep(read, asked);
                all.retain(|q| !spent.contains(&(q.app.clone(), q.scope.clone())));
                all.truncate(n);
                all
            }
        };
        if queues.is_empty() {
            break;
        }
        let plan = plan_claim(queues, want);
        let rows = steps.claim(&plan).await?;
        let mut short = false;
        for take in &plan {
            let (app, scope) = (&take.queue.app, &take.queue.scope);
            let got = rows
                .iter()
                .filter(|r| r.app() == app && r.scope() == scope)
                .count() as u32;
            view.owe(app, scope, take.queue.advance(got));
            if got < take.take {
                short = true;
                spent.insert((app.clone(), scope.clone()));
            }
            if got == 0 {
                empty.insert((app.clone(), scope.clone()));
            }
        }
        claimed.extend(rows);
        if !short {
            // Full: every planned slot was filled.
            break;
        }
    }
    if !empty.is_empty() {
        steps
            .deactivate_empty(view, empty.into_iter().collect())
            .await?;
    }
    if view.writes_through() {
        steps.pay_debt(view).await?;
    }
    Ok(claimed)
}

/// docs/conformance.md#dispatch around creations, both backends: unless they keep the view (`keeps_view`,
/// [`QueueView::covers`] of the new tasks), the pass debt is paid first (`pay`), so a
/// queue they activate joins at the passes as this instance's claims left them, and the
/// view is dropped after (they may have activated a queue it does not list).
pub(crate) async fn around_creation<T>(
    view: &QueueView,
    keeps_view: bool,
    pay: impl std::future::Future<Output = StoreResult<()>>,
    create: impl std::future::Future<Output = T>,
) -> StoreResult<T> {
    if !keeps_view {
        pay.await?;
    }
    let created = create.await;
    if !keeps_view {
        view.clear();
    }
    Ok(created)
}

/// How long a store instance reuses its last read of the active queues (docs/conformance.md#fair-share), by
/// default (`queue_view_ttl` of the store's options).
/// Within it, a claim is one statement: the view is moved by this instance's own
/// claims, dropped by its own creations, and read again sooner only when it cannot name
/// the queues a read would list ([`QueueView::fresh`]: it holds the least passes, and
/// this instance's claims moved or emptied those), so claims plan the same at any
/// timing and the view only misses other replicas' claims and new queues for this long.
/// The same period bounds how long this instance's claims stay unwritten to the queues'
/// passes ([`QueueView::owe`]).
pub(crate) const QUEUE_VIEW_TTL: std::time::Duration = std::time::Duration::from_millis(50);

/// A queue's pass moves this instance's claims owe the database (docs/conformance.md#fair-share).
pub(crate) type PassDebt = Vec<(String, String, i64)>;

#[derive(Debug, Default)]
struct ViewState {
    seen: Option<Seen>,
    /// Pass moves of this instance's claims not yet written, by (app, scope).
    owed: std::collections::BTreeMap<(String, String), i64>,
}

/// A read of the active queues with the least passes, as this instance's claims since
/// moved them.
#[derive(Debug)]
struct Seen {
    at: std::time::Instant,
    /// The queues read, in claim order.
    rows: Vec<QueueRow>,
    /// When the read returned as many rows as it asked for (more queues may be active):
    /// the last row's (pass, app, scope) as read. Every queue it did not list sorts after
    /// it, so the rows list every active queue only up to there. `None`: the read
    /// listed every active queue.
    horizon: Option<(i64, String, String)>,
}

/// A store instance's recent view of the active queues (see [`QUEUE_VIEW_TTL`]), and
/// the pass moves its claims have not written yet.
///
/// A claim does not update the queue rows: it moves this view and owes the move; the
/// owed moves are written in one statement when the view is read again (at least every
/// [`QUEUE_VIEW_TTL`] while claims go on). So claims never wait on each other's queue
/// row locks, and the passes still count every claim: other replicas see this
/// instance's claims at most one period late, and a crash forgets at most that period
/// of one instance's moves — shares, never tasks.
#[derive(Debug)]
pub(crate) struct QueueView {
    state: std::sync::Mutex<ViewState>,
    /// How long a read stays fresh ([`QUEUE_VIEW_TTL`] unless the store was opened with
    /// another period).
    ttl: std::time::Duration,
}

impl Default for QueueView {
    fn default() -> QueueView {
        QueueView::with_ttl(QUEUE_VIEW_TTL)
    }
}

impl QueueView {
    /// A view whose reads stay fresh for `ttl` (zero: every claim reads the queues).
    pub(crate) fn with_ttl(ttl: std::time::Duration) -> QueueView {
        QueueView {
            state: std::sync::Mutex::default(),
            ttl,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ViewState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The `n` least-pass queues of a view younger than the TTL, in claim order, leaving
    /// out `spent` (queues that came up short in this claim): the queues a read of the
    /// database would list now (but for other instances' moves and new queues within
    /// the period), so a claim plans the same at any timing.
    ///
    /// `None` (read again) when the view is stale, or when it listed only the least
    /// passes (its `horizon`) and cannot name `n` queues sorting before every queue it
    /// did not list: this instance's claims moved its queues past unlisted ones, or
    /// emptied them, and a read would list those others.
    pub(crate) fn fresh(
        &self,
        n: usize,
        spent: &std::collections::BTreeSet<(String, String)>,
    ) -> Option<Vec<QueueRow>> {
        let state = self.lock();
        let seen = state.seen.as_ref()?;
        if seen.at.elapsed() >= self.ttl || seen.rows.is_empty() {
            return None;
        }
        let mut rows: Vec<QueueRow> = seen
            .rows
            .iter()
            .filter(|q| !spent.contains(&(q.app.clone(), q.scope.clone())))
            .cloned()
            .collect();
        rows.sort_by(|a, b| (a.pass, &a.app, &a.scope).cmp(&(b.pass, &b.app, &b.scope)));
        rows.truncate(n);
        if let Some((pass, app, scope)) = &seen.horizon {
            let listed = rows.last().is_some_and(|q| {
                (q.pass, q.app.as_str(), q.scope.as_str()) <= (*pass, app.as_str(), scope.as_str())
            });
            if rows.len() < n || !listed {
                return None;
            }
        }
        Some(rows)
    }

    /// Keeps a fresh read of the database's passes (the least ones, in pass order, at
    /// most `asked` rows), moved by what this instance still owes them (moves it could
    /// not write yet), and returns the rows in claim order.
    pub(crate) fn keep(&self, mut rows: Vec<QueueRow>, asked: usize) -> Vec<QueueRow> {
        let horizon = if rows.len() >= asked {
            rows.last()
                .map(|q| (q.pass, q.app.clone(), q.scope.clone()))
        } else {
            None
        };
        let mut state = self.lock();
        for q in &mut rows {
            if let Some(by) = state.owed.get(&(q.app.clone(), q.scope.clone())) {
                q.pass = q.pass.saturating_add(*by);
            }
        }
        rows.sort_by(|a, b| (a.pass, &a.app, &a.scope).cmp(&(b.pass, &b.app, &b.scope)));
        state.seen = Some(Seen {
            at: std::time::Instant::now(),
            rows: rows.clone(),
            horizon,
        });
        rows
    }

    /// A claim of this instance moved a queue's pass by `by`: the view moves now, the
    /// database when the debt is paid ([`QueueView::debt`]).
    pub(crate) fn owe(&self, app: &str, scope: &str, by: i64) {
        if by == 0 {
            return;
        }
        let mut state = self.lock();
        if let Some(seen) = state.seen.as_mut()
            && let Some(q) = seen
                .rows
                .iter_mut()
                .find(|q| q.app == app && q.scope == scope)
        {
            q.pass = q.pass.saturating_add(by);
        }
        let owed = state
            .owed
            .entry((app.to_owned(), scope.to_owned()))
            .or_insert(0);
        *owed = owed.saturating_add(by);
    }

    /// Whether the view has no period (a zero TTL): then every claim reads the queues
    /// and writes its own moves before it returns, so the rows are always the database's
    /// whole truth (what tests comparing several instances with a model need).
    pub(crate) fn writes_through(&self) -> bool {
        self.ttl.is_zero()
    }

    /// Whether any move is owed. A creation pays first (so a queue it activates joins
    /// at the passes as this instance's own claims left them).
    pub(crate) fn owes(&self) -> bool {
        !self.lock().owed.is_empty()
    }

    /// What is owed, in (app, scope) order (the lock order of queue rows).
    pub(crate) fn debt(&self) -> PassDebt {
        self.lock()
            .owed
            .iter()
            .map(|((app, scope), by)| (app.clone(), scope.clone(), *by))
            .collect()
    }

    /// The moves of `paid` were written: they are owed no more (moves owed since
    /// stay owed).
    pub(crate) fn paid(&self, paid: &[(String, String, i64)]) {
        let mut state = self.lock();
        for (app, scope, by) in paid {
            let key = (app.clone(), scope.clone());
            if let Some(owed) = state.owed.get_mut(&key) {
                *owed = owed.saturating_sub(*by);
                if *owed == 0 {
                    state.owed.remove(&key);
                }
            }
        }
    }

    /// Drops one queue from the view (it was found empty and deactivated, or inactive).
    pub(crate) fn forget(&self, app: &str, scope: &str) {
        if let Some(seen) = self.lock().seen.as_mut() {
            seen.rows.retain(|q| q.app != app || q.scope != scope);
        }
    }

    /// After the commit of a creation that inserted `task` from `new`: a task created
    /// claimed ([`claimed_at_creation`]) counts in its queue's virtual time as a fair
    /// claim does.
    pub(crate) fn owe_creation_claim(&self, new: &NewTask, task: &Task) {
        if claimed_at_creation(new, task) {
            self.owe(
                task.app.as_str(),
                task.scope.as_str(),
                stride(new.dispatch.weight),
            );
        }
    }

    /// Forgets the view (a creation); what is owed stays.
    pub(crate) fn clear(&self) {
        self.lock().seen = None;
    }

    /// Whether creations of these tasks leave the view as it is: it is fresh (younger
    /// than its period, [`QUEUE_VIEW_TTL`] by default) and lists every task's queue, so they only add tasks to
    /// queues it already orders and activate none (unless another instance deactivated
    /// one within the period; it then joins at the passes as written, without this
    /// instance's unpaid moves: shares, for one period, never tasks). Such creations
    /// neither pay the debt first nor drop the view, so a scope submitting one task at a
    /// time costs its claims no read of the queues. Run tasks (their scope is the run's)
    /// never do. Tasks asked claimed (`NewTask::claim_by`: created running, or a cache
    /// hit created succeeded) join no queue and activate none, so they leave any view
    /// as it is: a door call pays no debt first (its own claim's move is owed after it,
    /// and paid by the next fair claim's read or the next creation that joins a queue).
    pub(crate) fn covers(&self, news: &[NewTask]) -> bool {
        if news.iter().all(|new| new.claim_by.is_some()) {
            return true;
        }
        let state = self.lock();
        let Some(seen) = state.seen.as_ref() else {
            return false;
        };
        seen.at.elapsed() < self.ttl
            && news.iter().all(|new| match &new.owner {
                Owner::Application { app, scope, .. } => seen
                    .rows
                    .iter()
                    .any(|q| q.app == app.as_str() && q.scope == scope.as_str()),
                Owner::Run { .. } => false,
            })
    }
}

/// Whether `task`, which a creation of `new` inserted, was created claimed
/// (`NewTask::claim_by`, docs/engine.md, "Tasks claimed at creation"): its insert
/// wrote it running. A cache hit asked claimed is inserted succeeded instead.
pub(crate) fn claimed_at_creation(new: &NewTask, task: &Task) -> bool {
    new.claim_by.is_some() && task.status == TaskStatus::Running
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queues in memory: (app, scope) → (pass, queued tasks, active); records the
    /// statements a claim runs, in order.
    #[derive(Default)]
    struct FakeQueues {
        queues: std::collections::BTreeMap<(String, String), (i64, u32, bool)>,
        log: Vec<String>,
    }

    impl FakeQueues {
        fn with(queues: &[(&str, i64, u32)]) -> FakeQueues {
            FakeQueues {
                queues: queues
                    .iter()
                    .map(|(scope, pass, tasks)| {
                        (("a".into(), (*scope).into()), (*pass, *tasks, true))
                    })
                    .collect(),
                log: Vec::new(),
            }
        }
    }

    #[async_trait::async_trait]
    impl FairClaim for FakeQueues {
        async fn pay_debt(&mut self, view: &QueueView) -> StoreResult<()> {
            let debt = view.debt();
            if !debt.is_empty() {
                self.log.push("pay".into());
            }
            for (app, scope, by) in &debt {
                if let Some(q) = self.queues.get_mut(&(app.clone(), scope.clone())) {
                    q.0 += by;
                }
            }
            view.paid(&debt);
            Ok(())
        }

        async fn read_queues(&mut self, limit: i64) -> StoreResult<Vec<QueueRow>> {
            self.log.push("read".into());
            let mut rows: Vec<QueueRow> = self
                .queues
                .iter()
                .filter(|(_, q)| q.2)
                .map(|((app, scope), q)| QueueRow {
                    app: app.clone(),
                    scope: scope.clone(),
                    weight: 1,
                    pass: q.0,
                })
                .collect();
            rows.sort_by(|a, b| (a.pass, &a.scope).cmp(&(b.pass, &b.scope)));
            rows.truncate(limit as usize);
            Ok(rows)
        }

        async fn claim(&mut self, plan: &[QueueTake]) -> StoreResult<Vec<TaskRow>> {
            self.log.push("claim".into());
            let mut rows = Vec::new();
            for take in plan {
                let key = (take.queue.app.clone(), take.queue.scope.clone());
                let q = self.queues.get_mut(&key).expect("planned queue exists");
                let got = q.1.min(take.take);
                q.1 -= got;
                rows.extend((0..got).map(|_| TaskRow::for_test(&key.0, &key.1)));
            }
            Ok(rows)
        }

        async fn deactivate_empty(
            &mut self,
            view: &QueueView,
            queues: EmptyQueues,
        ) -> StoreResult<()> {
            let names: Vec<&str> = queues.iter().map(|q| q.1.as_str()).collect();
            self.log.push(format!("deactivate {}", names.join(",")));
            for key in &queues {
                if let Some(q) = self.queues.get_mut(key)
                    && q.1 == 0
                {
                    q.2 = false;
                    view.forget(&key.0, &key.1);
                }
            }
            Ok(())
        }
    }

    #[tokio::test]
    async fn empty_queues_are_deactivated_once_in_one_batch_after_the_rounds() {
        let view = QueueView::with_ttl(std::time::Duration::from_secs(3600));
        let mut db = FakeQueues::with(&[("x", 0, 5), ("y", 0, 0), ("z", 0, 0)]);
        let got = claim_fair(&view, &mut db, 6).await.expect("claim");
        assert_eq!(got.len(), 5, "every claimable task");
        // Round 1 from a read, round 2 from the fresh view (x alone); then the view lists
        // every active queue and each came up short: no third read. The empty queues are
        // deactivated together at the end, not one transaction each between the rounds.
        assert_eq!(
            db.log,
            vec!["read", "claim", "claim", "deactivate y,z"],
            "statements of the claim"
        );
        assert!(!db.queues[&("a".into(), "y".into())].2);
        assert!(!db.queues[&("a".into(), "z".into())].2);
        let listed: Vec<String> = view
            .fresh(3, &Default::default())
            .expect("fresh view")
            .into_iter()
            .map(|q| q.scope)
            .collect();
        assert_eq!(listed, vec!["x"], "the view forgets the deactivated queues");
    }

    #[tokio::test]
    async fn a_claim_that_holds_nothing_reads_the_queues_again_before_it_gives_up() {
        let view = QueueView::with_ttl(std::time::Duration::from_secs(3600));
        let mut db = FakeQueues::with(&[("x", 0, 0)]);
        view.keep(db.read_queues(64).await.expect("read"), 64);
        db.log.clear();
        let got = claim_fair(&view, &mut db, 4).await.expect("claim");
        assert!(got.is_empty());
        // A short claim lets workers sleep: a view that may have missed another
        // replica's queue is read again first.
        assert_eq!(db.log, vec!["claim", "read", "deactivate x"]);
    }

    #[tokio::test]
    async fn a_view_with_no_period_reads_every_round_and_writes_its_moves() {
        let view = QueueView::with_ttl(std::time::Duration::ZERO);
        let mut db = FakeQueues::with(&[("x", 0, 5), ("y", 0, 0)]);
        let got = claim_fair(&view, &mut db, 6).await.expect("claim");
        assert_eq!(got.len(), 5);
        assert_eq!(
            db.log,
            vec![
                "read",
                "claim",
                "pay",
                "read",
                "claim",
                "pay",
                "read",
                "deactivate y"
            ],
        );
        assert!(
            view.debt().is_empty(),
            "moves written before the claim returns"
        );
    }

    fn row(scope: &str, pass: i64) -> QueueRow {
        QueueRow {
            app: "a".into(),
            scope: scope.into(),
            weight: 1,
            pass,
        }
    }

    #[test]
    fn owed_moves_shape_the_view_until_paid() {
        let view = QueueView::default();
        view.owe("a", "x", 5);
        // A read that does not include the unpaid move yet is moved by it.
        let rows = view.keep(vec![row("x", 0), row("y", 3)], 64);
        assert_eq!(
            rows.iter()
                .map(|q| (q.scope.as_str(), q.pass))
                .collect::<Vec<_>>(),
            vec![("y", 3), ("x", 5)]
        );
        view.owe("a", "y", 4);
        assert_eq!(view.fresh(1, &Default::default()).unwrap()[0].scope, "x");
        let debt = view.debt();
        assert_eq!(
            debt,
            vec![("a".into(), "x".into(), 5), ("a".into(), "y".into(), 4)]
        );
        view.owe("a", "x", 1);
        view.paid(&debt);
        assert_eq!(
            view.debt(),
            vec![("a".into(), "x".into(), 1)],
            "moves since stay owed"
        );
        view.clear();
        assert!(view.fresh(1, &Default::default()).is_none());
        assert_eq!(view.debt().len(), 1, "clearing the view keeps the debt");
    }

    #[test]
    fn a_view_of_the_least_passes_serves_only_what_a_read_would_list() {
        let view = QueueView::with_ttl(std::time::Duration::from_secs(3600));
        let none = Default::default();
        // Asked for 3 rows, got 3: queues past "z" at pass 5 may be active, unlisted.
        view.keep(vec![row("x", 0), row("y", 1), row("z", 5)], 3);
        assert_eq!(view.fresh(2, &none).map(|q| q.len()), Some(2));
        assert!(
            view.fresh(4, &none).is_none(),
            "4 queues: a read would list unlisted ones"
        );
        // x's claims move it to 5: still before every unlisted queue (after z by scope).
        view.owe("a", "x", 5);
        let order: Vec<String> = view
            .fresh(3, &none)
            .unwrap()
            .into_iter()
            .map(|q| q.scope)
            .collect();
        assert_eq!(order, vec!["y", "x", "z"]);
        // y's claims move it past z: an unlisted queue at pass 5 or 6 would come first.
        view.owe("a", "y", 6);
        assert!(view.fresh(3, &none).is_none());
        assert_eq!(view.fresh(2, &none).map(|q| q.len()), Some(2));
        // Emptied queues leave too few listed before the horizon.
        view.forget("a", "x");
        assert!(view.fresh(2, &none).is_none());
        assert!(
            view.fresh(2, &[("a".to_owned(), "z".to_owned())].into_iter().collect())
                .is_none(),
            "queues set aside do not count either"
        );
        // A read that got fewer rows than it asked for listed every active queue.
        view.keep(vec![row("x", 0), row("y", 1)], 3);
        view.owe("a", "x", 100);
        let order: Vec<String> = view
            .fresh(3, &none)
            .unwrap()
            .into_iter()
            .map(|q| q.scope)
            .collect();
        assert_eq!(order, vec!["y", "x"]);
    }
}
