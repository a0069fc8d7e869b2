-- After the task insert `t` of the statement around it. docs/conformance.md#fair-share: a
-- queued task's (app, scope) queue joins (shared/sql/queue_join.sql), its weight
-- :weight, joining credit :credit and stride :stride. A task created claimed
-- (docs/engine.md, "Tasks claimed at creation") joins no queue: its first attempt
-- opens, as a claim's would ({task_opened}).
join_params AS (
  SELECT t.app, t.scope, :weight::BIGINT AS weight, :credit::BIGINT AS credit,
         :stride::BIGINT AS stride
  FROM t WHERE t.status = 'queued'
),
dq AS ({queue_join}),
opened AS ({task_opened} RETURNING 1)
