-- docs/conformance.md#create-insert for an admitted task, in one statement: the task row, its queue's join
-- (docs/conformance.md#dispatch), the admission's writes, and on the fast path (:fast) its global slot
-- from one stripe's allowance. Every write after the task's reads from the one before,
-- so nothing is written when the effect key was taken (no row in t), and the rows lock
-- in the lock order: scope row, scope bucket, app bucket, the app's share, the global
-- slot stripe. (Without that chain a statement could take its slot stripe before its
-- app bucket while another held the app bucket and waited for the stripe: a deadlock
-- under load.)
-- {guard}: nothing, or (a creation in one statement, docs/locking.md) the guard CTE
-- `guard` that takes the scope's lock and checks the facts decided on, read by the
-- task's {insert_if} so it runs before any write; {took} then fails the statement when
-- the fast path found no slot (tollgate_slot_taken, migration 0031).
WITH {guard}t AS ({task_insert}),
-- The queue's row stays locked to the commit (ON CONFLICT locks it even when nothing
-- changes), so a claim that finds the queue empty cannot deactivate it before this task
-- is visible.
{task_queue_join},
-- docs/conformance.md#admission, docs/conformance.md#cost-limits: the scope's row — its task bucket, distinct sources (relative: whoever
-- prunes an expired sighting subtracts it, once), active tasks, and its model-token
-- bucket (NULL: kept as it is).
st AS (
  INSERT INTO scope_state (app, scope, bucket_units, bucket_at, sources_in_window, active,
                           token_units, token_at, token_capacity)
  SELECT :app, :scope, :bucket_units, :bucket_at, GREATEST(:sources_delta, 0), 1,
         :token_units, :token_at, :token_capacity
  FROM t
  ON CONFLICT (app, scope) DO UPDATE SET
    bucket_units = EXCLUDED.bucket_units,
    bucket_at = EXCLUDED.bucket_at,
    sources_in_window = scope_state.sources_in_window + :sources_delta,
    active = scope_state.active + 1,
    token_units = COALESCE(EXCLUDED.token_units, scope_state.token_units),
    token_at = COALESCE(EXCLUDED.token_at, scope_state.token_at),
    token_capacity = COALESCE(EXCLUDED.token_capacity, scope_state.token_capacity)
  RETURNING 1
),
-- The source's sighting.
ss AS (
  INSERT INTO scope_sources (app, scope, source_id, last_admitted_at)
  SELECT :app, :scope, :source, :now FROM t
  ON CONFLICT (app, scope, source_id) DO UPDATE SET
    last_admitted_at = GREATEST(scope_sources.last_admitted_at, EXCLUDED.last_admitted_at)
),
-- The admission record.
rec AS (
  INSERT INTO admissions (app, scope, source_id, task_id, logical_key, admitted_at)
  SELECT :app, :scope, :source, :id, :logical_key, :now FROM t
),
-- docs/conformance.md#cost-reservation: the reservation, in the scope's and the app's spend bucket (sp, ap).
{spend_add},
-- The fast path: the app's share of the global capacity (:share, 0: none; :no_share:
-- the app has none, so it only counts), then a slot of this stripe's allowance. The
-- app's count is the sum of its rows (migration 0026): an app with a share takes an own
-- slot on its stripe 0, under that row's lock, while that row and its other stripes
-- (read in the statement's snapshot: only admissions without a share write them, and
-- those check no share either) hold fewer than its share; an app without one counts on
-- :app_stripe (1–15), first clearing a share it had (so a share removed takes effect
-- at its next admission, and rows lock in stripe order).
unshare AS (
  UPDATE app_slots SET share = 0
  WHERE :fast AND :no_share AND app = :app AND share <> 0 AND EXISTS (SELECT 1 FROM ap)
  RETURNING 1
),
own AS (
  INSERT INTO app_slots (app, stripe, active, share)
  SELECT :app, CASE WHEN :no_share THEN :app_stripe ELSE 0 END, 1, :share
  FROM ap WHERE :fast AND (:no_share OR :share > 0)
    AND (SELECT COUNT(*) FROM unshare) >= 0
  ON CONFLICT (app, stripe) DO UPDATE SET active = app_slots.active + 1,
    share = EXCLUDED.share
  WHERE :no_share OR app_slots.active + (SELECT COALESCE(SUM(o.active), 0) FROM app_slots o
    WHERE o.app = :app AND o.stripe <> 0) < EXCLUDED.share
  RETURNING 1
),
slot AS (
  UPDATE global_slots SET admitted = admitted + 1
  WHERE :fast AND stripe = :slot_stripe AND admitted < capacity AND cap_for = :cap
    AND EXISTS (SELECT 1 FROM own)
  RETURNING admitted
)
SELECT t.*, {took} AS took FROM t
