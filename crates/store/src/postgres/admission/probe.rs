//! What a creation reads before it writes: its run owner, the scope's advisory lock, and
//! in one statement whether its effect key is taken and the newest cache hit.

use super::super::{PostgresStore, Tx, now_sql};
use crate::shared::rows::stored_subject;
use crate::{StoreError, StoreResult};
use tollgate_core::canonical::sha256_hex;
use tollgate_core::{AppId, NewTask, RunId, RunState, ScopeId, Subject};

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
}

/// Reads the [`Probe`], taking the scope's advisory lock first in the same statement
/// when `lock` is `(key, exclusive)`: one round trip. The lock is taken in the FROM
/// subquery (volatile, so never flattened) before the outer select reads the clock; the
/// statement's snapshot is older than the lock, so an effect key taken by a creation that
/// committed while this one waited may be missed here — the task insert's `ON CONFLICT`
/// finds it, and an admission rejection re-checks the key before it is reported.
#[allow(clippy::too_many_arguments)]
pub(super) async fn probe(
    store: &PostgresStore,
    tx: &mut Tx,
    app: &AppId,
    new: &NewTask,
    scope: &ScopeId,
    cache_key: Option<&str>,
    probe_cache: bool,
    lock: Option<(i64, bool)>,
) -> StoreResult<Probe> {
    macro_rules! probe_sql {
        ($from:literal) => {
            concat!(
                "SELECT EXISTS (SELECT 1 FROM tasks WHERE app = $1 AND effect_key = $2) AS taken, \
                 hit.id AS hit_id, hit.output AS hit_output, \
                 hit.charged_nano AS hit_charged_nano, ",
                now_sql!("6"),
                " AS now FROM ",
                $from,
                " LEFT JOIN LATERAL (SELECT id, output, charged_nano FROM tasks \
                   WHERE $5 AND app = $1 AND scope = $3 AND cache_key = $4 \
                   AND status = 'succeeded' \
                   ORDER BY completed_at DESC, id DESC LIMIT 1) AS hit ON true"
            )
        };
    }
    let sql = match lock {
        None => probe_sql!("(SELECT $7::BIGINT) AS unlocked"),
        Some((_, true)) => probe_sql!("(SELECT pg_advisory_xact_lock($7)) AS locked"),
        Some((_, false)) => probe_sql!("(SELECT pg_advisory_xact_lock_shared($7)) AS locked"),
    };
    Ok(sqlx::query_as(sql)
        .bind(app.as_str())
        .bind(new.effect_key.as_str())
        .bind(scope.as_str())
        .bind(cache_key.unwrap_or(""))
        .bind(probe_cache)
        .bind(store.fixed_now())
        .bind(lock.map_or(0, |(key, _)| key))
        .fetch_one(&mut **tx)
        .await?)
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
