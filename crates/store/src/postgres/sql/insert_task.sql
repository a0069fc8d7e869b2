-- docs/conformance.md#create-insert without admission: the task row, and (docs/conformance.md#fair-share) its queue joins when
-- the task is queued (a batch inserts task_insert.sql alone and activates its queues at
-- its end instead).
WITH t AS ({task_insert}),
{task_queue_join}
SELECT * FROM t
