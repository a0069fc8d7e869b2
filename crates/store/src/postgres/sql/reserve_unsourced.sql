-- docs/budgets.md, "Tasks without a source": after its task row, the reservation of a
-- task without a source that can cost money — the scope's model-token bucket taken
-- (:token_units NULL: no token rate; a new scope row starts with a full task bucket,
-- :bucket_units at :bucket_at, as one never admitted into), the reservation added to
-- the scope's and the app's spend bucket — in the lock order (scope row, scope bucket,
-- app bucket).
WITH st AS (
  INSERT INTO scope_state (app, scope, bucket_units, bucket_at,
                           token_units, token_at, token_capacity)
  SELECT :app, :scope, :bucket_units, :bucket_at, :token_units, :token_at, :token_capacity
  WHERE :token_units::BIGINT IS NOT NULL
  ON CONFLICT (app, scope) DO UPDATE SET
    token_units = EXCLUDED.token_units,
    token_at = EXCLUDED.token_at,
    token_capacity = EXCLUDED.token_capacity
  RETURNING 1
),
{spend_add}
SELECT 1
