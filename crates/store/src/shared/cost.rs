//! docs/conformance.md#money-and-tokens between the SQL and core's cost arithmetic, written once for both backends:
//! what a settlement reads of the finished tasks ([`SettleRow`]), what it changes
//! ([`SettlementPlan`], from core's [`settle`]), and the spend buckets' rows.
//!
//! Spend lives in hourly buckets per (app, scope) (`scope_spend`) and per app, striped by
//! scope (`app_spend`); see `tollgate_core::cost`. Admission adds a task's reservation
//! to the bucket of its admission hour; settlement moves it from reserved to settled
//! there, whenever the task ends.

use crate::shared::admission::stored_bucket;
use crate::shared::sql::{Arg, Exec, Statement};
use crate::{SpendWindow, StoreError, StoreResult};
use std::collections::BTreeMap;
use tollgate_core::attempt::{Charged, settle_charged};
use tollgate_core::cost::{
    CostSnapshot, app_spend_stripe, decide_app_spend, decide_cost, settle, spend_bucket,
    window_first_bucket,
};
use tollgate_core::{CostLimits, CostRejection, Reservation, Timestamp, Usage};

/// `INSERT INTO scope_spend (…) ` with its columns, for `concat!`: the key, then the
/// delta's five amounts.
macro_rules! scope_spend_into {
    () => {
        "INSERT INTO scope_spend (app, scope, bucket, reserved_nano, settled_nano, \
         reserved_tokens, settled_tokens, overrun_nano) "
    };
}
pub(crate) use scope_spend_into;

/// docs/conformance.md#cost-settlement settlement: deltas added to scopes' hourly spend
/// buckets, one row per (app, scope, bucket) given, then [`spend_rows_conflict!`] for
/// `scope_spend`. One text for both backends.
const SCOPE_SPEND_INTO: &str = concat!(scope_spend_into!(), "VALUES ");

/// `INSERT INTO app_spend (…) ` with its columns, for `concat!`.
macro_rules! app_spend_into {
    () => {
        "INSERT INTO app_spend (app, bucket, stripe, reserved_nano, settled_nano, \
         reserved_tokens, settled_tokens, overrun_nano) "
    };
}
pub(crate) use app_spend_into;

/// The same deltas added to apps' hourly spend buckets, one row per (app, bucket, stripe).
const APP_SPEND_INTO: &str = concat!(app_spend_into!(), "VALUES ");

/// What a spend bucket row that exists already gets: the delta added (`$table`'s key
/// columns as the conflict target).
macro_rules! spend_rows_conflict {
    ($table:literal, $key:literal) => {
        concat!(
            " ON CONFLICT (",
            $key,
            ") DO UPDATE SET \
             reserved_nano = ",
            $table,
            ".reserved_nano + EXCLUDED.reserved_nano, settled_nano = ",
            $table,
            ".settled_nano + EXCLUDED.settled_nano, reserved_tokens = ",
            $table,
            ".reserved_tokens + EXCLUDED.reserved_tokens, settled_tokens = ",
            $table,
            ".settled_tokens + EXCLUDED.settled_tokens, overrun_nano = ",
            $table,
            ".overrun_nano + EXCLUDED.overrun_nano"
        )
    };
}
pub(crate) use spend_rows_conflict;

/// Rows of one spend upsert statement at most (8 arguments each: within both backends'
/// limits on arguments).
const SPEND_ROWS_PER_STATEMENT: usize = 500;

/// docs/conformance.md#cost-settlement: the statements that add each delta to its
/// scope's spend bucket, rows in the order given (the caller's key order: the lock
/// order, docs/locking.md), [`SPEND_ROWS_PER_STATEMENT`] rows a statement.
pub(crate) fn scope_spend_rows<'a>(
    rows: impl IntoIterator<Item = (&'a ScopeBucket, &'a SpendDelta)>,
) -> Vec<Statement> {
    spend_rows(
        SCOPE_SPEND_INTO,
        spend_rows_conflict!("scope_spend", "app, scope, bucket"),
        scope_keyed(rows),
    )
}

/// docs/conformance.md#cost-settlement: the statements that add each delta to its
/// app's spend bucket of one stripe, as [`scope_spend_rows`].
pub(crate) fn app_spend_rows<'a>(
    rows: impl IntoIterator<Item = (&'a AppBucket, &'a SpendDelta)>,
) -> StoreResult<Vec<Statement>> {
    Ok(spend_rows(
        APP_SPEND_INTO,
        spend_rows_conflict!("app_spend", "app, bucket, stripe"),
        app_keyed(rows)?,
    ))
}

/// docs/conformance.md#cost-settlement on SQLite, which runs several statements in one
/// query (it has no data-modifying CTE): a plan's spend rows appended to `s` as
/// statements of that query — scope rows, then app rows, each side in key order and
/// [`SPEND_ROWS_PER_STATEMENT`] rows a statement, as [`scope_spend_rows`] and
/// [`app_spend_rows`] write them — their placeholders numbered on from `s`'s. Each
/// statement is followed by `;`.
pub(crate) fn push_spend_statements(s: &mut Statement, plan: &SettlementPlan) -> StoreResult<()> {
    let sides = [
        (
            SCOPE_SPEND_INTO,
            spend_rows_conflict!("scope_spend", "app, scope, bucket"),
            scope_keyed(&plan.scope),
        ),
        (
            APP_SPEND_INTO,
            spend_rows_conflict!("app_spend", "app, bucket, stripe"),
            app_keyed(&plan.app)?,
        ),
    ];
    for (into, conflict, rows) in sides {
        for chunk in rows.chunks(SPEND_ROWS_PER_STATEMENT) {
            s.push(into);
            push_spend_values(s, chunk);
            s.push(conflict);
            s.push("; ");
        }
    }
    Ok(())
}

/// docs/conformance.md#cost-settlement on PostgreSQL: a plan's scope rows and app rows
/// added in ONE statement, a round trip less than [`scope_spend_rows`] then
/// [`app_spend_rows`]. The scope upsert is a CTE; the app upsert reads the CTE's row count
/// before its first row, so every scope bucket is locked before any app bucket, each side
/// in key order (the lock order). `None` when a side is empty or longer than one
/// statement's rows: then those two kinds of statements, as on SQLite.
pub(crate) fn spend_rows_one_statement(plan: &SettlementPlan) -> StoreResult<Option<Statement>> {
    let (scopes, apps) = (plan.scope.len(), plan.app.len());
    if scopes == 0 || apps == 0 || scopes.max(apps) > SPEND_ROWS_PER_STATEMENT {
        return Ok(None);
    }
    let mut s = Statement::new("WITH s AS (");
    s.push(SCOPE_SPEND_INTO);
    push_spend_values(&mut s, &scope_keyed(&plan.scope));
    s.push(spend_rows_conflict!("scope_spend", "app, scope, bucket"));
    s.push(" RETURNING 1) ");
    s.push(APP_SPEND_INTO.trim_end_matches("VALUES "));
    s.push("SELECT v.* FROM (VALUES ");
    push_spend_values(&mut s, &app_keyed(&plan.app)?);
    s.push(
        ") AS v (app, bucket, stripe, reserved_nano, settled_nano, reserved_tokens, \
         settled_tokens, overrun_nano) WHERE (SELECT COUNT(*) FROM s) >= 0",
    );
    s.push(spend_rows_conflict!("app_spend", "app, bucket, stripe"));
    Ok(Some(s))
}

/// Scope bucket rows as [`spend_rows`] takes them: the key's arguments and the delta.
fn scope_keyed<'a>(
    rows: impl IntoIterator<Item = (&'a ScopeBucket, &'a SpendDelta)>,
) -> Vec<([Arg; 3], SpendDelta)> {
    rows.into_iter()
        .map(|((app, scope, bucket), d)| {
            ([Arg::from(app), Arg::from(scope), Arg::from(*bucket)], *d)
        })
        .collect()
}

/// App bucket rows as [`spend_rows`] takes them.
fn app_keyed<'a>(
    rows: impl IntoIterator<Item = (&'a AppBucket, &'a SpendDelta)>,
) -> StoreResult<Vec<([Arg; 3], SpendDelta)>> {
    rows.into_iter()
        .map(|((app, bucket, stripe), d)| {
            // The stripe column is an `INT` on PostgreSQL.
            let stripe = i32::try_from(*stripe)
                .map_err(|_| StoreError::Corrupt(format!("spend stripe {stripe}")))?;
            Ok(([Arg::from(app), Arg::from(*bucket), Arg::from(stripe)], *d))
        })
        .collect()
}

/// One multi-row upsert per [`SPEND_ROWS_PER_STATEMENT`] rows: each row its three key
/// arguments, then the delta's five amounts.
fn spend_rows(
    into: &'static str,
    conflict: &'static str,
    rows: Vec<([Arg; 3], SpendDelta)>,
) -> Vec<Statement> {
    rows.chunks(SPEND_ROWS_PER_STATEMENT)
        .map(|chunk| {
            let mut s = Statement::new(into);
            push_spend_values(&mut s, chunk);
            s.push(conflict);
            s
        })
        .collect()
}

/// Appends the `(…), (…)` rows of a spend upsert to `s`, their arguments bound: each row
/// its three key arguments, then the delta's five amounts.
fn push_spend_values(s: &mut Statement, rows: &[([Arg; 3], SpendDelta)]) {
    for (n, (key, d)) in rows.iter().enumerate() {
        let amounts = [
            d.reserved_nano,
            d.settled_nano,
            d.reserved_tokens,
            d.settled_tokens,
            d.overrun_nano,
        ];
        let ps: Vec<String> = key
            .iter()
            .cloned()
            .chain(amounts.into_iter().map(Arg::from))
            .map(|a| s.placeholder(a))
            .collect();
        s.push(if n == 0 { "(" } else { ", (" });
        s.push(&ps.join(", "));
        s.push(")");
    }
}

/// A finished admitted task's reservation and usage, read by the terminal move.
#[derive(sqlx::FromRow, Debug, Clone)]
pub(crate) struct SettleRow {
    pub(crate) id: String,
    pub(crate) app: String,
    pub(crate) scope: String,
    pub(crate) created_at: i64,
    pub(crate) claimed_at: Option<i64>,
    pub(crate) reservation: String,
    pub(crate) usage: Option<String>,
    /// How many attempts the task made (docs/routes.md, "Attempts"; `attempt_charges!`).
    pub(crate) attempts: i64,
    /// What its attempts are charged, summed (an open one at its reservation).
    pub(crate) attempts_nano: i64,
    /// Model tokens its attempts are charged, summed.
    pub(crate) attempts_tokens: i64,
}

/// Changes to one spend bucket (nano-dollars and model tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct SpendDelta {
    pub(crate) reserved_nano: i64,
    pub(crate) settled_nano: i64,
    pub(crate) reserved_tokens: i64,
    pub(crate) settled_tokens: i64,
    pub(crate) overrun_nano: i64,
    pub(crate) saved_nano: i64,
}

impl SpendDelta {
    fn add(&mut self, o: SpendDelta) {
        self.reserved_nano += o.reserved_nano;
        self.settled_nano += o.settled_nano;
        self.reserved_tokens += o.reserved_tokens;
        self.settled_tokens += o.settled_tokens;
        self.overrun_nano += o.overrun_nano;
        self.saved_nano += o.saved_nano;
    }

    /// What admitting a task with `r` adds: its reservation.
    pub(crate) fn reserve(r: &Reservation) -> SpendDelta {
        SpendDelta {
            reserved_nano: r.nano_usd,
            reserved_tokens: tokens(r.tokens),
            ..SpendDelta::default()
        }
    }
}

/// Binds what `sql/spend_add.sql` (PostgreSQL) and `sql/spend_upserts.sql` (SQLite) add
/// to a scope's spend bucket and the app's: `:bucket`, then [`bind_spend_delta`]'s names.
pub(crate) fn bind_spend(
    b: &mut crate::shared::named::Binder,
    scope: &str,
    bucket: i64,
    d: SpendDelta,
) {
    b.group(SPEND_NAMES, |b| {
        b.bind("bucket", bucket);
        bind_spend_delta(b, scope, d);
    });
}

/// The names [`bind_spend`] binds.
pub(crate) const SPEND_NAMES: &[&str] = &[
    "bucket",
    "stripe",
    "reserved_nano",
    "reserved_tokens",
    "saved_nano",
];

/// Binds [`bind_spend`]'s names but the bucket, for a statement that takes its bucket
/// from its own clock: the app's `:stripe` (of `scope`) and the delta's
/// `:reserved_nano`, `:reserved_tokens` and `:saved_nano` (the statement binds `:app` and
/// `:scope` itself).
pub(crate) fn bind_spend_delta(b: &mut crate::shared::named::Binder, scope: &str, d: SpendDelta) {
    b.group(SPEND_DELTA_NAMES, |b| {
        b.bind("stripe", app_spend_stripe(scope) as i32)
            .bind("reserved_nano", d.reserved_nano)
            .bind("reserved_tokens", d.reserved_tokens)
            .bind("saved_nano", d.saved_nano);
    });
}

/// The names [`bind_spend_delta`] binds.
pub(crate) const SPEND_DELTA_NAMES: &[&str] =
    &["stripe", "reserved_nano", "reserved_tokens", "saved_nano"];

fn tokens(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A scope bucket's key: (app, scope, bucket).
pub(crate) type ScopeBucket = (String, String, i64);
/// An app bucket's key: (app, bucket, stripe).
pub(crate) type AppBucket = (String, i64, i64);

/// Everything one terminal move's settlement writes, keyed in sorted order (the lock
/// order: scope buckets, then app buckets).
#[derive(Debug, Clone, Default)]
pub(crate) struct SettlementPlan {
    pub(crate) scope: BTreeMap<ScopeBucket, SpendDelta>,
    pub(crate) app: BTreeMap<AppBucket, SpendDelta>,
    /// Unused reserved tokens given back to each scope's token bucket.
    pub(crate) refunds: BTreeMap<(String, String), u64>,
    /// Per task: (id, charged nano-dollars, charged tokens).
    pub(crate) charged: Vec<(String, i64, i64)>,
}

impl SettlementPlan {
    /// Adds `delta` to the (app, scope)'s spend bucket `bucket` and to the app's bucket of
    /// the scope's stripe.
    pub(crate) fn add_spend(&mut self, app: &str, scope: &str, bucket: i64, delta: SpendDelta) {
        self.scope
            .entry((app.to_owned(), scope.to_owned(), bucket))
            .or_default()
            .add(delta);
        self.app
            .entry((app.to_owned(), bucket, app_spend_stripe(scope)))
            .or_default()
            .add(delta);
    }
}

/// A task's stored reservation.
pub(crate) fn encode_reservation(r: &Reservation) -> StoreResult<String> {
    serde_json::to_string(r)
        .map_err(|e| StoreError::Database(format!("cannot encode reservation: {e}")))
}

/// A reservation as the task row keeps it, read.
pub(crate) fn decode_reservation(id: &str, text: &str) -> StoreResult<Reservation> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("reservation of {id}: {e}")))
}

/// What reserving one more attempt of a running task reads (docs/budgets.md, "The
/// reservation"): the task, and its scope's token bucket and spend window.
#[derive(sqlx::FromRow, Debug, Clone)]
pub(crate) struct AttemptRow {
    pub(crate) id: String,
    pub(crate) app: String,
    pub(crate) scope: String,
    pub(crate) created_at: i64,
    pub(crate) reservation: String,
    pub(crate) token_units: Option<i64>,
    pub(crate) token_at: Option<i64>,
    pub(crate) scope_window_nano: i64,
}

/// What reserving one more attempt writes, once every check passed.
#[derive(Debug, Clone)]
pub(crate) struct AttemptPlan {
    /// The task's reservation after it (stored on the task, settled at its end).
    pub(crate) stored: Reservation,
    /// `stored`, encoded.
    pub(crate) encoded: String,
    /// The attempt's reservation, added to the spend buckets of the task's admission hour.
    pub(crate) delta: SpendDelta,
    pub(crate) bucket: i64,
    pub(crate) stripe: i64,
    /// The scope's token bucket after taking the attempt's tokens, with its capacity in
    /// units (`None`: no token rate).
    pub(crate) token: Option<(tollgate_core::BucketState, i64)>,
    /// The limits the task was admitted under (the app's is checked by the caller, under
    /// the app's lock, with [`AttemptPlan::app_check`]).
    pub(crate) limits: CostLimits,
    pub(crate) attempt: Reservation,
}

impl AttemptRow {
    /// The scope's checks of an attempt's reservation, as admission's (core's
    /// [`decide_cost`]): the scope's spend, then its token bucket.
    pub(crate) fn plan(
        &self,
        attempt: &Reservation,
        now: Timestamp,
    ) -> StoreResult<Result<AttemptPlan, CostRejection>> {
        let reservation = decode_reservation(&self.id, &self.reservation)?;
        let limits = reservation.limits.unwrap_or(CostLimits::NONE);
        let attempt = Reservation {
            prices: reservation.prices,
            ..*attempt
        };
        let snapshot = CostSnapshot {
            scope_window_nano: self.scope_window_nano,
            token_bucket: stored_bucket(self.token_units, self.token_at),
            app_window_nano: 0,
        };
        let token = match decide_cost(&limits, &attempt, &snapshot, now) {
            Ok(token) => token,
            Err(rejection) => return Ok(Err(rejection)),
        };
        let capacity = limits.token_rate.map_or(0, |r| {
            i64::from(r.token_burst.get()) * tollgate_core::admission::TOKEN_UNITS
        });
        let stored = Reservation {
            from_token_bucket: reservation.from_token_bucket || token.is_some(),
            ..reservation.plus(&attempt)
        };
        let encoded = encode_reservation(&stored)?;
        Ok(Ok(AttemptPlan {
            stored,
            encoded,
            delta: SpendDelta::reserve(&attempt),
            bucket: spend_bucket(Timestamp(self.created_at)),
            stripe: app_spend_stripe(&self.scope),
            token: token.map(|b| (b, capacity)),
            limits,
            attempt,
        }))
    }
}

impl AttemptPlan {
    /// The last check, under the app's lock: the app's spend (`window`: settled +
    /// reserved nano-dollars of the app's window).
    pub(crate) fn app_check(&self, window: i64) -> Result<(), CostRejection> {
        decide_app_spend(&self.limits, &self.attempt, window)
    }
}

/// An app's spend in its window: settled + reserved nano-dollars of its buckets from `$2`
/// (`$1` app).
const APP_WINDOW_NANO: &str = "SELECT CAST(COALESCE(SUM(reserved_nano + settled_nano), 0) AS BIGINT) \
     AS window_nano FROM app_spend WHERE app = $1 AND bucket >= $2";

/// A scope's token bucket after an attempt took its tokens (`$1` units, `$2` at, `$3`
/// capacity in units; `$4` app, `$5` scope).
const ATTEMPT_TOKEN_UPDATE: &str = "UPDATE scope_state SET token_units = $1, token_at = $2, \
     token_capacity = $3 WHERE app = $4 AND scope = $5";

/// The [`APP_WINDOW_NANO`] sum.
#[derive(sqlx::FromRow)]
struct WindowNano {
    window_nano: i64,
}

/// The end of `reserve_attempt`, written once for both backends: after the backend's locks
/// (docs/locking.md: the scope's, the app's spend lock when the app is limited, then the
/// task row) and its read of the task (`row`), the scope's checks ([`AttemptRow::plan`]),
/// the app's spend check, then the writes: the task's reservation, the scope's token
/// bucket, the spend buckets of the task's admission hour (scope, then app). Returns the
/// task's reservation after it; the caller commits.
pub(crate) async fn reserve_checked<E: Exec + ?Sized>(
    tx: &mut E,
    row: &AttemptRow,
    attempt: &Reservation,
    now: Timestamp,
) -> StoreResult<Reservation> {
    let plan = row.plan(attempt, now)?.map_err(StoreError::Cost)?;
    if plan.limits.app_nano_per_24_hours.is_some() {
        let window: WindowNano = tx
            .one(
                Statement::new(APP_WINDOW_NANO)
                    .bind(&row.app)
                    .bind(window_first_bucket(now)),
            )
            .await?;
        plan.app_check(window.window_nano)
            .map_err(StoreError::Cost)?;
    }
    tx.run(
        Statement::new("UPDATE tasks SET reservation = $1 WHERE id = $2")
            .bind(&plan.encoded)
            .bind(&row.id),
    )
    .await?;
    // docs/routes.md, "Attempts": the open attempt holds what it reserved.
    tx.run(
        Statement::new(
            "UPDATE task_attempts SET reserved_nano = reserved_nano + $1, \
             reserved_tokens = reserved_tokens + $2 WHERE task_id = $3 AND ended_at IS NULL",
        )
        .bind(plan.delta.reserved_nano)
        .bind(plan.delta.reserved_tokens)
        .bind(&row.id),
    )
    .await?;
    if let Some((bucket, capacity)) = plan.token {
        tx.run(
            Statement::new(ATTEMPT_TOKEN_UPDATE)
                .bind(bucket.units)
                .bind(bucket.at.0)
                .bind(capacity)
                .bind(&row.app)
                .bind(&row.scope),
        )
        .await?;
    }
    let d = plan.delta;
    let scope_key = (row.app.clone(), row.scope.clone(), plan.bucket);
    let app_key = (row.app.clone(), plan.bucket, plan.stripe);
    for s in scope_spend_rows([(&scope_key, &d)])
        .into_iter()
        .chain(app_spend_rows([(&app_key, &d)])?)
    {
        tx.run(s).await?;
    }
    Ok(plan.stored)
}

/// docs/conformance.md#cost-settlement "Settlement" for the rows of one terminal move: each task's reservation
/// leaves the bucket of its admission hour and what it cost ([`settle`]) is added to the
/// same bucket. Usage above the reservation is recorded as overrun and logged.
pub(crate) fn plan_settlement(rows: &[SettleRow]) -> StoreResult<SettlementPlan> {
    let mut plan = SettlementPlan::default();
    for row in rows {
        let reservation = decode_reservation(&row.id, &row.reservation)?;
        let usage: Option<Usage> = row
            .usage
            .as_deref()
            .map(serde_json::from_str)
            .transpose()
            .map_err(|e| StoreError::Corrupt(format!("usage of {}: {e}", row.id)))?;
        // docs/budgets.md, "Settlement": absurd usage is clamped (sums never overflow),
        // and the excess over the reservation is recorded as overrun below.
        let usage = usage.map(|u| {
            let (clamped, was) = u.clamped();
            if was {
                tracing::warn!(
                    task = %row.id, app = %row.app, scope = %row.scope,
                    input_tokens = u.input_tokens, output_tokens = u.output_tokens,
                    "absurd usage clamped to {} tokens", tollgate_core::MAX_REPORTED_TOKENS
                );
            }
            clamped
        });
        // A task that made attempts is charged their sum; one that made none (a cache
        // hit, ended before its first call) by its usage, as before attempts existed.
        let charge = if row.attempts > 0 {
            settle_charged(
                &reservation,
                Charged {
                    nano_usd: row.attempts_nano,
                    tokens: u64::try_from(row.attempts_tokens).unwrap_or(0),
                },
            )
        } else {
            settle(&reservation, usage.as_ref(), row.claimed_at.is_some())
        };
        if charge.overrun_nano > 0 || charge.overrun_tokens > 0 {
            tracing::warn!(
                task = %row.id, app = %row.app, scope = %row.scope,
                overrun_nano_usd = charge.overrun_nano, overrun_tokens = charge.overrun_tokens,
                "the provider reported more than the task's reservation (docs/conformance.md#cost-reservation overrun)"
            );
        }
        let delta = SpendDelta {
            reserved_nano: -reservation.nano_usd,
            settled_nano: charge.nano_usd,
            reserved_tokens: -tokens(reservation.tokens),
            settled_tokens: tokens(charge.tokens),
            overrun_nano: charge.overrun_nano,
            saved_nano: 0,
        };
        let bucket = spend_bucket(Timestamp(row.created_at));
        plan.add_spend(&row.app, &row.scope, bucket, delta);
        if charge.refund_tokens > 0 {
            *plan
                .refunds
                .entry((row.app.clone(), row.scope.clone()))
                .or_default() += charge.refund_tokens;
        }
        plan.charged
            .push((row.id.clone(), charge.nano_usd, tokens(charge.tokens)));
    }
    Ok(plan)
}

/// The select list of [`SpendSums`] over spend bucket rows, for `concat!`.
macro_rules! spend_sums {
    () => {
        "SELECT CAST(COALESCE(SUM(reserved_nano), 0) AS BIGINT) AS reserved_nano, \
         CAST(COALESCE(SUM(settled_nano), 0) AS BIGINT) AS settled_nano, \
         CAST(COALESCE(SUM(reserved_tokens), 0) AS BIGINT) AS reserved_tokens, \
         CAST(COALESCE(SUM(settled_tokens), 0) AS BIGINT) AS settled_tokens, \
         CAST(COALESCE(SUM(overrun_nano), 0) AS BIGINT) AS overrun_nano, \
         CAST(COALESCE(SUM(saved_nano), 0) AS BIGINT) AS saved_nano"
    };
}
pub(crate) use spend_sums;

/// The sums of a window's spend buckets, as one backend reads them.
#[derive(sqlx::FromRow, Debug, Clone, Copy, Default)]
pub(crate) struct SpendSums {
    pub(crate) reserved_nano: i64,
    pub(crate) settled_nano: i64,
    pub(crate) reserved_tokens: i64,
    pub(crate) settled_tokens: i64,
    pub(crate) overrun_nano: i64,
    pub(crate) saved_nano: i64,
}

/// A scope's token bucket as stored.
#[derive(sqlx::FromRow, Debug, Clone, Copy, Default)]
pub(crate) struct TokenBucketRow {
    pub(crate) token_units: Option<i64>,
    pub(crate) token_at: Option<i64>,
    pub(crate) token_capacity: Option<i64>,
}

impl SpendSums {
    /// The usage report of a window starting at bucket `first` (docs/conformance.md#cost-limits "Usage is
    /// visible").
    pub(crate) fn into_window(
        self,
        first: i64,
        now: Timestamp,
        bucket: Option<TokenBucketRow>,
    ) -> SpendWindow {
        let token_bucket = bucket.and_then(|b| stored_bucket(b.token_units, b.token_at));
        SpendWindow {
            since: Timestamp(first * tollgate_core::cost::SPEND_BUCKET_MS),
            now,
            reserved_nano: self.reserved_nano,
            settled_nano: self.settled_nano,
            reserved_tokens: self.reserved_tokens,
            settled_tokens: self.settled_tokens,
            overrun_nano: self.overrun_nano,
            saved_nano: self.saved_nano,
            token_bucket,
            token_capacity_units: bucket.and_then(|b| b.token_capacity),
        }
    }
}
