//! What a creation reads before it writes: its run owner, then in one round trip the
//! scope's advisory lock, whether its effect key is taken, the newest cache hit and the
//! admission facts.

use super::super::{PostgresStore, Tx, now_sql};
use crate::shared::admission::{AdmissionFacts, UnsourcedFacts};
use crate::shared::rows::stored_subject;
use crate::{StoreError, StoreResult};
use sqlx::FromRow;
use sqlx::postgres::PgRow;
use tollgate_core::admission::ADMISSION_WINDOW;
use tollgate_core::canonical::sha256_hex;
use tollgate_core::cost::{SPEND_BUCKET_MS, SPEND_WINDOW_MS, window_first_bucket};
use tollgate_core::{AppId, NewTask, RunId, RunState, ScopeId, SourceId, Subject, Timestamp};

/// The advisory lock key of an (app, scope): the first 8 bytes of SHA-256 of both, with a
/// separator no identifier may contain.
pub(in crate::postgres) fn scope_lock_key(app: &AppId, scope: &ScopeId) -> i64 {
    let hex = sha256_hex(format!("tollgate-scope\u{1f}{app}\u{1f}{scope}").as_bytes());
    u64::from_str_radix(&hex[..16], 16).unwrap_or(0) as i64
}

/// Takes the (app, scope) advisory lock for this transaction.
pub(in crate::postgres) async fn lock_scope(
    tx: &mut Tx,
    app: &AppId,
    scope: &ScopeId,
    exclusive: bool,
) -> StoreResult<()> {
    let sql = if exclusive {
        "SELECT pg_advisory_xact_lock($1)"
    } else {
        "SELECT pg_advisory_xact_lock_shared($1)"
    };
    sqlx::query(sql)
        .bind(scope_lock_key(app, scope))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// What a creation reads once its owner is settled: whether its effect key is taken,
/// the newest cache hit, and "now".
#[derive(sqlx::FromRow)]
pub(super) struct Probe {
    pub(super) taken: bool,
    pub(super) hit_id: Option<String>,
    pub(super) hit_output: Option<String>,
    /// docs/conformance.md#money-and-tokens: what the hit's task was charged (what the hit saves).
    pub(super) hit_charged_nano: Option<i64>,
    pub(super) now: i64,
    /// The key was found taken before the lock (`ReadsLock::replay_first`): nothing else
    /// was read and no lock taken.
    pub(super) early: bool,
    /// Whether [`Reads::facts`] were read (see [`reads`]).
    facts_read: bool,
    /// The oldest spend bucket the facts summed (checked against core's).
    first_bucket: Option<i64>,
}

/// A creation's reads: the [`Probe`], and the facts asked for ([`Facts`]) when the key
/// was not taken and no cache hit was found, read after the scope's lock was granted.
pub(super) struct Reads {
    pub(super) probe: Probe,
    /// The row the facts are decoded from (`None`: none were read).
    facts: Option<PgRow>,
}

impl Reads {
    /// The facts read, as `T` ([`AdmissionFacts`] or [`UnsourcedFacts`], whichever
    /// [`Facts`] asked for); an error when none were.
    pub(super) fn facts<T: for<'r> FromRow<'r, PgRow>>(&self) -> StoreResult<T> {
        match &self.facts {
            Some(row) => Ok(T::from_row(row)?),
            None => Err(StoreError::Database(
                "the creation's reads did not read the facts it decides on".into(),
            )),
        }
    }
}

/// Which facts [`reads`] reads besides the probe.
#[derive(Clone, Copy)]
pub(super) enum Facts<'a> {
    /// None: nothing to admit or check.
    None,
    /// A scoped task's admission facts ([`AdmissionFacts`]) for this source and logical
    /// step.
    Admission {
        source: &'a SourceId,
        logical_key: &'a str,
    },
    /// A task without a source under a USD or token limit ([`UnsourcedFacts`]).
    Cost,
}

/// What a creation asks [`reads`] about: its key, its scope's cache and the facts its
/// decision needs.
pub(super) struct Asked<'a> {
    pub(super) app: &'a AppId,
    pub(super) new: &'a NewTask,
    pub(super) scope: &'a ScopeId,
    /// The cache key (a task without a source has none).
    pub(super) cache_key: Option<&'a str>,
    /// Whether a cache hit may answer (not for a recomputation).
    pub(super) probe_cache: bool,
    pub(super) facts: Facts<'a>,
}

/// How [`reads`] takes the scope's lock and whether it checks the effect key first.
pub(super) struct ReadsLock {
    /// `(key, exclusive)`; `None` when the caller holds it already (a run's task).
    pub(super) lock: Option<(i64, bool)>,
    /// Look the effect key up before waiting for the lock: a taken key answers `taken`
    /// and [`Probe::early`] alone (no lock taken), and a replay never waits for the
    /// scope's admissions.
    pub(super) replay_first: bool,
}

/// The [`Reads`] in one round trip: the function `tollgate_creation_reads` (migration
/// 0028) takes the scope's lock, then reads in snapshots taken after it was granted
/// (each statement of a VOLATILE function takes its own), so the facts see every
/// admission and reservation committed before.
pub(super) async fn reads(
    store: &PostgresStore,
    conn: &mut sqlx::PgConnection,
    asked: &Asked<'_>,
    lock: &ReadsLock,
) -> StoreResult<Reads> {
    let (kind, source, logical_key) = match asked.facts {
        Facts::None => (None, None, None),
        Facts::Admission {
            source,
            logical_key,
        } => (Some("admission"), Some(source.as_str()), Some(logical_key)),
        Facts::Cost => (Some("cost"), None, None),
    };
    let row: PgRow = sqlx::query(
        "SELECT * FROM tollgate_creation_reads($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, \
         $12, $13, $14, $15)",
    )
    .bind(asked.app.as_str())
    .bind(asked.new.effect_key.as_str())
    .bind(asked.scope.as_str())
    .bind(asked.cache_key.unwrap_or(""))
    .bind(asked.probe_cache)
    .bind(store.fixed_now())
    .bind(lock.lock.map(|(key, _)| key))
    .bind(lock.lock.is_some_and(|(_, exclusive)| exclusive))
    .bind(lock.replay_first)
    .bind(kind)
    .bind(source)
    .bind(logical_key)
    .bind(ADMISSION_WINDOW.as_millis() as i64)
    .bind(SPEND_WINDOW_MS)
    .bind(SPEND_BUCKET_MS)
    .fetch_one(&mut *conn)
    .await?;
    let probe = Probe::from_row(&row)?;
    if !probe.facts_read {
        return Ok(Reads { probe, facts: None });
    }
    check_first_bucket(probe.now, probe.first_bucket)?;
    Ok(Reads {
        probe,
        facts: Some(row),
    })
}

/// The `FROM` part both unlocked reads ([`cost_reads`], [`scoped_reads`]) start with:
/// `c` — whether the effect key `$2` of app `$1` is taken, and "now" (the fixed clock
/// `$4`, or the database's) — and `b`, the spend window's first bucket (`$5` the window,
/// `$6` the bucket width); `$3` is the scope. [`bind_unlocked`] binds them.
macro_rules! unlocked_clock {
    () => {
        concat!(
            "FROM (SELECT EXISTS (SELECT 1 FROM tasks WHERE app = $1 AND effect_key = $2) \
               AS taken, ",
            now_sql!("4"),
            " AS now) AS c \
             CROSS JOIN LATERAL (SELECT tollgate_first_bucket(c.now, $5, $6) AS first_bucket) \
               AS b "
        )
    };
}

/// Binds [`unlocked_clock!`]'s `$1` to `$6`.
fn bind_unlocked<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    store: &PostgresStore,
    app: &'q AppId,
    new: &'q NewTask,
    scope: &'q ScopeId,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    query
        .bind(app.as_str())
        .bind(new.effect_key.as_str())
        .bind(scope.as_str())
        .bind(store.fixed_now())
        .bind(SPEND_WINDOW_MS)
        .bind(SPEND_BUCKET_MS)
}

/// What a creation in one statement reads, without the scope's lock
/// ([`super::optimistic`]): whether its effect key is taken, "now", the window's first
/// spend bucket, and the scope's cost facts.
#[derive(sqlx::FromRow)]
pub(super) struct CostReads {
    pub(super) taken: bool,
    pub(super) now: i64,
    first_bucket: i64,
    #[sqlx(flatten)]
    pub(super) facts: UnsourcedFacts,
}

/// The [`CostReads`] in one plain statement (the functions it calls, migration 0030, are
/// inlined by the planner: no procedural call, unlike [`reads`]).
pub(super) async fn cost_reads(
    store: &PostgresStore,
    conn: &mut sqlx::PgConnection,
    app: &AppId,
    new: &NewTask,
    scope: &ScopeId,
) -> StoreResult<CostReads> {
    let sql = concat!(
        "SELECT c.taken, c.now, b.first_bucket, f.token_units, f.token_at, \
         f.scope_window_nano ",
        unlocked_clock!(),
        "CROSS JOIN LATERAL tollgate_cost_facts($1, $3, b.first_bucket) AS f"
    );
    let row = bind_unlocked(sqlx::query(sql), store, app, new, scope)
        .fetch_one(&mut *conn)
        .await?;
    let read = CostReads::from_row(&row)?;
    check_first_bucket(read.now, Some(read.first_bucket))?;
    Ok(read)
}

/// What a scoped creation in one statement reads, without the scope's lock
/// ([`super::optimistic`]): whether its effect key is taken, "now", the window's first
/// spend bucket, the newest cache hit, and — when neither — the scope's admission facts
/// ([`AdmissionFacts`], decoded from the same row by [`ScopedReads::facts`]) with the
/// count of its expired sightings.
#[derive(sqlx::FromRow)]
pub(super) struct ScopedReads {
    pub(super) taken: bool,
    pub(super) now: i64,
    first_bucket: i64,
    pub(super) hit_id: Option<String>,
    pub(super) hit_output: Option<String>,
    pub(super) hit_charged_nano: Option<i64>,
    /// The scope's sightings at or before the cutoff (`None`: no facts were read).
    pub(super) expired: Option<i64>,
}

/// [`ScopedReads`] and the row its facts are decoded from.
pub(super) struct ScopedRead {
    pub(super) read: ScopedReads,
    row: PgRow,
}

impl ScopedRead {
    /// The admission facts read (nothing pruned: the caller goes on only when none
    /// expired); `None` when the key was taken or a hit found.
    pub(super) fn facts(&self) -> StoreResult<Option<AdmissionFacts>> {
        if self.read.expired.is_none() {
            return Ok(None);
        }
        Ok(Some(AdmissionFacts::from_row(&self.row)?))
    }
}

/// The [`ScopedReads`] in one plain statement (the SQL functions it calls, migrations
/// 0030 and 0031, are the locked path's own reads: `tollgate_newest_success`,
/// `tollgate_admission_facts`). `cache_key`: `None` for a recomputation (no hit). The
/// facts' subquery is kept whole (`OFFSET 0`), so its condition gates it: a replay or a
/// hit reads no facts.
pub(super) async fn scoped_reads(
    store: &PostgresStore,
    conn: &mut sqlx::PgConnection,
    (app, scope): (&AppId, &ScopeId),
    new: &NewTask,
    (source, logical_key): (&SourceId, &str),
    cache_key: Option<&str>,
) -> StoreResult<ScopedRead> {
    let sql = concat!(
        "SELECT c.taken, c.now, b.first_bucket, h.id AS hit_id, h.output AS hit_output, \
         h.charged_nano AS hit_charged_nano, 0::BIGINT AS pruned, f.expired, \
         f.bucket_units, f.bucket_at, f.sources_in_window, f.active, f.token_units, \
         f.token_at, f.seen, f.steps, f.counted, f.global_active, f.scope_window_nano, \
         f.app_active, f.borrowed ",
        unlocked_clock!(),
        "LEFT JOIN LATERAL (SELECT n.id, n.output, n.charged_nano \
               FROM tollgate_newest_success($1, $3, $7) AS n WHERE $7 IS NOT NULL) AS h ON true \
         LEFT JOIN LATERAL (SELECT * FROM tollgate_admission_facts($1, $3, $8, $9, \
               c.now - $10, b.first_bucket) WHERE NOT c.taken AND h.id IS NULL OFFSET 0) AS f \
         ON true"
    );
    let row = bind_unlocked(sqlx::query(sql), store, app, new, scope)
        .bind(cache_key)
        .bind(source.as_str())
        .bind(logical_key)
        .bind(ADMISSION_WINDOW.as_millis() as i64)
        .fetch_one(&mut *conn)
        .await?;
    let read = ScopedReads::from_row(&row)?;
    check_first_bucket(read.now, Some(read.first_bucket))?;
    Ok(ScopedRead { read, row })
}

/// The window's first bucket is core's rule; the database's reading of it must agree.
fn check_first_bucket(now: i64, read: Option<i64>) -> StoreResult<()> {
    let first = window_first_bucket(Timestamp(now));
    if read != Some(first) {
        return Err(StoreError::Corrupt(format!(
            "creation reads summed spend from bucket {read:?}, core's window starts at {first}"
        )));
    }
    Ok(())
}

/// docs/conformance.md#create-owner-check for a run's task: the run exists in the app and is not canceled; its
/// scope and subject apply. With `lock_for_admission`, the run's scope lock is taken
/// (exclusive) before the run row (the lock order).
pub(super) async fn run_owner(
    tx: &mut Tx,
    app: &AppId,
    run_id: RunId,
    lock_for_admission: bool,
) -> StoreResult<(ScopeId, Option<Subject>)> {
    let scope: Option<String> =
        sqlx::query_scalar("SELECT scope FROM runs WHERE id = $1 AND app = $2")
            .bind(run_id.to_string())
            .bind(app.as_str())
            .fetch_optional(&mut **tx)
            .await?;
    let Some(scope) = scope else {
        return Err(StoreError::RunNotFound(run_id.to_string()));
    };
    let scope = ScopeId::new(scope).map_err(|e| StoreError::Corrupt(format!("run scope: {e}")))?;
    if lock_for_admission {
        lock_scope(tx, app, &scope, true).await?;
    }
    // FOR SHARE: a concurrent cancel of the run either commits first (and we see it) or
    // waits for us (and its cascade sees the new task).
    let row: Option<RunOwnerRow> = sqlx::query_as(
        "SELECT state, cancel_requested, subject_type, subject_id FROM runs \
         WHERE id = $1 AND app = $2 FOR SHARE",
    )
    .bind(run_id.to_string())
    .bind(app.as_str())
    .fetch_optional(&mut **tx)
    .await?;
    let Some(run) = row else {
        return Err(StoreError::RunNotFound(run_id.to_string()));
    };
    if run.cancel_requested || run.state == RunState::Canceled.as_str() {
        return Err(StoreError::RunCanceled(run_id.to_string()));
    }
    let subject = stored_subject(run.subject_type, run.subject_id)?;
    Ok((scope, subject))
}

/// What a run's task takes from its run, under `FOR SHARE`.
#[derive(sqlx::FromRow)]
struct RunOwnerRow {
    state: String,
    cancel_requested: bool,
    subject_type: Option<String>,
    subject_id: Option<String>,
}
