-- An unscoped application task (no cache, no admission: docs/conformance.md#create-idempotency, docs/conformance.md#create-insert) in ONE
-- statement, its own transaction: the lock and the clock ({app_clock}), the task row (its
-- {created_at} is that now and its {dispatch_key} that now plus :dispatch_key, the key's
-- offset from the creation time) and (docs/conformance.md#fair-share) its queue joins. No
-- row: the effect key was taken.
WITH {app_clock},
t AS ({task_insert}),
{task_queue_join}
SELECT * FROM t
