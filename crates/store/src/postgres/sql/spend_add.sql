-- docs/conformance.md#cost-limits: a delta added to the scope's spend bucket, then to the app's (one stripe of
-- it), in the lock order (scope bucket, then app bucket), as two CTEs of the statement
-- around it; {after} is what the scope bucket's upsert reads from (the scope row's CTE,
-- so the rows lock in order, or one row), {bucket} the bucket (hour number): bound
-- (:bucket), or the statement's own clock's.
sp AS (
  INSERT INTO scope_spend (app, scope, bucket, reserved_nano, reserved_tokens, saved_nano)
  SELECT :app, :scope, {bucket}, :reserved_nano, :reserved_tokens, :saved_nano
  FROM {after}
  ON CONFLICT (app, scope, bucket) DO UPDATE SET
    reserved_nano = scope_spend.reserved_nano + EXCLUDED.reserved_nano,
    reserved_tokens = scope_spend.reserved_tokens + EXCLUDED.reserved_tokens,
    saved_nano = scope_spend.saved_nano + EXCLUDED.saved_nano
  RETURNING 1
),
ap AS (
  INSERT INTO app_spend (app, bucket, stripe, reserved_nano, reserved_tokens, saved_nano)
  SELECT :app, {bucket}, :stripe, :reserved_nano, :reserved_tokens, :saved_nano
  FROM sp
  ON CONFLICT (app, bucket, stripe) DO UPDATE SET
    reserved_nano = app_spend.reserved_nano + EXCLUDED.reserved_nano,
    reserved_tokens = app_spend.reserved_tokens + EXCLUDED.reserved_tokens,
    saved_nano = app_spend.saved_nano + EXCLUDED.saved_nano
  RETURNING 1
)
