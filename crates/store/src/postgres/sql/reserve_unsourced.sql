-- docs/budgets.md, "Tasks without a source": a task without a source that can cost money
-- in ONE statement — its task row, its queue's join (docs/conformance.md#fair-share), and
-- its reservation: the scope's model-token bucket taken (:token_units NULL: no token
-- rate; a new scope row starts with a full task bucket, :bucket_units at :bucket_at, as
-- one never admitted into), the reservation added to the scope's and the app's spend
-- bucket. Every write after the task's reads from the one before, so nothing is reserved
-- when the effect key was taken (no row in t), and the rows lock in the lock order: task,
-- scope row, scope bucket, app bucket. One statement, so the scope's lock is held for one
-- round trip less than a separate insert and reservation took.
-- {guard}: nothing, or (a creation in one statement, docs/locking.md) the guard CTE
-- `guard` that takes the scope's lock and checks the facts decided on, read by the
-- task's {created_at} so it runs before any write.
WITH {guard}t AS ({task_insert}),
{task_queue_join},
st AS (
  INSERT INTO scope_state (app, scope, bucket_units, bucket_at,
                           token_units, token_at, token_capacity)
  SELECT :app, :scope, :bucket_units, :bucket_at, :token_units, :token_at, :token_capacity
  FROM t
  WHERE :token_units::BIGINT IS NOT NULL
  ON CONFLICT (app, scope) DO UPDATE SET
    token_units = EXCLUDED.token_units,
    token_at = EXCLUDED.token_at,
    token_capacity = EXCLUDED.token_capacity
  RETURNING 1
),
{spend_add}
SELECT * FROM t
