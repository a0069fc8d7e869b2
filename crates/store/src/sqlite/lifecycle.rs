//! SPEC §5 and §8 on SQLite: claim, heartbeat, complete, fail, cancel, release, listing
//! and owner deletion.

use super::{SqliteStore, Tx, fetch_task, id_list};
use crate::rows::{
    FinishedRow, TaskRow, admitted_per_scope, finished_stripe, run_id, task_columns, task_id, tasks,
};
use crate::{
    HeartbeatReport, MAX_PAGE, ScopedSource, StoreError, StoreResult, Transition, UnreleasedPage,
    UnreleasedQuery, keyset_fetch, keyset_page, page_size,
};
use std::collections::HashSet;
use tollgate_core::{
    AppId, EffectKey, ErrorCode, RunId, ScopeId, SourceId, Task, TaskId, Timestamp, Usage,
    WorkerId, truncate_message, validate_output,
};

/// SQL condition: the task's run (if any) is not canceled.
macro_rules! run_not_canceled {
    () => {
        "(run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = tasks.run_id \
         AND (r.cancel_requested = 1 OR r.state = 'canceled')))"
    };
}

/// SQL condition: cancellation was requested for the task or its run.
macro_rules! cancel_wanted {
    () => {
        "(cancel_requested = 1 OR (run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs r \
         WHERE r.id = tasks.run_id AND (r.cancel_requested = 1 OR r.state = 'canceled'))))"
    };
}
pub(super) use cancel_wanted;

/// What every move to a terminal state does besides the row itself (SPEC §4–5, §7):
/// admitted tasks give back their scope and global capacity; failed, canceled and expired
/// tasks free their logical key (their source stays seen); runs waiting on any of the
/// tasks are woken. Returns the woken runs.
pub(super) async fn after_terminal(
    tx: &mut Tx,
    finished: &[FinishedRow],
    clear_logical_keys: bool,
    now: Timestamp,
) -> StoreResult<Vec<RunId>> {
    if finished.is_empty() {
        return Ok(Vec::new());
    }
    release_capacity(tx, finished).await?;
    let ids: Vec<&str> = finished.iter().map(|f| f.id.as_str()).collect();
    let list = id_list(&ids);
    if clear_logical_keys {
        sqlx::query(
            "UPDATE admissions SET logical_key = NULL \
             WHERE task_id IN (SELECT value FROM json_each(?)) AND logical_key IS NOT NULL",
        )
        .bind(&list)
        .execute(&mut **tx)
        .await?;
    }
    wake_runs_waiting_on(tx, &list, now).await
}

/// Admitted tasks that left queued/running no longer count against their scope's or the
/// service's concurrency.
pub(super) async fn release_capacity(tx: &mut Tx, finished: &[FinishedRow]) -> StoreResult<()> {
    let (per_scope, total) = admitted_per_scope(finished);
    if total == 0 {
        return Ok(());
    }
    for ((app, scope), n) in per_scope {
        sqlx::query("UPDATE scope_state SET active = active - ? WHERE app = ? AND scope = ?")
            .bind(n)
            .bind(app)
            .bind(scope)
            .execute(&mut **tx)
            .await?;
    }
    sqlx::query("UPDATE global_finished SET finished = finished + ? WHERE stripe = ?")
        .bind(total)
        .bind(finished_stripe(finished))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Wakes runs waiting on any task of a JSON id list.
pub(super) async fn wake_runs_waiting_on(
    tx: &mut Tx,
    list: &str,
    now: Timestamp,
) -> StoreResult<Vec<RunId>> {
    let woken: Vec<String> = sqlx::query_scalar(
        "UPDATE runs SET state = 'running', waiting_on = NULL, woken_at = ?, updated_at = ? \
         WHERE state = 'waiting' AND waiting_on IN (SELECT value FROM json_each(?)) \
         RETURNING id",
    )
    .bind(now.0)
    .bind(now.0)
    .bind(list)
    .fetch_all(&mut **tx)
    .await?;
    woken.iter().map(|r| run_id(r)).collect()
}

pub(super) async fn claim_task(
    store: &SqliteStore,
    id: TaskId,
    worker: &WorkerId,
) -> StoreResult<Option<Task>> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "UPDATE tasks SET status = 'running', worker = ?, attempt = attempt + 1, \
         claimed_at = ?, heartbeat_at = ? \
         WHERE id = ? AND status = 'queued' AND cancel_requested = 0 AND ",
        run_not_canceled!(),
        " RETURNING ",
        task_columns!()
    ))
    .bind(worker.as_str())
    .bind(now.0)
    .bind(now.0)
    .bind(id.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    row.map(TaskRow::into_task).transpose()
}

pub(super) async fn claim_next(
    store: &SqliteStore,
    worker: &WorkerId,
    limit: u32,
) -> StoreResult<Vec<Task>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let limit = limit.min(MAX_PAGE);
    let mut tx = store.begin().await?;
    let now = store.now();
    let rows: Vec<TaskRow> = sqlx::query_as(concat!(
        "UPDATE tasks SET status = 'running', worker = ?, attempt = attempt + 1, \
         claimed_at = ?, heartbeat_at = ? \
         WHERE id IN (SELECT id FROM tasks WHERE status = 'queued' AND cancel_requested = 0 \
         AND ",
        run_not_canceled!(),
        " ORDER BY created_at, id LIMIT ?) RETURNING ",
        task_columns!()
    ))
    .bind(worker.as_str())
    .bind(now.0)
    .bind(now.0)
    .bind(i64::from(limit))
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let mut claimed = tasks(rows)?;
    claimed.sort_by_key(|t| (t.created_at, t.id));
    Ok(claimed)
}

pub(super) async fn heartbeat(
    store: &SqliteStore,
    worker: &WorkerId,
    ids: &[TaskId],
) -> StoreResult<HeartbeatReport> {
    if ids.is_empty() {
        return Ok(HeartbeatReport::default());
    }
    let mut tx = store.begin().await?;
    let now = store.now();
    // One write for all of the worker's tasks.
    let alive: Vec<String> = sqlx::query_scalar(concat!(
        "UPDATE tasks SET heartbeat_at = ? \
         WHERE id IN (SELECT value FROM json_each(?)) AND status = 'running' AND worker = ? \
         AND NOT ",
        cancel_wanted!(),
        " RETURNING id"
    ))
    .bind(now.0)
    .bind(id_list(ids))
    .bind(worker.as_str())
    .fetch_all(&mut *tx)
    .await?;
    tx.commit().await?;
    let alive: HashSet<TaskId> = alive.iter().map(|s| task_id(s)).collect::<Result<_, _>>()?;
    let mut report = HeartbeatReport::default();
    for id in ids {
        if alive.contains(id) {
            report.alive.push(*id);
        } else {
            report.stop.push(*id);
        }
    }
    Ok(report)
}

pub(super) async fn complete_task(
    store: &SqliteStore,
    id: TaskId,
    worker: &WorkerId,
    output: serde_json::Value,
    usage: Usage,
) -> StoreResult<Transition> {
    // The request never changes, so its contract can be checked before taking the write
    // lock. An invalid output is never stored as success.
    let Some(current) = fetch_task(&store.reader, &id.to_string()).await? else {
        return Ok(Transition::default());
    };
    let request = current.parsed_request()?;
    let output = validate_output(request.request(), &output)?;
    let output = serde_json::to_string(&output)
        .map_err(|e| StoreError::Database(format!("cannot encode output: {e}")))?;
    let usage = serde_json::to_string(&usage)
        .map_err(|e| StoreError::Database(format!("cannot encode usage: {e}")))?;
    let mut tx = store.begin().await?;
    let now = store.now();
    let done: Option<FinishedRow> = sqlx::query_as(concat!(
        "UPDATE tasks SET status = 'succeeded', output = ?, usage = ?, completed_at = ? \
         WHERE id = ? AND status = 'running' AND worker = ? AND NOT ",
        cancel_wanted!(),
        " RETURNING id, app, scope, admitted"
    ))
    .bind(output)
    .bind(usage)
    .bind(now.0)
    .bind(id.to_string())
    .bind(worker.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    finish(tx, id, done, false, now).await
}

/// Commits a single-task transition, running [`after_terminal`] when it applied.
async fn finish(
    mut tx: Tx,
    id: TaskId,
    finished: Option<FinishedRow>,
    clear_logical_key: bool,
    now: Timestamp,
) -> StoreResult<Transition> {
    let applied = finished.is_some();
    let woken_runs = match finished {
        Some(f) => after_terminal(&mut tx, &[f], clear_logical_key, now).await?,
        None => Vec::new(),
    };
    let task = fetch_task(&mut *tx, &id.to_string()).await?;
    tx.commit().await?;
    Ok(Transition {
        applied,
        task,
        woken_runs,
    })
}

pub(super) async fn fail_task(
    store: &SqliteStore,
    id: TaskId,
    code: ErrorCode,
    message: &str,
) -> StoreResult<Transition> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let done: Option<FinishedRow> = sqlx::query_as(
        "UPDATE tasks SET status = 'failed', error_code = ?, error_message = ?, completed_at = ? \
         WHERE id = ? AND status IN ('queued', 'running') RETURNING id, app, scope, admitted",
    )
    .bind(code.as_str())
    .bind(truncate_message(message))
    .bind(now.0)
    .bind(id.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    finish(tx, id, done, true, now).await
}

const CANCELED_MESSAGE: &str = "canceled by request";

pub(super) async fn request_cancel(
    store: &SqliteStore,
    app: &AppId,
    id: TaskId,
) -> StoreResult<Option<Transition>> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let status: Option<String> =
        sqlx::query_scalar("SELECT status FROM tasks WHERE id = ? AND app = ?")
            .bind(id.to_string())
            .bind(app.as_str())
            .fetch_optional(&mut *tx)
            .await?;
    if status.is_none() {
        tx.rollback().await?;
        return Ok(None);
    }
    // Terminal states are final: only a queued or running task is marked and canceled.
    let done: Option<FinishedRow> = sqlx::query_as(
        "UPDATE tasks SET cancel_requested = 1, status = 'canceled', error_code = ?, \
         error_message = ?, completed_at = ? \
         WHERE id = ? AND status IN ('queued', 'running') RETURNING id, app, scope, admitted",
    )
    .bind(ErrorCode::Canceled.as_str())
    .bind(CANCELED_MESSAGE)
    .bind(now.0)
    .bind(id.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    finish(tx, id, done, true, now).await.map(Some)
}

pub(super) async fn is_cancellation_requested(
    store: &SqliteStore,
    id: TaskId,
) -> StoreResult<bool> {
    let row: Option<(String, bool, Option<bool>, Option<String>)> = sqlx::query_as(
        "SELECT t.status, t.cancel_requested, r.cancel_requested, r.state \
         FROM tasks t LEFT JOIN runs r ON r.id = t.run_id WHERE t.id = ?",
    )
    .bind(id.to_string())
    .fetch_optional(&store.reader)
    .await?;
    Ok(match row {
        // A task that no longer exists was removed with its owner: never finish it.
        None => true,
        Some((status, task_cancel, run_cancel, run_state)) => {
            status == "canceled"
                || task_cancel
                || run_cancel == Some(true)
                || run_state.as_deref() == Some("canceled")
        }
    })
}

pub(super) async fn mark_canceled(store: &SqliteStore, id: TaskId) -> StoreResult<Transition> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let done: Option<FinishedRow> = sqlx::query_as(concat!(
        "UPDATE tasks SET cancel_requested = 1, status = 'canceled', error_code = ?, \
         error_message = ?, completed_at = ? \
         WHERE id = ? AND status IN ('queued', 'running') AND ",
        cancel_wanted!(),
        " RETURNING id, app, scope, admitted"
    ))
    .bind(ErrorCode::Canceled.as_str())
    .bind(CANCELED_MESSAGE)
    .bind(now.0)
    .bind(id.to_string())
    .fetch_optional(&mut *tx)
    .await?;
    finish(tx, id, done, true, now).await
}

pub(super) async fn release(
    store: &SqliteStore,
    app: &AppId,
    scope: &ScopeId,
    key: &EffectKey,
) -> StoreResult<bool> {
    let mut tx = store.begin().await?;
    let now = store.now();
    let matched = sqlx::query(
        "UPDATE tasks SET released_at = COALESCE(released_at, ?) \
         WHERE app = ? AND effect_key = ? AND scope = ? AND run_id IS NULL",
    )
    .bind(now.0)
    .bind(app.as_str())
    .bind(key.as_str())
    .bind(scope.as_str())
    .execute(&mut *tx)
    .await?
    .rows_affected()
        > 0;
    tx.commit().await?;
    Ok(matched)
}

pub(super) async fn list_unreleased_sources(
    store: &SqliteStore,
    app: &AppId,
    query: &UnreleasedQuery,
) -> StoreResult<UnreleasedPage> {
    let limit = page_size(query.limit);
    let (after_scope, after_source) = match &query.after {
        Some(c) => (Some(c.scope.as_str()), Some(c.source.as_str())),
        None => (None, None),
    };
    let rows: Vec<(String, String)> = sqlx::query_as(
        "SELECT DISTINCT scope, source_id FROM tasks \
         WHERE app = ?1 AND run_id IS NULL AND released_at IS NULL AND source_id IS NOT NULL \
         AND (?2 IS NULL OR scope = ?2) AND (?3 IS NULL OR step = ?3) \
         AND (?4 IS NULL OR (scope, source_id) > (?4, ?5)) \
         AND (?7 IS NULL OR (subject_type = ?7 AND subject_id = ?8)) \
         ORDER BY scope, source_id LIMIT ?6",
    )
    .bind(app.as_str())
    .bind(query.scope.as_ref().map(|s| s.as_str()))
    .bind(query.step.as_ref().map(|s| s.as_str()))
    .bind(after_scope)
    .bind(after_source)
    .bind(keyset_fetch(limit))
    .bind(query.subject.as_ref().map(|s| s.kind.as_str()))
    .bind(query.subject.as_ref().map(|s| s.id.as_str()))
    .fetch_all(&store.reader)
    .await?;
    let sources = rows
        .into_iter()
        .map(|(scope, source)| {
            Ok(ScopedSource {
                scope: ScopeId::new(scope).map_err(|e| StoreError::Corrupt(e.to_string()))?,
                source: SourceId::new(source).map_err(|e| StoreError::Corrupt(e.to_string()))?,
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    let (sources, next) = keyset_page(sources, limit);
    Ok(UnreleasedPage { sources, next })
}

pub(super) async fn delete_owner_data(
    store: &SqliteStore,
    app: &AppId,
    scope: &ScopeId,
    source: Option<&SourceId>,
) -> StoreResult<u64> {
    // The write lock serializes this with every creation: no task of the owner can slip
    // in between. Admission records are kept, so accounting is not reset.
    let mut tx = store.begin().await?;
    let deleted: Vec<(String, String, String, bool, String)> = sqlx::query_as(
        "DELETE FROM tasks WHERE app = ?1 AND scope = ?2 AND run_id IS NULL \
         AND (?3 IS NULL OR source_id = ?3) RETURNING id, app, scope, admitted, status",
    )
    .bind(app.as_str())
    .bind(scope.as_str())
    .bind(source.map(|s| s.as_str()))
    .fetch_all(&mut *tx)
    .await?;
    // Deleted in-flight tasks leave queued/running: they give back their capacity (their
    // workers see cancellation); admission records and logical keys stay as they are.
    let in_flight: Vec<FinishedRow> = deleted
        .iter()
        .filter(|d| d.4 == "queued" || d.4 == "running")
        .map(|(id, app, scope, admitted, _)| FinishedRow {
            id: id.clone(),
            app: app.clone(),
            scope: scope.clone(),
            admitted: *admitted,
        })
        .collect();
    release_capacity(&mut tx, &in_flight).await?;
    tx.commit().await?;
    Ok(deleted.len() as u64)
}

pub(super) async fn list_recoverable(
    store: &SqliteStore,
    after: Option<TaskId>,
    limit: u32,
) -> StoreResult<Vec<TaskId>> {
    let limit = page_size(limit);
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE status = 'queued' AND (?1 IS NULL OR id > ?1) \
         ORDER BY id LIMIT ?2",
    )
    .bind(after.map(|a| a.to_string()))
    .bind(i64::from(limit))
    .fetch_all(&store.reader)
    .await?;
    ids.iter().map(|s| task_id(s)).collect()
}
