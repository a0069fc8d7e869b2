-- docs/locking.md, "A creation in one statement": the guard before a scoped creation's
-- writes, the task's insert condition ({insert_if}), so every write (each reads the
-- task's row) waits for it. tollgate_admission_facts_hold (migration 0031) takes the
-- scope's lock (:lock_key) and answers whether the key is still free, no sighting of the
-- scope expired at :cutoff, and the scope's admission facts are the ones decided on
-- (the :seen_* values, the spend summed from :first_bucket); when not, nothing is written.
guard AS MATERIALIZED (
  SELECT tollgate_admission_facts_hold(:app, :effect_key, :scope, :lock_key, :source,
                                       :logical_key, :cutoff, :first_bucket,
                                       :seen_bucket_units::BIGINT, :seen_bucket_at::BIGINT,
                                       :seen_sources::BIGINT, :seen_active::BIGINT,
                                       :seen_token_units::BIGINT, :seen_token_at::BIGINT,
                                       :seen_seen, :seen_steps, :seen_counted,
                                       :seen_window_nano) AS held
),
