//! docs/webhooks.md, "Retention and deletion": the sweep deletes events whose deliveries
//! all ended (delivered or dead) longer than the retention ago, with their deliveries;
//! deleting an owner's tasks deletes their events and deliveries with them.

use super::{IDS_PER_STATEMENT, id_set};
use crate::StoreResult;
use crate::shared::sql::{Exec, Statement};
use tollgate_core::webhook::TERMINAL_EVENT_PREFIX;
use tollgate_core::{AppId, ScopeId, SourceId};

/// Deletes up to `batch` events created at or before `cutoff` that have no pending
/// delivery and no delivery that ended (or was created) after `cutoff`, and all their
/// deliveries; returns how many events went. Oldest first (index `webhook_events_created`).
pub(crate) async fn retain_events<E: Exec + ?Sized>(
    tx: &mut E,
    cutoff: i64,
    batch: i64,
) -> StoreResult<u64> {
    let picked: Vec<(String,)> = tx
        .all(
            Statement::new(
                "SELECT v.id FROM webhook_events v WHERE v.created_at <= $1 \
                 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries d WHERE d.event_id = v.id \
                   AND (d.state = 'pending' \
                     OR COALESCE(d.last_attempt_at, d.created_at) > $1)) \
                 ORDER BY v.created_at, v.id LIMIT $2",
            )
            .bind(cutoff)
            .bind(batch),
        )
        .await?;
    let ids: Vec<String> = picked.into_iter().map(|(id,)| id).collect();
    let mut deleted = 0;
    for chunk in ids.chunks(IDS_PER_STATEMENT) {
        deleted += forget_events(tx, chunk).await?;
    }
    Ok(deleted)
}

/// Deletes these events and every delivery of them (a replay's too); returns how many
/// events went.
async fn forget_events<E: Exec + ?Sized>(tx: &mut E, ids: &[String]) -> StoreResult<u64> {
    let mut s = Statement::new("DELETE FROM webhook_deliveries WHERE event_id");
    let set = id_set(&mut s, ids);
    s.push(&set);
    tx.run(s).await?;
    let mut s = Statement::new("DELETE FROM webhook_events WHERE id");
    let set = id_set(&mut s, ids);
    s.push(&set);
    tx.run(s).await
}

/// Deletes the events (and their deliveries) of an owner's application tasks — those
/// `delete_owner` deletes: the app's tasks of the scope without a run, of the source if
/// one is named. Runs in the deletion's transaction, before the tasks go.
pub(crate) async fn forget_owner_events<E: Exec + ?Sized>(
    tx: &mut E,
    app: &AppId,
    scope: &ScopeId,
    source: Option<&SourceId>,
) -> StoreResult<()> {
    let owned = "SELECT $4 || t.id FROM tasks t WHERE t.app = $1 AND t.scope = $2 \
                 AND t.run_id IS NULL AND ($3 IS NULL OR t.source_id = $3)";
    for (table, column) in [("webhook_deliveries", "event_id"), ("webhook_events", "id")] {
        tx.run(
            Statement::new(format!("DELETE FROM {table} WHERE {column} IN ({owned})"))
                .bind(app.as_str())
                .bind(scope.as_str())
                .bind(source.map(|s| s.as_str()))
                .bind(TERMINAL_EVENT_PREFIX),
        )
        .await?;
    }
    Ok(())
}
