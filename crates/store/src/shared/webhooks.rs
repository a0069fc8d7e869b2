//! Webhooks written once for both backends (docs/webhooks.md): the outbox statements
//! the terminal moves of tasks and runs run inside their own transaction ([`record_task_events`],
//! [`record_run_event`]), and the [`WebhookStore`](crate::WebhookStore) transactions
//! ([`Webhooks`]). Every statement is portable (`$n` placeholders, `ON CONFLICT`, window
//! functions, `RETURNING`), so no backend supplies anything.
//!
//! Leasing needs no `SKIP LOCKED`: the lease is one `UPDATE` whose condition (pending,
//! due, not leased) is checked again on each row after any wait for it, so of two
//! replicas racing for a delivery exactly one gets it (PostgreSQL re-reads a row another
//! transaction changed; SQLite has one writer).

mod budget;
mod deliveries;
mod retention;
mod rows;
mod store_for;

pub(crate) use budget::{
    apps_announcing, budget_listened, budget_listener_pattern, record_budget_events,
};
pub(crate) use retention::{forget_owner_events, retain_events};

pub(crate) use store_for::webhook_store_for;

use crate::shared::sql::{Arg, Backend, Exec, Statement, TxExec};
use crate::webhooks::{NewWebhookEndpoint, WebhookDelivery, WebhookEndpoint, WebhookEndpointPatch};
use crate::{StoreError, StoreResult};
use rows::{DELIVERY_COLUMNS, DeliveryRow, ENDPOINT_COLUMNS, EndpointRow};
use tollgate_core::webhook::budget::{BudgetThreshold, thresholds_text};
use tollgate_core::webhook::{TERMINAL_EVENT_PREFIX, WebhookEventType, subscription_text};
use tollgate_core::{AppId, Timestamp};

/// Most ids one outbox statement names (the rest go in further statements).
const IDS_PER_STATEMENT: usize = 500;

pub(super) fn corrupt(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(format!("{what}: {e}"))
}

pub(super) fn app_id(s: String) -> StoreResult<AppId> {
    AppId::new(s).map_err(|e| corrupt("webhook app", e))
}

pub(super) fn event_type(s: &str) -> StoreResult<WebhookEventType> {
    WebhookEventType::parse(s).map_err(|e| corrupt("webhook event type", e))
}

/// `LIKE` pattern matching a subscription (a JSON array of names) that holds `name`.
/// Event names hold no `LIKE` wildcard (core's tests check it).
pub(super) fn subscribed_pattern(name: &str) -> String {
    format!("%\"{name}\"%")
}

/// ` IN ($a, $b, …)` over `ids`, bound to `s`.
pub(super) fn id_set(s: &mut Statement, ids: &[String]) -> String {
    let ps: Vec<String> = ids
        .iter()
        .map(|id| s.placeholder(Arg::from(id.as_str())))
        .collect();
    format!(" IN ({})", ps.join(", "))
}

/// Whether an enabled endpoint of task `$t`'s app subscribes to the event of its
/// current status (`task.<status>`): the one condition for writing a task's event
/// ([`record_task_events`]), also read by a move's own statement so a batch nobody
/// listens to skips the outbox statement (PostgreSQL's batch completion).
macro_rules! task_event_listened {
    ($t:literal) => {
        concat!(
            "EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.app = ",
            $t,
            ".app AND e.enabled AND e.events LIKE '%\"task.' || ",
            $t,
            ".status || '\"%')"
        )
    };
}
pub(crate) use task_event_listened;

/// docs/webhooks.md, "The outbox": writes the events of tasks that just reached a
/// terminal status — one per task, `task.<status>`, only when an enabled endpoint of the
/// task's app subscribes to it — and their deliveries. Runs in the transaction that
/// moved the tasks, so an event exists exactly when its move committed.
pub(crate) async fn record_task_events<E: Exec + ?Sized>(
    tx: &mut E,
    ids: &[String],
    now: Timestamp,
) -> StoreResult<()> {
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        let mut s = Statement::new("").bind(now.0).bind(TERMINAL_EVENT_PREFIX);
        let set = id_set(&mut s, chunk);
        s.push(&format!(
            "INSERT INTO webhook_events \
               (id, app, type, task_id, run_id, scope, state, error_code, created_at) \
             SELECT $2 || t.id, t.app, 'task.' || t.status, t.id, t.run_id, t.scope, t.status, \
               t.error_code, $1 \
             FROM tasks t \
             WHERE t.id{set} AND t.status IN ('succeeded', 'failed', 'canceled') \
               AND {listened} \
             ON CONFLICT (id) DO NOTHING",
            listened = task_event_listened!("t"),
        ));
        if tx.run(s).await? > 0 {
            let events: Vec<String> = chunk
                .iter()
                .map(|id| tollgate_core::webhook::terminal_event_id(id))
                .collect();
            fan_out(tx, &events, now).await?;
        }
    }
    Ok(())
}

/// docs/webhooks.md, "The outbox": writes the `run.finished` event of a run that just
/// finished (succeeded, failed or canceled), and its deliveries, in the transaction that
/// finished it. A run finishes once: a second call writes nothing.
pub(crate) async fn record_run_event<E: Exec + ?Sized>(
    tx: &mut E,
    run: &str,
    now: Timestamp,
) -> StoreResult<()> {
    let kind = WebhookEventType::RunFinished.as_str();
    let written = tx
        .run(
            Statement::new(
                "INSERT INTO webhook_events \
                   (id, app, type, task_id, run_id, scope, state, error_code, created_at) \
                 SELECT $2 || r.id, r.app, $3, NULL, r.id, r.scope, r.state, r.error_code, $1 \
                 FROM runs r \
                 WHERE r.id = $4 AND r.state IN ('succeeded', 'failed', 'canceled') \
                   AND EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.app = r.app \
                     AND e.enabled AND e.events LIKE $5) \
                 ON CONFLICT (id) DO NOTHING",
            )
            .bind(now.0)
            .bind(TERMINAL_EVENT_PREFIX)
            .bind(kind)
            .bind(run)
            .bind(subscribed_pattern(kind)),
        )
        .await?;
    if written > 0 {
        fan_out(tx, &[tollgate_core::webhook::terminal_event_id(run)], now).await?;
    }
    Ok(())
}

/// One pending delivery, due now, per (event, enabled endpoint of its app subscribed to
/// its type); id `<event>.<endpoint>`, so fanning an event out again adds nothing.
async fn fan_out<E: Exec + ?Sized>(
    tx: &mut E,
    events: &[String],
    now: Timestamp,
) -> StoreResult<()> {
    let mut s = Statement::new("").bind(now.0);
    let set = id_set(&mut s, events);
    s.push(&format!(
        "INSERT INTO webhook_deliveries \
           (id, event_id, endpoint_id, app, state, attempts, next_at, created_at) \
         SELECT v.id || '.' || e.id, v.id, e.id, v.app, 'pending', 0, $1, $1 \
         FROM webhook_events v JOIN webhook_endpoints e ON e.app = v.app \
         WHERE v.id{set} AND e.enabled AND e.events LIKE '%\"' || v.type || '\"%' \
         ON CONFLICT (id) DO NOTHING"
    ));
    tx.run(s).await?;
    Ok(())
}

async fn fetch_endpoint<E: Exec + ?Sized>(
    exec: &mut E,
    app: &AppId,
    id: &str,
) -> StoreResult<Option<WebhookEndpoint>> {
    let row: Option<EndpointRow> = exec
        .optional(
            Statement::new(format!(
                "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE id = $1 AND app = $2"
            ))
            .bind(id)
            .bind(app.as_str()),
        )
        .await?;
    row.map(EndpointRow::into_endpoint).transpose()
}

pub(super) async fn fetch_delivery<E: Exec + ?Sized>(
    exec: &mut E,
    app: &AppId,
    id: &str,
) -> StoreResult<Option<WebhookDelivery>> {
    let row: Option<DeliveryRow> = exec
        .optional(
            Statement::new(format!(
                "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries d \
                 JOIN webhook_events v ON v.id = d.event_id WHERE d.id = $1 AND d.app = $2"
            ))
            .bind(id)
            .bind(app.as_str()),
        )
        .await?;
    row.map(DeliveryRow::into_delivery).transpose()
}

async fn insert_endpoint<E: Exec + ?Sized>(
    tx: &mut E,
    new: &NewWebhookEndpoint,
    now: Timestamp,
) -> StoreResult<()> {
    let events = subscription_text(&new.events).map_err(StoreError::from)?;
    tx.run(
        Statement::new(
            "INSERT INTO webhook_endpoints (id, app, url, secret, events, enabled, description, \
             from_config, created_at, updated_at, budget_thresholds) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10)",
        )
        .bind(new.id.as_str())
        .bind(new.app.as_str())
        .bind(new.url.as_str())
        .bind(new.secret.as_str())
        .bind(events)
        .bind(new.enabled)
        .bind(new.description.as_deref())
        .bind(new.from_config)
        .bind(now.0)
        .bind(budget_thresholds_text(&new.budget_thresholds)),
    )
    .await?;
    Ok(())
}

/// The stored thresholds ([`BudgetThreshold::DEFAULT`] when none are given).
fn budget_thresholds_text(thresholds: &[BudgetThreshold]) -> String {
    if thresholds.is_empty() {
        thresholds_text(&[BudgetThreshold::DEFAULT])
    } else {
        thresholds_text(thresholds)
    }
}

async fn delete_endpoint_rows<E: Exec + ?Sized>(tx: &mut E, id: &str) -> StoreResult<u64> {
    tx.run(Statement::new("DELETE FROM webhook_deliveries WHERE endpoint_id = $1").bind(id))
        .await?;
    tx.run(Statement::new("DELETE FROM webhook_endpoints WHERE id = $1").bind(id))
        .await
}

/// [`WebhookStore`](crate::WebhookStore), written once.
pub(crate) struct Webhooks;

impl Webhooks {
    pub(crate) async fn create_endpoint<B: Backend>(
        store: &B,
        new: NewWebhookEndpoint,
    ) -> StoreResult<WebhookEndpoint> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        insert_endpoint(&mut tx, &new, now).await?;
        let created = fetch_endpoint(&mut tx, &new.app, &new.id).await?;
        tx.commit_tx().await?;
        created.ok_or_else(|| StoreError::Database("inserted endpoint vanished".into()))
    }

    pub(crate) async fn list_endpoints<B: Backend>(
        store: &B,
        app: &AppId,
    ) -> StoreResult<Vec<WebhookEndpoint>> {
        let rows: Vec<EndpointRow> = store
            .reader()
            .all(
                Statement::new(format!(
                    "SELECT {ENDPOINT_COLUMNS} FROM webhook_endpoints WHERE app = $1 \
                     ORDER BY created_at, id"
                ))
                .bind(app.as_str()),
            )
            .await?;
        rows.into_iter().map(EndpointRow::into_endpoint).collect()
    }

    pub(crate) async fn get_endpoint<B: Backend>(
        store: &B,
        app: &AppId,
        id: &str,
    ) -> StoreResult<Option<WebhookEndpoint>> {
        fetch_endpoint(&mut store.reader(), app, id).await
    }

    pub(crate) async fn update_endpoint<B: Backend>(
        store: &B,
        app: &AppId,
        id: &str,
        patch: WebhookEndpointPatch,
    ) -> StoreResult<Option<WebhookEndpoint>> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let Some(current) = fetch_endpoint(&mut tx, app, id).await? else {
            tx.rollback_tx().await?;
            return Ok(None);
        };
        let events = subscription_text(patch.events.as_deref().unwrap_or(&current.events))
            .map_err(StoreError::from)?;
        tx.run(
            Statement::new(
                "UPDATE webhook_endpoints SET url = $1, secret = $2, events = $3, enabled = $4, \
                 description = $5, updated_at = $6, budget_thresholds = $9 \
                 WHERE id = $7 AND app = $8",
            )
            .bind(patch.url.unwrap_or(current.url))
            .bind(patch.secret.unwrap_or(current.secret))
            .bind(events)
            .bind(patch.enabled.unwrap_or(current.enabled))
            .bind(patch.description.unwrap_or(current.description))
            .bind(now.0)
            .bind(id)
            .bind(app.as_str())
            .bind(budget_thresholds_text(
                patch
                    .budget_thresholds
                    .as_deref()
                    .unwrap_or(&current.budget_thresholds),
            )),
        )
        .await?;
        let updated = fetch_endpoint(&mut tx, app, id).await?;
        tx.commit_tx().await?;
        Ok(updated)
    }

    pub(crate) async fn delete_endpoint<B: Backend>(
        store: &B,
        app: &AppId,
        id: &str,
    ) -> StoreResult<bool> {
        let mut tx = store.begin_tx().await?;
        if fetch_endpoint(&mut tx, app, id).await?.is_none() {
            tx.rollback_tx().await?;
            return Ok(false);
        }
        delete_endpoint_rows(&mut tx, id).await?;
        tx.commit_tx().await?;
        Ok(true)
    }

    pub(crate) async fn sync_config<B: Backend>(
        store: &B,
        endpoints: Vec<NewWebhookEndpoint>,
    ) -> StoreResult<()> {
        let mut tx = store.begin_tx().await?;
        let now = store.now_in(&mut tx).await?;
        let old: Vec<(String,)> = tx
            .all(Statement::new(
                "SELECT id FROM webhook_endpoints WHERE from_config = TRUE ORDER BY id",
            ))
            .await?;
        for (id,) in old {
            if !endpoints.iter().any(|e| e.id == id) {
                delete_endpoint_rows(&mut tx, &id).await?;
            }
        }
        for new in &endpoints {
            let events = subscription_text(&new.events).map_err(StoreError::from)?;
            let changed = tx
                .run(
                    Statement::new(
                        "UPDATE webhook_endpoints SET url = $1, secret = $2, events = $3, \
                         enabled = $4, description = $5, from_config = TRUE, updated_at = $6, \
                         budget_thresholds = $9 \
                         WHERE id = $7 AND app = $8 AND (url <> $1 OR secret <> $2 \
                         OR events <> $3 OR enabled <> $4 OR budget_thresholds <> $9 \
                         OR from_config = FALSE)",
                    )
                    .bind(new.url.as_str())
                    .bind(new.secret.as_str())
                    .bind(events)
                    .bind(new.enabled)
                    .bind(new.description.as_deref())
                    .bind(now.0)
                    .bind(new.id.as_str())
                    .bind(new.app.as_str())
                    .bind(budget_thresholds_text(&new.budget_thresholds)),
                )
                .await?;
            if changed == 0 && fetch_endpoint(&mut tx, &new.app, &new.id).await?.is_none() {
                insert_endpoint(&mut tx, new, now).await?;
            }
        }
        tx.commit_tx().await
    }
}
