//! docs/conformance.md#workflow-runs on SQLite ([`RunStore`](crate::RunStore)): the transactions are written once in
//! `shared::runs`; `BEGIN IMMEDIATE` holds every row, so no row lock is taken, and the
//! cancel cascade is one plain update.

use super::SqliteStore;
use crate::shared::runs::{RunStatements, run_store_for};

impl RunStatements for SqliteStore {
    const LOCK_RUN: Option<&'static str> = None;
    const HOLD_TASK: Option<&'static str> = None;
    const CANCEL_RUN_TASKS: &'static str = "UPDATE tasks SET cancel_requested = 1, \
         status = 'canceled', error_code = $1, error_message = 'run canceled by request', \
         completed_at = $2 WHERE run_id = $3 AND status IN ('queued', 'running') \
         RETURNING id, app, scope, admitted, reservation IS NOT NULL AS reserved";
}

run_store_for!(SqliteStore);
crate::shared::webhooks::webhook_store_for!(SqliteStore);

// Creation reads a run's owner through it (`admission`).
pub(super) use crate::shared::runs::fetch_run;
