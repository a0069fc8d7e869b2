-- docs/budgets.md, "Tasks without a source", on SQLite: the reservation of a task
-- without a source in the spend buckets, and the scope's model-token bucket taken
-- (:token_units NULL: no token rate). The scope's row may not exist yet: a task bucket
-- never used is full (:bucket_units at :bucket_at).
{spend_upserts};
INSERT INTO scope_state (app, scope, bucket_units, bucket_at,
                         token_units, token_at, token_capacity)
SELECT :app, :scope, :bucket_units, :bucket_at, :token_units, :token_at, :token_capacity
WHERE :token_units IS NOT NULL
ON CONFLICT (app, scope) DO UPDATE SET
  token_units = excluded.token_units,
  token_at = excluded.token_at,
  token_capacity = excluded.token_capacity
