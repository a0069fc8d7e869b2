-- docs/conformance.md#create-cache: a cache hit of an application's scoped task in ONE
-- statement of its own (docs/locking.md, "A creation in one statement"): the shared lock
-- of its (app, scope) (owner deletion, which takes it exclusive, cannot interleave; held
-- to the statement's end), the task row (created succeeded, the hit's output copied) and
-- (docs/conformance.md#cost-cache-hits) its saving added to the scope's and the app's
-- spend bucket when it saved anything. {insert_if}: after the lock, and only when no
-- enabled endpoint of the app listens for `task.succeeded` (the outbox's event is
-- written by the transaction path). No row: the effect key was taken or an endpoint
-- listens, and nothing was written.
WITH lock AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(:lock_key) AS locked),
t AS ({task_insert}),
{spend_add}
SELECT * FROM t
