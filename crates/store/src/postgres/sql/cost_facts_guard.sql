-- docs/locking.md, "A creation in one statement": the guard before a creation's writes.
-- tollgate_cost_facts_hold (migration 0030) takes the scope's lock (:lock_key) and fails
-- the statement unless the key is still free and the scope's cost facts are the ones
-- decided on (:seen_*, summed from :first_bucket); the creation time :now is read from
-- here by every place the task row writes it, so the guard runs first.
guard AS MATERIALIZED (
  SELECT :now::BIGINT AS now
  WHERE tollgate_cost_facts_hold(:app, :effect_key, :scope, :fixed_now::BIGINT,
                                 :lock_key, :spend_window_ms, :bucket_ms, :first_bucket,
                                 :seen_token_units::BIGINT, :seen_token_at::BIGINT,
                                 :seen_window_nano)
),
