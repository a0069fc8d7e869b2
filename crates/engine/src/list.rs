//! docs/conformance.md#listings: what a caller can list and see — its app's tasks, runs, pipelines, scopes
//! with their budget state, and the app's task stats. Subject visibility (its rules in
//! `access.rs`) applies here once: a caller bound to a subject lists only that subject's
//! tasks and runs, and may not read the app-wide aggregates (scopes, stats), which count
//! every subject's work.

use crate::access::CallerView;
use crate::error::EngineError;
use std::time::Duration;
use tollgate_core::SystemClock;
use tollgate_core::admission::{BucketState, TOKEN_UNITS};
use tollgate_core::{Budget, BudgetName, ErrorCode, ScopeId, Task, TaskStatus, Timestamp};
use tollgate_store::list::{
    ListCursor, ListPage, ListedRun, PipelineSummary, RunListQuery, ScopeSnapshot, TaskListQuery,
};

/// The window `GET /v1/stats` looks back over.
pub const STATS_WINDOW: Duration = Duration::from_secs(3600);

/// The recent window of `GET /v1/stats`' current throughput: the last minute (a burst
/// shows at its rate, not averaged over the hour). It is also the width of each bucket
/// of the per-minute series.
pub const STATS_RECENT_WINDOW: Duration = Duration::from_secs(60);

/// Tasks that finished in one minute of the stats window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MinuteCount {
    /// The minute's start (the window's start plus whole minutes).
    pub start: Timestamp,
    /// Succeeded in it.
    pub succeeded: u64,
    /// Failed in it.
    pub failed: u64,
    /// Canceled in it.
    pub canceled: u64,
}

impl MinuteCount {
    /// Every task that finished in the minute.
    pub fn finished(&self) -> u64 {
        self.succeeded + self.failed + self.canceled
    }
}

/// A scope's budget policy in force and its live state (docs/conformance.md#admission, docs/conformance.md#listings).
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeState {
    /// The scope.
    pub scope: ScopeId,
    /// The name of the policy the app's scoped tasks get when they name none.
    pub policy_name: BudgetName,
    /// Its limits.
    pub policy: Budget,
    /// Tokens in the bucket now (refilled to now; a full bucket before the first
    /// admission).
    pub bucket_tokens: f64,
    /// Admitted tasks still queued or running.
    pub active: u64,
    /// Distinct sources admitted in the 24 h window.
    pub sources_in_window: u64,
    /// Distinct steps admitted in the window (all sources).
    pub steps_in_window: u64,
    /// The most distinct steps one source has in the window.
    pub busiest_source_steps: u64,
    /// Admission records in the window.
    pub admissions_in_window: u64,
    /// The newest admission in the window.
    pub last_admitted_at: Option<Timestamp>,
    /// Spend and tokens in the window, settled plus reserved (docs/conformance.md#cost-usage).
    pub cost: Option<ScopeCost>,
}

/// A scope's spend and tokens in the 24 h window, settled plus reserved (docs/conformance.md#cost-usage; the
/// usage endpoints give the split).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScopeCost {
    /// Settled plus reserved spend, micro-dollars (US).
    pub spent_micros: u64,
    /// Settled plus reserved model tokens.
    pub tokens: u64,
}

/// Counts of an app's tasks now and over the last hour, from the database.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskStats {
    /// Start of the window (now − 1 h).
    pub since: Timestamp,
    /// Tasks queued now.
    pub queued: u64,
    /// Tasks running now.
    pub running: u64,
    /// Finished in the window: succeeded.
    pub succeeded: u64,
    /// Finished in the window: failed.
    pub failed: u64,
    /// Finished in the window: canceled.
    pub canceled: u64,
    /// Failures and cancellations in the window by error code, most frequent first.
    pub failures_by_code: Vec<(String, u64)>,
    /// Succeeded tasks of the window served from the cache.
    pub cache_hits: u64,
    /// `cache_hits / succeeded` (`None` when nothing succeeded).
    pub cache_hit_rate: Option<f64>,
    /// Claimed → finished times of tasks a worker ran, in milliseconds: p50, p90, p99.
    pub run_ms_percentiles: Option<[i64; 3]>,
    /// Whether the window held more finished tasks than were sampled.
    pub sampled: bool,
    /// The window minute by minute, oldest first: 60 buckets of [`STATS_RECENT_WINDOW`],
    /// the last one ending now (so it is the recent throughput).
    pub per_minute: Vec<MinuteCount>,
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

impl CallerView {
    /// The app's tasks, newest first (a caller bound to a subject: only its own).
    pub async fn list_tasks(&self, query: &TaskListQuery) -> Result<ListPage<Task>, EngineError> {
        let mut query = query.clone();
        if let Some(s) = self.subject_filter() {
            query.subject = Some(s);
        }
        Ok(self
            .tollgate()
            .inner
            .store
            .list_tasks(self.app(), &query)
            .await?)
    }

    /// The app's runs, newest first (a caller bound to a subject: only its own).
    pub async fn list_runs(
        &self,
        query: &RunListQuery,
    ) -> Result<ListPage<ListedRun>, EngineError> {
        let mut query = query.clone();
        if let Some(s) = self.subject_filter() {
            query.subject = Some(s);
        }
        Ok(self
            .tollgate()
            .inner
            .store
            .list_runs(self.app(), &query)
            .await?)
    }

    /// The app's pipelines (definitions are the app's, whoever the caller acts for).
    pub async fn list_pipelines(
        &self,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> Result<ListPage<PipelineSummary>, EngineError> {
        Ok(self
            .tollgate()
            .inner
            .store
            .list_pipelines(self.app(), after, limit)
            .await?)
    }

    fn scope_state(
        &self,
        snapshot: ScopeSnapshot,
        scope: ScopeId,
    ) -> Result<ScopeState, EngineError> {
        let (policy_name, policy) = self.tollgate().inner.budgets.resolve(self.app(), None)?;
        let now = snapshot_now(&snapshot);
        let burst = policy.burst.get();
        let bucket = snapshot
            .bucket
            .unwrap_or_else(|| BucketState::full(burst, now))
            .refilled(burst, policy.tasks_per_minute.get(), now);
        Ok(ScopeState {
            scope,
            policy_name,
            policy,
            bucket_tokens: bucket.units as f64 / TOKEN_UNITS as f64,
            active: snapshot.active,
            sources_in_window: snapshot.sources_in_window,
            steps_in_window: snapshot.steps_in_window,
            busiest_source_steps: snapshot.busiest_source_steps,
            admissions_in_window: snapshot.admissions_in_window,
            last_admitted_at: snapshot.last_admitted_at,
            cost: None,
        })
    }

    /// The app's scopes with admission activity in the 24 h window, with their state.
    /// App-wide: a caller bound to a subject is refused.
    pub async fn list_scopes(
        &self,
        after: Option<&ListCursor>,
        limit: u32,
    ) -> Result<ListPage<ScopeState>, EngineError> {
        self.no_subject(
            "a key bound to a subject may not read the app's scopes: use a key of the app",
        )?;
        let page = self
            .tollgate()
            .inner
            .store
            .list_scopes(self.app(), after, limit)
            .await?;
        let mut items = Vec::with_capacity(page.items.len());
        for snapshot in page.items {
            let Some(scope) = snapshot.scope.clone() else {
                continue;
            };
            let mut state = self.scope_state(snapshot, scope)?;
            state.cost = Some(self.scope_cost(&state.scope).await?);
            items.push(state);
        }
        Ok(ListPage {
            items,
            next: page.next,
        })
    }

    /// One scope's policy and live state (zeros and a full bucket for a quiet scope).
    pub async fn scope(&self, scope: &ScopeId) -> Result<ScopeState, EngineError> {
        self.no_subject(
            "a key bound to a subject may not read a scope's state: use a key of the app",
        )?;
        let snapshot = self
            .tollgate()
            .inner
            .store
            .scope_snapshot(self.app(), scope)
            .await?;
        let mut state = self.scope_state(snapshot, scope.clone())?;
        state.cost = Some(self.scope_cost(scope).await?);
        Ok(state)
    }

    /// docs/conformance.md#cost-usage for a scope's state: settled plus reserved spend (micro-dollars) and
    /// model tokens in the window, from the store's spend buckets.
    async fn scope_cost(&self, scope: &ScopeId) -> Result<ScopeCost, EngineError> {
        let w = self
            .tollgate()
            .inner
            .store
            .spend(self.app(), Some(scope))
            .await?;
        Ok(ScopeCost {
            spent_micros: ((w.settled_nano + w.reserved_nano).max(0) / 1000) as u64,
            tokens: (w.settled_tokens + w.reserved_tokens).max(0) as u64,
        })
    }

    /// The app's task stats over the last hour, computed from the database (not the
    /// metrics registry, which counts every app of the server together).
    pub async fn stats(&self) -> Result<TaskStats, EngineError> {
        self.no_subject(
            "a key bound to a subject may not read the app's stats: use a key of the app",
        )?;
        let raw = self
            .tollgate()
            .inner
            .store
            .task_stats(self.app(), None)
            .await?;
        let now = raw
            .now
            .unwrap_or_else(|| tollgate_core::Clock::now(&SystemClock));
        let mut stats = TaskStats {
            since: now.minus(STATS_WINDOW),
            queued: raw.queued,
            running: raw.running,
            succeeded: 0,
            failed: 0,
            canceled: 0,
            failures_by_code: Vec::new(),
            cache_hits: 0,
            cache_hit_rate: None,
            run_ms_percentiles: None,
            sampled: raw.truncated,
            per_minute: minute_buckets(now),
        };
        let mut codes: std::collections::BTreeMap<String, u64> = Default::default();
        let mut run_ms = Vec::new();
        for f in &raw.finished {
            if let Some(bucket) = minute_of(&mut stats.per_minute, stats.since, f.completed_at) {
                match f.status {
                    TaskStatus::Succeeded => bucket.succeeded += 1,
                    TaskStatus::Failed => bucket.failed += 1,
                    TaskStatus::Canceled => bucket.canceled += 1,
                    _ => {}
                }
            }
            match f.status {
                TaskStatus::Succeeded => {
                    stats.succeeded += 1;
                    if f.cached {
                        stats.cache_hits += 1;
                    }
                }
                TaskStatus::Failed => stats.failed += 1,
                TaskStatus::Canceled => stats.canceled += 1,
                _ => {}
            }
            if matches!(f.status, TaskStatus::Failed | TaskStatus::Canceled) {
                let code = f
                    .error_code
                    .clone()
                    .unwrap_or_else(|| ErrorCode::Interrupted.as_str().to_string());
                *codes.entry(code).or_default() += 1;
            }
            if let Some(ms) = f.run_ms.filter(|ms| *ms >= 0) {
                run_ms.push(ms);
            }
        }
        let mut codes: Vec<(String, u64)> = codes.into_iter().collect();
        codes.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        stats.failures_by_code = codes;
        stats.cache_hit_rate =
            (stats.succeeded > 0).then(|| stats.cache_hits as f64 / stats.succeeded as f64);
        run_ms.sort_unstable();
        if !run_ms.is_empty() {
            stats.run_ms_percentiles = Some([
                percentile(&run_ms, 0.5),
                percentile(&run_ms, 0.9),
                percentile(&run_ms, 0.99),
            ]);
        }
        Ok(stats)
    }
}

/// The empty buckets of the window ending at `now`, oldest first.
fn minute_buckets(now: Timestamp) -> Vec<MinuteCount> {
    let width = STATS_RECENT_WINDOW.as_millis() as i64;
    let count = (STATS_WINDOW.as_millis() as i64) / width;
    let since = now.minus(STATS_WINDOW);
    (0..count)
        .map(|i| MinuteCount {
            start: Timestamp(since.0 + i * width),
            succeeded: 0,
            failed: 0,
            canceled: 0,
        })
        .collect()
}

/// The bucket a completion time falls in (`None` outside the window).
fn minute_of(
    buckets: &mut [MinuteCount],
    since: Timestamp,
    at: Timestamp,
) -> Option<&mut MinuteCount> {
    let offset = at.0.checked_sub(since.0).filter(|o| *o >= 0)?;
    let index = offset / STATS_RECENT_WINDOW.as_millis() as i64;
    // A task finished exactly now belongs to the last minute.
    let last = buckets.len().checked_sub(1)?;
    buckets.get_mut((index as usize).min(last))
}

/// "Now" for refilling a bucket: the store's clock as it read the snapshot.
fn snapshot_now(snapshot: &ScopeSnapshot) -> Timestamp {
    snapshot
        .now
        .unwrap_or_else(|| tollgate_core::Clock::now(&SystemClock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minute_buckets_cover_the_window_and_end_now() {
        let now = Timestamp(10_000_000);
        let mut buckets = minute_buckets(now);
        assert_eq!(buckets.len(), 60);
        let since = now.minus(STATS_WINDOW);
        assert_eq!(buckets[0].start, since);
        assert_eq!(buckets[59].start, Timestamp(now.0 - 60_000));
        for (at, want) in [
            (now.0, Some(59)),
            (now.0 - 60_000, Some(59)),
            (now.0 - 60_001, Some(58)),
            (since.0, Some(0)),
            (since.0 - 1, None),
        ] {
            let got = minute_of(&mut buckets, since, Timestamp(at)).map(|b| b.start);
            assert_eq!(got, want.map(|i: usize| buckets_start(since, i)), "{at}");
        }
    }

    fn buckets_start(since: Timestamp, i: usize) -> Timestamp {
        Timestamp(since.0 + i as i64 * 60_000)
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<i64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.9), 90);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
    }
}

/// docs/conformance.md#cost-usage "Usage is visible": a scope's or the app's spend and tokens in the 24 h
/// window, its limits, and what the cache saved. Amounts are US dollars (summed exactly
/// in nano-dollars by the store, converted for display).
#[derive(Debug, Clone, PartialEq)]
pub struct UsageReport {
    /// The scope, or `None` for the whole app.
    pub scope: Option<ScopeId>,
    /// Start of the oldest hourly bucket counted: the window read is 24 to 25 hours
    /// long (spend leaves it at most an hour late, never early).
    pub since: Timestamp,
    /// The store's "now".
    pub now: Timestamp,
    /// What ended tasks cost.
    pub settled_usd: f64,
    /// Reserved by tasks not yet ended.
    pub reserved_usd: f64,
    /// Model tokens ended tasks used.
    pub settled_tokens: u64,
    /// Model tokens reserved by tasks not yet ended.
    pub reserved_tokens: u64,
    /// Settled spend above its reservation (a provider reported more than the bound).
    pub overrun_usd: f64,
    /// What cache hits saved.
    pub saved_usd: f64,
    /// The USD limit of the window: the default policy's `usd_per_24_hours` for a scope,
    /// the app's `usd_per_24_hours` for the app.
    pub limit_usd: Option<f64>,
    /// The default policy's `tokens_per_minute` (scope reports).
    pub tokens_per_minute: Option<u32>,
    /// The default policy's `token_burst` (scope reports).
    pub token_burst: Option<u32>,
    /// Model tokens in the scope's bucket now (refilled to now; scope reports with a
    /// token rate).
    pub tokens_available: Option<f64>,
    /// The policy the limits are of (scope reports).
    pub policy_name: Option<BudgetName>,
}

impl CallerView {
    /// docs/conformance.md#cost-usage: the spend and tokens of `scope` (or, `None`, of the whole app) in the
    /// 24 h window, with the limits in force and the cache's savings.
    pub async fn usage(&self, scope: Option<&ScopeId>) -> Result<UsageReport, EngineError> {
        self.no_subject(
            "a key bound to a subject may not read spend, which counts every subject's work",
        )?;
        let inner = &self.tollgate().inner;
        let w = inner.store.spend(self.app(), scope).await?;
        let usd = tollgate_core::cost::nano_to_usd;
        let (policy_name, policy) = inner.budgets.resolve(self.app(), None)?;
        let rate = policy.cost.token_rate.filter(|_| scope.is_some());
        let tokens_available = rate.map(|r| {
            let burst = r.token_burst.get();
            w.token_bucket
                .unwrap_or_else(|| BucketState::full(burst, w.now))
                .refilled(burst, r.tokens_per_minute.get(), w.now)
                .units as f64
                / TOKEN_UNITS as f64
        });
        let limit = match scope {
            Some(_) => policy.cost.scope_nano_per_24_hours,
            None => inner.budgets.app_spend_limit(self.app()),
        };
        Ok(UsageReport {
            scope: scope.cloned(),
            since: w.since,
            now: w.now,
            settled_usd: usd(w.settled_nano),
            reserved_usd: usd(w.reserved_nano),
            settled_tokens: w.settled_tokens.max(0) as u64,
            reserved_tokens: w.reserved_tokens.max(0) as u64,
            overrun_usd: usd(w.overrun_nano),
            saved_usd: usd(w.saved_nano),
            limit_usd: limit.map(|l| usd(l.get() as i64)),
            tokens_per_minute: rate.map(|r| r.tokens_per_minute.get()),
            token_burst: rate.map(|r| r.token_burst.get()),
            tokens_available,
            policy_name: scope.map(|_| policy_name),
        })
    }
}
