-- docs/budgets.md, "Tasks without a source": an application's task without a source that
-- can cost money but is under no USD or token limit (its reservation only recorded,
-- nothing to decide) in ONE statement, its own transaction: insert_app_task.sql's, and
-- its reservation added to the scope's and the app's spend bucket of the statement's
-- "now" (tollgate_first_bucket over no window: core's spend_bucket, :bucket_ms its width),
-- each write reading the task's row, so nothing is recorded when the effect key was taken.
WITH {app_clock},
spend_at AS MATERIALIZED (
  SELECT tollgate_first_bucket(now, 0, :bucket_ms) AS bucket FROM clock
),
t AS ({task_insert}),
{task_queue_join},
{spend_add}
SELECT * FROM t
