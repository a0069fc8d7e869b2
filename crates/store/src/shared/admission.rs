//! docs/conformance.md#admission between the SQL and core's [`decide`]: the facts an admission reads (each
//! backend reads them its own way, into [`AdmissionFacts`]), the decision, and what the
//! admission then writes to its scope's row ([`ScopeUpdate`]). A later admission rule
//! (cost reservations) adds its facts here and its arithmetic in core.

use crate::shared::cost::SpendDelta;
use crate::shared::named::Binder;
use crate::shared::sql::{Exec, Statement};
use crate::{StoreError, StoreResult};
use tollgate_core::cost::{
    CostSnapshot, decide_app_spend, decide_cost, spend_retry_after, window_first_bucket,
};
use tollgate_core::{
    AdmissionRejection, AdmissionSnapshot, AppId, BucketState, Budget, CostRejection, NewTask,
    Reservation, ScopeId, ShareUse, Subject, TaskId, Timestamp, Usage, Weight, decide, join_credit,
    stride,
};

/// What an admission reads under its scope's lock.
#[derive(sqlx::FromRow, Debug, Clone, Default)]
pub(crate) struct AdmissionFacts {
    /// The scope's expired sightings pruned on the way.
    pub(crate) pruned: i64,
    /// The scope's bucket (`None` for a scope never admitted to).
    pub(crate) bucket_units: Option<i64>,
    pub(crate) bucket_at: Option<i64>,
    /// The scope's distinct-source count before the prune.
    pub(crate) sources_in_window: Option<i64>,
    /// The scope's active admitted tasks.
    pub(crate) active: Option<i64>,
    /// The source was admitted within the window.
    pub(crate) seen: bool,
    /// Distinct logical keys of the source within the window.
    pub(crate) steps: i64,
    /// This logical key is among them.
    pub(crate) counted: bool,
    /// The service's active admitted tasks.
    pub(crate) global_active: i64,
    /// docs/conformance.md#cost-limits: the scope's model-token bucket (`None`: never used).
    pub(crate) token_units: Option<i64>,
    pub(crate) token_at: Option<i64>,
    /// docs/conformance.md#cost-settlement: the scope's settled + reserved nano-dollars in the window's buckets.
    pub(crate) scope_window_nano: i64,
    /// The app's active admitted tasks (`app_slots`; docs/budgets.md, "Each app's share
    /// of the global capacity").
    pub(crate) app_active: i64,
    /// The global slots all apps hold beyond their shares.
    pub(crate) borrowed: i64,
}

/// Why admission refused a task: docs/conformance.md#admission's checks, then docs/conformance.md#money-and-tokens's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A docs/conformance.md#admission limit.
    Admission(AdmissionRejection),
    /// A docs/conformance.md#cost-limits limit.
    Cost(CostRejection),
}

impl From<Refusal> for StoreError {
    fn from(r: Refusal) -> StoreError {
        match r {
            Refusal::Admission(a) => StoreError::Admission(a),
            Refusal::Cost(c) => StoreError::Cost(c),
        }
    }
}

/// What an admission writes to its scope's row: the bucket after taking a token and the
/// change in distinct sources (a new source, minus the expired sightings pruned).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ScopeUpdate {
    pub(crate) bucket: BucketState,
    pub(crate) sources_delta: i64,
    /// docs/conformance.md#cost-reservation: the model-token bucket after taking the reservation, with its capacity
    /// in units (`None`: the policy has no token rate; the stored bucket is kept).
    pub(crate) token_bucket: Option<(BucketState, i64)>,
}

impl AdmissionFacts {
    /// Asks core's [`decide`] (docs/conformance.md#admission), then [`decide_cost`] (docs/conformance.md#money-and-tokens, the scope's part).
    pub(crate) fn decide(
        &self,
        budget: &Budget,
        reservation: &Reservation,
        now: Timestamp,
    ) -> Result<ScopeUpdate, Refusal> {
        let snapshot = AdmissionSnapshot {
            source_steps: self.steps.max(0) as u64,
            step_already_counted: self.counted,
            sources_in_window: self
                .sources_in_window
                .unwrap_or(0)
                .saturating_sub(self.pruned)
                .max(0) as u64,
            source_already_seen: self.seen,
            scope_active: self.active.unwrap_or(0).max(0) as u64,
            global_active: self.global_active.max(0) as u64,
            share: ShareUse {
                app_active: self.app_active.max(0) as u64,
                borrowed: self.borrowed.max(0) as u64,
            },
        };
        let bucket = stored_bucket(self.bucket_units, self.bucket_at);
        let bucket = decide(budget, &snapshot, bucket, now).map_err(Refusal::Admission)?;
        let cost = UnsourcedFacts {
            token_units: self.token_units,
            token_at: self.token_at,
            scope_window_nano: self.scope_window_nano,
        };
        let token_bucket = cost.decide(budget, reservation, now)?;
        // Relative updates: whoever deletes an expired sighting subtracts it, exactly once.
        Ok(ScopeUpdate {
            bucket,
            sources_delta: i64::from(!self.seen) - self.pruned,
            token_bucket,
        })
    }
}

/// A bucket as stored (`None`: no row, or never used).
pub(crate) fn stored_bucket(units: Option<i64>, at: Option<i64>) -> Option<BucketState> {
    Some(BucketState {
        units: units?,
        at: Timestamp(at?),
    })
}

/// The reservation an admitted task (or one without a source) stores: `reservation`
/// with the limits it was admitted under (docs/budgets.md, "The reservation": each
/// re-ask is checked against these) and whether it took from the token bucket.
pub(crate) fn stored_reservation(
    reservation: &Reservation,
    budget: &Budget,
    from_token_bucket: bool,
) -> Reservation {
    Reservation {
        from_token_bucket,
        limits: Some(budget.cost),
        ..*reservation
    }
}

/// A reservation as a task stores it ([`stored_reservation`], encoded) and what it adds
/// to the spend windows.
pub(crate) fn reserved(
    reservation: &Reservation,
    budget: &Budget,
    from_token_bucket: bool,
) -> StoreResult<(String, SpendDelta)> {
    let stored = stored_reservation(reservation, budget, from_token_bucket);
    Ok((
        crate::shared::cost::encode_reservation(&stored)?,
        SpendDelta::reserve(&stored),
    ))
}

/// A task's model columns: its model configuration's hash (a configuration that cannot
/// be hashed is the creation's own refusal) and its model reference as stored (JSON).
pub(crate) fn model_columns(new: &NewTask) -> StoreResult<(tollgate_core::ConfigHash, String)> {
    let config_hash = new.model_ref.config_hash()?;
    let model_ref = serde_json::to_string(&new.model_ref)
        .map_err(|e| StoreError::Database(format!("cannot encode model ref: {e}")))?;
    Ok((config_hash, model_ref))
}

/// Binds a model-token bucket to store with its capacity in units (`:token_units`,
/// `:token_at`, `:token_capacity`; NULLs: none).
pub(crate) fn bind_token(b: &mut Binder, token: Option<(BucketState, i64)>) {
    b.group(TOKEN_NAMES, |b| {
        b.bind("token_units", token.map(|(b, _)| b.units))
            .bind("token_at", token.map(|(b, _)| b.at.0))
            .bind("token_capacity", token.map(|(_, capacity)| capacity));
    });
}

/// The names [`bind_token`] binds.
pub(crate) const TOKEN_NAMES: &[&str] = &["token_units", "token_at", "token_capacity"];

/// The capacity of a policy's model-token bucket in units (0 without a token rate).
fn token_capacity_units(budget: &Budget) -> i64 {
    budget.cost.token_rate.map_or(0, |r| {
        i64::from(r.token_burst.get()) * tollgate_core::admission::TOKEN_UNITS
    })
}

/// What the cost checks of a task without a source read under its scope's lock
/// (docs/budgets.md, "Tasks without a source").
#[derive(sqlx::FromRow, Debug, Clone, Copy, Default)]
pub(crate) struct UnsourcedFacts {
    /// The scope's model-token bucket (`None`: never used).
    pub(crate) token_units: Option<i64>,
    pub(crate) token_at: Option<i64>,
    /// The scope's settled + reserved nano-dollars in the window's buckets.
    pub(crate) scope_window_nano: i64,
}

impl UnsourcedFacts {
    /// Core's [`decide_cost`] (docs/conformance.md#cost-limits's scope part; docs/conformance.md#admission's limits are about sources
    /// and task counts and do not apply). On admission returns the token bucket to store
    /// with its capacity in units (`None`: the policy has no token rate).
    pub(crate) fn decide(
        &self,
        budget: &Budget,
        reservation: &Reservation,
        now: Timestamp,
    ) -> Result<Option<(BucketState, i64)>, Refusal> {
        let cost = CostSnapshot {
            scope_window_nano: self.scope_window_nano,
            token_bucket: stored_bucket(self.token_units, self.token_at),
            app_window_nano: 0,
        };
        let token_bucket =
            decide_cost(&budget.cost, reservation, &cost, now).map_err(Refusal::Cost)?;
        Ok(token_bucket.map(|b| (b, token_capacity_units(budget))))
    }

    /// The facts as the next creation of the scope reads them once this one's
    /// reservation is written ([`UnsourcedFacts::decide`]'s token bucket stored, `reserve`
    /// added to the scope's spend bucket of its creation time, which is in the window):
    /// what a group of creations in one transaction decides the next one on (PostgreSQL,
    /// docs/locking.md, "Creations made together").
    pub(crate) fn after(&mut self, token: Option<(BucketState, i64)>, reserve: &SpendDelta) {
        if let Some((bucket, _)) = token {
            self.token_units = Some(bucket.units);
            self.token_at = Some(bucket.at.0);
        }
        self.scope_window_nano = self.scope_window_nano.saturating_add(reserve.reserved_nano);
    }
}

/// A window's spend buckets `(bucket, settled + reserved nano-dollars)` of a scope
/// (`$1` app, `$2` scope, `$3` the window's first bucket). One text for both backends.
pub(crate) const SCOPE_BUCKETS: &str = "SELECT bucket, CAST(reserved_nano + settled_nano AS BIGINT) \
     FROM scope_spend WHERE app = $1 AND scope = $2 AND bucket >= $3";

/// The same of the app, its stripes summed (`$1` app, `$2` the window's first bucket).
pub(crate) const APP_BUCKETS: &str = "SELECT bucket, CAST(SUM(reserved_nano + settled_nano) AS BIGINT) \
     FROM app_spend WHERE app = $1 AND bucket >= $2 GROUP BY bucket";

/// What the end of an admission reads, on a backend's connection, written once but for
/// the way the backend serializes an app's spend.
#[async_trait::async_trait]
pub(crate) trait SpendReads: Exec {
    /// Takes what serializes the app's spend checks (PostgreSQL: the app's advisory lock,
    /// after the scope's; SQLite: nothing, the write lock does), in its own statement, so
    /// the reads after it see every admission of the app that held it before.
    async fn lock_app(&mut self, app: &AppId) -> StoreResult<()>;

    /// A window's buckets `(bucket, settled + reserved)` of a scope or (`None`) the app
    /// ([`SCOPE_BUCKETS`], [`APP_BUCKETS`]).
    async fn spend_buckets(
        &mut self,
        app: &AppId,
        scope: Option<&ScopeId>,
        first: i64,
    ) -> StoreResult<Vec<(i64, i64)>> {
        let select = match scope {
            Some(scope) => Statement::new(SCOPE_BUCKETS)
                .bind(app.as_str())
                .bind(scope.as_str()),
            None => Statement::new(APP_BUCKETS).bind(app.as_str()),
        };
        self.all(select.bind(first)).await
    }
}

/// docs/conformance.md#money-and-tokens after the scope's decision (`decided`: [`AdmissionFacts::decide`] or
/// [`UnsourcedFacts::decide`]), written once for admissions and tasks without a source
/// on both backends: a scope-spend refusal is reported with when to retry (from the
/// scope's buckets); a task the scope admits is checked last against the app's spend,
/// for an app with a limit, under the app's lock, a refusal with when to retry (from the
/// app's buckets).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn spend_checked<T: Send, R: SpendReads + ?Sized>(
    reads: &mut R,
    app: &AppId,
    scope: &ScopeId,
    budget: &Budget,
    reservation: &Reservation,
    now: Timestamp,
    decided: Result<T, Refusal>,
) -> StoreResult<Result<T, Refusal>> {
    let first = window_first_bucket(now);
    let cost = &budget.cost;
    let retry = |buckets: &[(i64, i64)], limit: Option<std::num::NonZeroU64>| {
        limit.and_then(|l| spend_retry_after(buckets, reservation.nano_usd, l, now))
    };
    let value = match decided {
        Ok(value) => value,
        Err(Refusal::Cost(c @ CostRejection::ScopeSpend { .. })) => {
            let buckets = reads.spend_buckets(app, Some(scope), first).await?;
            let wait = retry(&buckets, cost.scope_nano_per_24_hours);
            return Ok(Err(Refusal::Cost(c.with_retry_after(wait))));
        }
        Err(refusal) => return Ok(Err(refusal)),
    };
    if cost.app_nano_per_24_hours.is_none() {
        return Ok(Ok(value));
    }
    reads.lock_app(app).await?;
    let buckets = reads.spend_buckets(app, None, first).await?;
    let window = buckets
        .iter()
        .fold(0i64, |sum, (_, nano)| sum.saturating_add(*nano));
    if let Err(c) = decide_app_spend(cost, reservation, window) {
        let wait = retry(&buckets, cost.app_nano_per_24_hours);
        return Ok(Err(Refusal::Cost(c.with_retry_after(wait))));
    }
    Ok(Ok(value))
}

/// docs/conformance.md#create-insert, both backends: the task insert (`sql/task_insert.sql`), with its
/// `{created_at}`, `{dispatch_key}` and `{task_columns}` parts.
pub(crate) const TASK_INSERT: &str = include_str!("sql/task_insert.sql");

/// Everything a task row is inserted with (`sql/task_insert.sql` of each backend),
/// resolved from [`NewTask`] and the owner.
pub(crate) struct InsertRow<'a> {
    pub(crate) id: TaskId,
    pub(crate) new: &'a NewTask,
    pub(crate) run_id: Option<String>,
    pub(crate) scope: ScopeId,
    pub(crate) subject: Option<Subject>,
    pub(crate) config_hash: String,
    pub(crate) model_ref: String,
    pub(crate) cache_key: Option<String>,
    pub(crate) admitted: bool,
    /// A cache hit: the task copied and its output (the task is then succeeded).
    pub(crate) cached_from: Option<String>,
    pub(crate) cached_output: Option<String>,
    pub(crate) now: Timestamp,
    /// docs/conformance.md#cost-reservation: the reservation as stored (admitted tasks only).
    pub(crate) reservation: Option<String>,
    /// docs/conformance.md#cost-cache-hits: what a cache hit saved (the copied task's charge), nano-dollars.
    pub(crate) saved_nano: i64,
}

impl<'a> InsertRow<'a> {
    /// A queued task's row, not (yet) admitted, cached or reserved: `owner` its run id,
    /// scope and subject, `model` its configuration hash and encoded model reference.
    pub(crate) fn new(
        id: TaskId,
        new: &'a NewTask,
        owner: (Option<String>, ScopeId, Option<Subject>),
        model: (String, String),
        now: Timestamp,
    ) -> InsertRow<'a> {
        let (run_id, scope, subject) = owner;
        let (config_hash, model_ref) = model;
        InsertRow {
            id,
            new,
            run_id,
            scope,
            subject,
            config_hash,
            model_ref,
            cache_key: None,
            admitted: false,
            cached_from: None,
            cached_output: None,
            now,
            reservation: None,
            saved_nano: 0,
        }
    }

    /// Records the reservation this row's task stores ([`stored_reservation`]: with the
    /// limits it is checked under, and whether it took from the token bucket) and returns
    /// what it adds to the spend windows.
    pub(crate) fn reserve(
        &mut self,
        reservation: &Reservation,
        budget: &Budget,
        from_token_bucket: bool,
    ) -> StoreResult<SpendDelta> {
        let (stored, delta) = reserved(reservation, budget, from_token_bucket)?;
        self.reservation = Some(stored);
        Ok(delta)
    }

    /// Binds the task row's values, both backends; `clock`: the statement reads the
    /// creation time itself (no `:now`), and `:dispatch_key` is the key's offset from it.
    pub(crate) fn bind(&self, b: &mut Binder, clock: bool) {
        let new = self.new;
        let cached = self.cached_from.is_some();
        // docs/engine.md, "Tasks claimed at creation": a cache hit is never claimed.
        let claimed = new
            .claim_by
            .as_ref()
            .filter(|_| !cached)
            .map(|w| w.as_str());
        let scoped = new.scope.as_ref();
        let subject = self.subject.as_ref();
        b.group(ROW_NAMES, |b| {
            b.bind("id", self.id.to_string())
                .bind("app", new.owner.app().as_str())
                .bind("effect_key", new.effect_key.as_str())
                .bind("kind", new.request.kind().as_str())
                .bind("step", new.step.as_str())
                .bind("run_id", self.run_id.as_deref())
                .bind("scope", self.scope.as_str())
                .bind("subject_type", subject.map(|s| s.kind.as_str()))
                .bind("subject_id", subject.map(|s| s.id.as_str()))
                .bind("source_id", scoped.map(|s| s.source_id.as_str()))
                .bind(
                    "source_revision",
                    scoped.map(|s| s.source_revision.as_str()),
                )
                .bind("recompute", scoped.is_some_and(|s| s.recompute))
                .bind("admitted", self.admitted)
                .bind("model_id", new.model.as_str())
                .bind("model_ref", self.model_ref.as_str())
                .bind("model_config_hash", self.config_hash.as_str())
                .bind("request", new.request.canonical())
                .bind("input_hash", new.request.input_hash())
                .bind("cache_key", self.cache_key.as_deref())
                .bind(
                    "status",
                    if cached {
                        "succeeded"
                    } else if claimed.is_some() {
                        "running"
                    } else {
                        "queued"
                    },
                )
                .bind("worker", claimed)
                .bind("cached_from", self.cached_from.as_deref())
                .bind("output", self.cached_output.as_deref())
                .bind("usage", cached.then(cached_usage))
                .bind("completed_at", cached.then_some(self.now.0))
                .bind("reservation", self.reservation.as_deref())
                .bind("priority", i64::from(new.dispatch.priority))
                .bind("dispatch_key", new.dispatch.key(self.now))
                .bind("trace_parent", new.trace_parent.map(|t| t.to_string()))
                .bind("max_attempts", i64::from(new.max_attempts.get()))
                .bind("released", new.released);
        });
        if !clock {
            b.group(NOW_NAMES, |b| {
                b.bind("now", self.now.0);
            });
        }
    }
}

/// The names [`InsertRow::bind`] binds of the task row (every statement that inserts one).
pub(crate) const ROW_NAMES: &[&str] = &[
    "id",
    "app",
    "effect_key",
    "kind",
    "step",
    "run_id",
    "scope",
    "subject_type",
    "subject_id",
    "source_id",
    "source_revision",
    "recompute",
    "admitted",
    "model_id",
    "model_ref",
    "model_config_hash",
    "request",
    "input_hash",
    "cache_key",
    "status",
    "worker",
    "cached_from",
    "output",
    "usage",
    "completed_at",
    "reservation",
    "priority",
    "dispatch_key",
    "trace_parent",
    "max_attempts",
    "released",
];

/// The name [`InsertRow::bind`] binds besides [`ROW_NAMES`] unless the statement reads its
/// clock: the creation time.
pub(crate) const NOW_NAMES: &[&str] = &["now"];

/// Binds a queue join's `join_params` for a task of `weight` (`shared/sql/queue_join.sql`):
/// `:weight`, `:credit` (core's join credit) and `:stride`.
pub(crate) fn bind_join(b: &mut Binder, weight: Weight) {
    b.group(JOIN_NAMES, |b| {
        b.bind("weight", i64::from(weight))
            .bind("credit", join_credit(weight))
            .bind("stride", stride(weight));
    });
}

/// The names [`bind_join`] binds.
pub(crate) const JOIN_NAMES: &[&str] = &["weight", "credit", "stride"];

/// The usage stored with a cache hit (no tokens were spent), in one form for both
/// backends.
pub(crate) fn cached_usage() -> String {
    serde_json::to_string(&Usage::default()).unwrap_or_else(|_| "{}".into())
}
