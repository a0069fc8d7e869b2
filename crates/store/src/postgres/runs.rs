//! docs/conformance.md#workflow-runs on PostgreSQL ([`RunStore`](crate::RunStore)): the transactions are written
//! once in `shared::runs`; here are PostgreSQL's row locks and its cancel cascade. Lock
//! order: the run's row first, then its tasks (see the module docs of `postgres`).

use super::PostgresStore;
use crate::shared::runs::{RunStatements, run_store_for};

impl RunStatements for PostgresStore {
    const LOCK_RUN: Option<&'static str> =
        Some("SELECT 1 FROM runs WHERE id = $1 AND app = $2 FOR NO KEY UPDATE");
    // FOR SHARE: the task cannot become terminal between the check and the wait.
    const HOLD_TASK: Option<&'static str> = Some("SELECT 1 FROM tasks WHERE id = $1 FOR SHARE");
    // The run's tasks locked in id order (the lock order for several task rows).
    const CANCEL_RUN_TASKS: &'static str = "WITH picked AS MATERIALIZED (SELECT id FROM tasks \
         WHERE run_id = $3 AND status IN ('queued', 'running') ORDER BY id FOR NO KEY UPDATE) \
         UPDATE tasks SET cancel_requested = TRUE, status = 'canceled', error_code = $1, \
         error_message = 'run canceled by request', completed_at = $2 FROM picked \
         WHERE tasks.id = picked.id AND tasks.status IN ('queued', 'running') \
         RETURNING tasks.id, tasks.app, tasks.scope, tasks.admitted, \
         tasks.reservation IS NOT NULL AS reserved";
}

run_store_for!(PostgresStore);
crate::shared::webhooks::webhook_store_for!(PostgresStore);
