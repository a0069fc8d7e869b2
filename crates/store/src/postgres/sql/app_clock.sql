-- The first CTEs of an application task's creation in ONE statement of its own
-- (insert_app_task.sql, reserve_app_task.sql): the shared lock of its (app, scope)
-- (owner deletion, which takes it exclusive, cannot interleave; held to the statement's
-- end) and, after it, the database's "now" (:fixed_now when the clock is fixed).
lock AS MATERIALIZED (SELECT pg_advisory_xact_lock_shared(:lock_key) AS locked),
clock AS MATERIALIZED (
  SELECT COALESCE(:fixed_now::BIGINT,
                  (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT) AS now
  FROM lock
)
