//! SPEC §5 and §8 on PostgreSQL: claim, heartbeat, complete, fail, cancel, release,
//! listing and owner deletion.

use super::admission::lock_scope;
use super::{PostgresStore, Tx, fetch_task, id_array, now_sql};
use crate::rows::{
    FinishedRow, TaskRow, admitted_per_scope, finished_stripe, run_id, task_columns,
    task_columns_qualified, task_id, tasks,
};
use crate::{
    Completion, HeartbeatReport, MAX_PAGE, ScopedSource, StoreError, StoreResult, Transition,
    UnreleasedPage, UnreleasedQuery, keyset_fetch, keyset_page, page_size,
};
use std::collections::{HashMap, HashSet};
use tollgate_core::{
    AppId, EffectKey, ErrorCode, RunId, ScopeId, SourceId, Task, TaskId, Timestamp, Usage,
    WorkerId, truncate_message, validate_output,
};

/// SQL condition: the task's run (if any) is not canceled.
macro_rules! run_not_canceled {
    () => {
        "(run_id IS NULL OR NOT EXISTS (SELECT 1 FROM runs r WHERE r.id = tasks.run_id \
         AND (r.cancel_requested OR r.state = 'canceled')))"
    };
}

/// SQL condition: cancellation was requested for the task or its run.
macro_rules! cancel_wanted {
    () => {
        "(tasks.cancel_requested OR (tasks.run_id IS NOT NULL AND EXISTS (SELECT 1 FROM runs r \
         WHERE r.id = tasks.run_id AND (r.cancel_requested OR r.state = 'canceled'))))"
    };
}
pub(super) use cancel_wanted;

/// What every move to a terminal state does besides the row itself (SPEC §4–5, §7):
/// admitted tasks give back their capacity; failed, canceled and expired tasks free their
/// logical key (their source stays seen); runs waiting on any of them are woken.
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
    let ids: Vec<String> = finished.iter().map(|f| f.id.clone()).collect();
    if clear_logical_keys {
        sqlx::query(
            "UPDATE admissions SET logical_key = NULL \
             WHERE task_id = ANY($1) AND logical_key IS NOT NULL",
        )
        .bind(&ids)
        .execute(&mut **tx)
        .await?;
    }
    wake_runs_waiting_on(tx, &ids, now, false).await
}

/// Admitted tasks that left queued/running give back their scope's and the service's
/// capacity. Scope rows are updated in sorted order (the lock order).
pub(super) async fn release_capacity(tx: &mut Tx, finished: &[FinishedRow]) -> StoreResult<()> {
    let (per_scope, total) = admitted_per_scope(finished);
    if total == 0 {
        return Ok(());
    }
    for ((app, scope), n) in per_scope {
        sqlx::query("UPDATE scope_state SET active = active - $1 WHERE app = $2 AND scope = $3")
            .bind(n)
            .bind(app)
            .bind(scope)
            .execute(&mut **tx)
            .await?;
    }
    sqlx::query("UPDATE global_finished SET finished = finished + $1 WHERE stripe = $2")
        .bind(total)
        .bind(finished_stripe(finished))
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Wakes runs waiting on any of the tasks. Transactions that already hold the runs' rows
/// (single-task transitions lock the run first) wait; sweeps, which lock tasks before
/// runs, skip locked runs instead (a run locked elsewhere is being canceled or is about to
/// wait and check the task itself; the repair sweep heals anything left).
pub(super) async fn wake_runs_waiting_on(
    tx: &mut Tx,
    ids: &[String],
    now: Timestamp,
    skip_locked: bool,
) -> StoreResult<Vec<RunId>> {
    let sql = if skip_locked {
        "UPDATE runs SET state = 'running', waiting_on = NULL, woken_at = $1, updated_at = $1 \
         WHERE id IN (SELECT id FROM runs WHERE state = 'waiting' AND waiting_on = ANY($2) \
         FOR NO KEY UPDATE SKIP LOCKED) RETURNING id"
    } else {
        "UPDATE runs SET state = 'running', waiting_on = NULL, woken_at = $1, updated_at = $1 \
         WHERE state = 'waiting' AND waiting_on = ANY($2) RETURNING id"
    };
    let woken: Vec<String> = sqlx::query_scalar(sql)
        .bind(now.0)
        .bind(ids)
        .fetch_all(&mut **tx)
        .await?;
    woken.iter().map(|r| run_id(r)).collect()
}

/// Locks the row of the task's run, if it has one (lock order: runs before tasks), so a
/// transition that wakes the run cannot deadlock with a cancel of that run.
async fn lock_run_of(tx: &mut Tx, id: TaskId) -> StoreResult<()> {
    sqlx::query(
        "SELECT 1 FROM runs WHERE id = (SELECT run_id FROM tasks WHERE id = $1) \
         FOR NO KEY UPDATE",
    )
    .bind(id.to_string())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

pub(super) async fn claim_task(
    store: &PostgresStore,
    id: TaskId,
    worker: &WorkerId,
) -> StoreResult<Option<Task>> {
    // One statement, its own transaction: one round trip. A concurrent claim waits for
    // the row, then re-checks `status = 'queued'` and finds it running: each task is
    // claimed once.
    let row: Option<TaskRow> = sqlx::query_as(concat!(
        "WITH clock AS (SELECT ",
        now_sql!(2),
        " AS now) UPDATE tasks SET status = 'running', worker = $1, attempt = attempt + 1, \
         claimed_at = clock.now, heartbeat_at = clock.now FROM clock \
         WHERE id = $3 AND status = 'queued' AND NOT cancel_requested AND ",
        run_not_canceled!(),
        " RETURNING ",
        task_columns_qualified!()
    ))
    .bind(worker.as_str())
    .bind(store.fixed_now())
    .bind(id.to_string())
    .fetch_optional(&store.pool)
    .await?;
    row.map(TaskRow::into_task).transpose()
}

pub(super) async fn claim_next(
    store: &PostgresStore,
    worker: &WorkerId,
    limit: u32,
) -> StoreResult<Vec<Task>> {
    if limit == 0 {
        return Ok(Vec::new());
    }
    let limit = limit.min(MAX_PAGE);
    // One statement, its own transaction: one round trip for the whole claim.
    // MATERIALIZED: the pick runs once, so LIMIT and SKIP LOCKED hold exactly.
    let rows: Vec<TaskRow> = sqlx::query_as(concat!(
        "WITH clock AS (SELECT ",
        now_sql!(2),
        " AS now), picked AS MATERIALIZED (SELECT id FROM tasks WHERE status = 'queued' \
         AND NOT cancel_requested AND ",
        run_not_canceled!(),
        " ORDER BY created_at, id LIMIT $3 FOR UPDATE SKIP LOCKED) \
         UPDATE tasks SET status = 'running', worker = $1, attempt = attempt + 1, \
         claimed_at = clock.now, heartbeat_at = clock.now FROM picked, clock \
         WHERE tasks.id = picked.id AND tasks.status = 'queued' RETURNING ",
        task_columns_qualified!()
    ))
    .bind(worker.as_str())
    .bind(store.fixed_now())
    .bind(i64::from(limit))
    .fetch_all(&store.pool)
    .await?;
    let mut claimed = tasks(rows)?;
    claimed.sort_by_key(|t| (t.created_at, t.id));
    Ok(claimed)
}

pub(super) async fn heartbeat(
    store: &PostgresStore,
    worker: &WorkerId,
    ids: &[TaskId],
) -> StoreResult<HeartbeatReport> {
    if ids.is_empty() {
        return Ok(HeartbeatReport::default());
    }
    // One statement for all of the worker's tasks, its own transaction: one round trip.
    // Rows are locked in id order (the lock order for several task rows).
    let alive: Vec<String> = sqlx::query_scalar(concat!(
        "WITH picked AS MATERIALIZED (SELECT id FROM tasks WHERE id = ANY($2) \
         AND status = 'running' AND worker = $3 ORDER BY id FOR NO KEY UPDATE) \
         UPDATE tasks SET heartbeat_at = ",
        now_sql!(1),
        " FROM picked \
         WHERE tasks.id = picked.id AND tasks.status = 'running' AND NOT ",
        cancel_wanted!(),
        " RETURNING tasks.id"
    ))
    .bind(store.fixed_now())
    .bind(id_array(ids))
    .bind(worker.as_str())
    .fetch_all(&store.pool)
    .await?;
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
    store: &PostgresStore,
    id: TaskId,
    worker: &WorkerId,
    output: serde_json::Value,
    usage: Usage,
) -> StoreResult<Transition> {
    // The request never changes, so its contract is checked before the write.
    let Some(current) = fetch_task(&store.pool, &id.to_string()).await? else {
        return Ok(Transition::default());
    };
    let request = current.parsed_request()?;
    let output = validate_output(request.request(), &output)?;
    let output = serde_json::to_string(&output)
        .map_err(|e| StoreError::Database(format!("cannot encode output: {e}")))?;
    let usage = serde_json::to_string(&usage)
        .map_err(|e| StoreError::Database(format!("cannot encode usage: {e}")))?;
    let mut tx = store.begin().await?;
    let now = store.now(&mut tx).await?;
    if current.run_id().is_some() {
        lock_run_of(&mut tx, id).await?;
    }
    let done: Option<FinishedRow> = sqlx::query_as(concat!(
        "UPDATE tasks SET status = 'succeeded', output = $1, usage = $2, completed_at = $3 \
         WHERE id = $4 AND status = 'running' AND worker = $5 AND NOT ",
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

/// Several completions in ONE transaction (see `Store::complete_tasks`): each item is
/// checked as [`complete_task`] checks it, then one statement moves every applicable task
/// to `succeeded` (for unscoped application tasks that statement is the whole
/// transaction). Lock order as on the single paths: the runs of the tasks first, then
/// the task rows in id order. Runs woken by the batch are reported on its first applied
/// transition (wakes are notification hints; the database holds the truth).
pub(super) async fn complete_tasks(
    store: &PostgresStore,
    items: Vec<Completion>,
) -> StoreResult<Vec<StoreResult<Transition>>> {
    if items.is_empty() {
        return Ok(Vec::new());
    }
    let all_ids: Vec<String> = items.iter().map(|c| c.id.to_string()).collect();
    let current: Vec<TaskRow> = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE id = ANY($1)"
    ))
    .bind(&all_ids)
    .fetch_all(&store.pool)
    .await?;
    let current: HashMap<TaskId, Task> = tasks(current)?.into_iter().map(|t| (t.id, t)).collect();
    // The request never changes, so its contract is checked before the write.
    let mut answers: Vec<Option<StoreResult<Transition>>> = items.iter().map(|_| None).collect();
    let (mut ids, mut workers, mut outputs, mut usages) = (vec![], vec![], vec![], vec![]);
    let mut seen = HashSet::new();
    let mut any_run = false;
    let mut any_scoped = false;
    for (i, item) in items.iter().enumerate() {
        let Some(task) = current.get(&item.id) else {
            answers[i] = Some(Ok(Transition::default()));
            continue;
        };
        if !seen.insert(item.id) {
            // The same task twice: only its first completion can apply.
            answers[i] = Some(Ok(Transition {
                applied: false,
                task: None,
                woken_runs: Vec::new(),
            }));
            continue;
        }
        match encode_completion(task, item) {
            Ok((output, usage)) => {
                any_run |= task.run_id().is_some();
                // Scoped tasks may be admitted: their capacity is given back below.
                any_scoped |= task.source.is_some();
                ids.push(item.id.to_string());
                workers.push(item.worker.as_str().to_string());
                outputs.push(output);
                usages.push(usage);
            }
            Err(e) if e.is_per_item() => answers[i] = Some(Err(e)),
            Err(e) => return Err(e),
        }
    }
    if ids.is_empty() {
        // Nothing to write: every item was answered already.
        return Ok(items
            .iter()
            .zip(answers)
            .map(|(item, answer)| match answer {
                Some(Ok(mut refused)) => {
                    refused.task = current.get(&item.id).cloned();
                    Ok(refused)
                }
                Some(Err(e)) => Err(e),
                None => Ok(Transition::default()),
            })
            .collect());
    }
    // Unscoped application tasks change nothing but their rows: the UPDATE alone is the
    // transaction (one round trip). Otherwise capacity and runs change with them.
    let mut tx = if any_run || any_scoped {
        Some(store.begin().await?)
    } else {
        None
    };
    if let Some(tx) = tx.as_mut().filter(|_| any_run) {
        sqlx::query(
            "SELECT 1 FROM runs WHERE id IN (SELECT run_id FROM tasks WHERE id = ANY($1)) \
             ORDER BY id FOR NO KEY UPDATE",
        )
        .bind(&ids)
        .execute(&mut **tx)
        .await?;
    }
    // "now" is read inside the statement (no round trip of its own) and returned with
    // every row it moved.
    let update = sqlx::query_as(concat!(
        "WITH clock AS (SELECT ",
        now_sql!(5),
        " AS now), \
         item AS (SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[]) \
         AS i(id, worker, output, usage)), \
         picked AS MATERIALIZED (SELECT tasks.id FROM tasks JOIN item ON item.id = tasks.id \
         WHERE tasks.status = 'running' AND tasks.worker = item.worker \
         ORDER BY tasks.id FOR NO KEY UPDATE OF tasks) \
         UPDATE tasks SET status = 'succeeded', output = item.output, usage = item.usage, \
         completed_at = clock.now FROM picked, item, clock \
         WHERE tasks.id = picked.id AND item.id = tasks.id AND tasks.status = 'running' \
         AND tasks.worker = item.worker AND NOT ",
        cancel_wanted!(),
        " RETURNING tasks.id, tasks.app, tasks.scope, tasks.admitted, clock.now"
    ))
    .bind(&ids)
    .bind(&workers)
    .bind(&outputs)
    .bind(&usages)
    .bind(store.fixed_now());
    let done: Vec<(String, String, String, bool, i64)> = match tx.as_mut() {
        Some(tx) => update.fetch_all(&mut **tx).await?,
        None => update.fetch_all(&store.pool).await?,
    };
    let now = done.first().map(|d| Timestamp(d.4));
    let done: Vec<FinishedRow> = done
        .into_iter()
        .map(|(id, app, scope, admitted, _)| FinishedRow {
            id,
            app,
            scope,
            admitted,
        })
        .collect();
    let applied: HashSet<String> = done.iter().map(|f| f.id.clone()).collect();
    // What `after_terminal` does for successes, minus the statements with nothing to do.
    let mut woken_runs = Vec::new();
    if let Some(tx) = tx.as_mut() {
        release_capacity(tx, &done).await?;
        if let (Some(now), true) = (now, any_run) {
            let finished: Vec<String> = done.iter().map(|f| f.id.clone()).collect();
            woken_runs = wake_runs_waiting_on(tx, &finished, now, false).await?;
        }
    }
    let read_back = sqlx::query_as(concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks WHERE id = ANY($1)"
    ))
    .bind(&all_ids);
    let after: Vec<TaskRow> = match tx {
        Some(mut tx) => {
            let after = read_back.fetch_all(&mut *tx).await?;
            tx.commit().await?;
            after
        }
        None => read_back.fetch_all(&store.pool).await?,
    };
    let mut after: HashMap<TaskId, Task> = tasks(after)?.into_iter().map(|t| (t.id, t)).collect();
    Ok(items
        .iter()
        .zip(answers)
        .map(|(item, answer)| match answer {
            Some(Ok(mut refused)) => {
                refused.task = after.get(&item.id).cloned();
                Ok(refused)
            }
            Some(Err(e)) => Err(e),
            None => {
                let applied = applied.contains(&item.id.to_string());
                Ok(Transition {
                    applied,
                    task: after.remove(&item.id),
                    woken_runs: if applied {
                        std::mem::take(&mut woken_runs)
                    } else {
                        Vec::new()
                    },
                })
            }
        })
        .collect())
}

/// A completion's output (checked against the task's contract) and usage, as stored.
fn encode_completion(task: &Task, item: &Completion) -> StoreResult<(String, String)> {
    let request = task.parsed_request()?;
    let output = validate_output(request.request(), &item.output)?;
    let output = serde_json::to_string(&output)
        .map_err(|e| StoreError::Database(format!("cannot encode output: {e}")))?;
    let usage = serde_json::to_string(&item.usage)
        .map_err(|e| StoreError::Database(format!("cannot encode usage: {e}")))?;
    Ok((output, usage))
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
    store: &PostgresStore,
    id: TaskId,
    code: ErrorCode,
    message: &str,
) -> StoreResult<Transition> {
    let mut tx = store.begin().await?;
    let now = store.now(&mut tx).await?;
    lock_run_of(&mut tx, id).await?;
    let done: Option<FinishedRow> = sqlx::query_as(
        "UPDATE tasks SET status = 'failed', error_code = $1, error_message = $2, \
         completed_at = $3 WHERE id = $4 AND status IN ('queued', 'running') \
         RETURNING id, app, scope, admitted",
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
    store: &PostgresStore,
    app: &AppId,
    id: TaskId,
) -> StoreResult<Option<Transition>> {
    let mut tx = store.begin().await?;
    let exists: Option<String> =
        sqlx::query_scalar("SELECT status FROM tasks WHERE id = $1 AND app = $2")
            .bind(id.to_string())
            .bind(app.as_str())
            .fetch_optional(&mut *tx)
            .await?;
    if exists.is_none() {
        tx.rollback().await?;
        return Ok(None);
    }
    let now = store.now(&mut tx).await?;
    lock_run_of(&mut tx, id).await?;
    // Terminal states are final: only a queued or running task is marked and canceled.
    let done: Option<FinishedRow> = sqlx::query_as(
        "UPDATE tasks SET cancel_requested = TRUE, status = 'canceled', error_code = $1, \
         error_message = $2, completed_at = $3 \
         WHERE id = $4 AND app = $5 AND status IN ('queued', 'running') \
         RETURNING id, app, scope, admitted",
    )
    .bind(ErrorCode::Canceled.as_str())
    .bind(CANCELED_MESSAGE)
    .bind(now.0)
    .bind(id.to_string())
    .bind(app.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    finish(tx, id, done, true, now).await.map(Some)
}

pub(super) async fn is_cancellation_requested(
    store: &PostgresStore,
    id: TaskId,
) -> StoreResult<bool> {
    let row: Option<(String, bool, Option<bool>, Option<String>)> = sqlx::query_as(
        "SELECT t.status, t.cancel_requested, r.cancel_requested, r.state \
         FROM tasks t LEFT JOIN runs r ON r.id = t.run_id WHERE t.id = $1",
    )
    .bind(id.to_string())
    .fetch_optional(&store.pool)
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

pub(super) async fn mark_canceled(store: &PostgresStore, id: TaskId) -> StoreResult<Transition> {
    let mut tx = store.begin().await?;
    let now = store.now(&mut tx).await?;
    lock_run_of(&mut tx, id).await?;
    let done: Option<FinishedRow> = sqlx::query_as(concat!(
        "UPDATE tasks SET cancel_requested = TRUE, status = 'canceled', error_code = $1, \
         error_message = $2, completed_at = $3 \
         WHERE id = $4 AND status IN ('queued', 'running') AND ",
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
    store: &PostgresStore,
    app: &AppId,
    scope: &ScopeId,
    key: &EffectKey,
) -> StoreResult<bool> {
    let mut tx = store.begin().await?;
    let now = store.now(&mut tx).await?;
    let matched = sqlx::query(
        "UPDATE tasks SET released_at = COALESCE(released_at, $1) \
         WHERE app = $2 AND effect_key = $3 AND scope = $4 AND run_id IS NULL",
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
    store: &PostgresStore,
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
         WHERE app = $1 AND run_id IS NULL AND released_at IS NULL AND source_id IS NOT NULL \
         AND ($2::TEXT IS NULL OR scope = $2) AND ($3::TEXT IS NULL OR step = $3) \
         AND ($4::TEXT IS NULL OR (scope, source_id) > ($4, $5)) \
         AND ($7::TEXT IS NULL OR (subject_type = $7 AND subject_id = $8)) \
         ORDER BY scope, source_id LIMIT $6",
    )
    .bind(app.as_str())
    .bind(query.scope.as_ref().map(|s| s.as_str()))
    .bind(query.step.as_ref().map(|s| s.as_str()))
    .bind(after_scope)
    .bind(after_source)
    .bind(keyset_fetch(limit))
    .bind(query.subject.as_ref().map(|s| s.kind.as_str()))
    .bind(query.subject.as_ref().map(|s| s.id.as_str()))
    .fetch_all(&store.pool)
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
    store: &PostgresStore,
    app: &AppId,
    scope: &ScopeId,
    source: Option<&SourceId>,
) -> StoreResult<u64> {
    let mut tx = store.begin().await?;
    // Exclusive scope lock: serialized with every creation of this owner, so no task of
    // the owner slips in during the deletion. Admission records are kept.
    lock_scope(&mut tx, app, scope, true).await?;
    let deleted: Vec<(String, String, String, bool, String)> = sqlx::query_as(
        "WITH picked AS MATERIALIZED (SELECT id FROM tasks WHERE app = $1 AND scope = $2 \
         AND run_id IS NULL AND ($3::TEXT IS NULL OR source_id = $3) ORDER BY id FOR UPDATE) \
         DELETE FROM tasks t USING picked WHERE t.id = picked.id \
         RETURNING t.id, t.app, t.scope, t.admitted, t.status",
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
    store: &PostgresStore,
    after: Option<TaskId>,
    limit: u32,
) -> StoreResult<Vec<TaskId>> {
    let limit = page_size(limit);
    let ids: Vec<String> = sqlx::query_scalar(
        "SELECT id FROM tasks WHERE status = 'queued' AND ($1::TEXT IS NULL OR id > $1) \
         ORDER BY id LIMIT $2",
    )
    .bind(after.map(|a| a.to_string()))
    .bind(i64::from(limit))
    .fetch_all(&store.pool)
    .await?;
    ids.iter().map(|s| task_id(s)).collect()
}
