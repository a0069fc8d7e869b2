-- docs/locking.md, "A creation in one statement": the guard before a creation's writes,
-- the task's insert condition ({insert_if}), so every write (each reads the task's row)
-- waits for it. tollgate_cost_facts_hold (migration 0030) takes the scope's lock
-- (:lock_key) and answers whether the key is still free and the scope's cost facts are
-- the ones decided on (:seen_token_units, :seen_token_at, :seen_window_nano, summed from
-- :first_bucket); when not, nothing is written.
guard AS MATERIALIZED (
  SELECT tollgate_cost_facts_hold(:app, :effect_key, :scope, :lock_key, :first_bucket,
                                  :seen_token_units::BIGINT, :seen_token_at::BIGINT,
                                  :seen_window_nano) AS held
),
