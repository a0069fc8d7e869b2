-- docs/conformance.md#fair-share after the task insert `t` of the statement around it: a queued task's
-- (app, scope) queue joins (shared/sql/queue_join.sql), its weight :weight, joining
-- credit :credit and stride :stride.
join_params AS (
  SELECT t.app, t.scope, :weight::BIGINT AS weight, :credit::BIGINT AS credit,
         :stride::BIGINT AS stride
  FROM t WHERE t.status = 'queued'
),
dq AS ({queue_join})
