-- An unscoped application task (no cache, no admission: docs/conformance.md#create-idempotency, docs/conformance.md#create-insert) in ONE
-- statement, its own transaction: the shared lock of its (app, scope) (owner deletion,
-- which takes it exclusive, cannot interleave), the database's "now" (:fixed_now when
-- the clock is fixed), the task row (its {created_at} is that now and its
-- {dispatch_key} that now plus :dispatch_key, the key's offset from the creation time)
-- and (docs/conformance.md#fair-share) its queue joins. No row: the effect key was taken.
WITH lock AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(:lock_key) AS locked),
clock AS MATERIALIZED (
  SELECT COALESCE(:fixed_now::BIGINT,
                  (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT) AS now
  FROM lock
),
t AS ({task_insert}),
{task_queue_join}
SELECT * FROM t
