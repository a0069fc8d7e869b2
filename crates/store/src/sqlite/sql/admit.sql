-- docs/conformance.md#admission, docs/conformance.md#money-and-tokens on SQLite: every write of an admission but its record (inserted with
-- the task), in one query: the reservation in the spend buckets, the scope's counters
-- (its task bucket, distinct sources, relative: whoever prunes an expired sighting
-- subtracts it, once; active tasks; its model-token bucket, NULL: kept), the source's
-- sighting, the app's share of the global capacity and the global count.
{spend_upserts};
INSERT INTO scope_state (app, scope, bucket_units, bucket_at, sources_in_window, active,
                         token_units, token_at, token_capacity)
VALUES (:app, :scope, :bucket_units, :bucket_at, MAX(:sources_delta, 0), 1,
        :token_units, :token_at, :token_capacity)
ON CONFLICT (app, scope) DO UPDATE SET
  bucket_units = excluded.bucket_units,
  bucket_at = excluded.bucket_at,
  sources_in_window = scope_state.sources_in_window + :sources_delta,
  active = scope_state.active + 1,
  token_units = COALESCE(excluded.token_units, scope_state.token_units),
  token_at = COALESCE(excluded.token_at, scope_state.token_at),
  token_capacity = COALESCE(excluded.token_capacity, scope_state.token_capacity);
INSERT INTO scope_sources (app, scope, source_id, last_admitted_at)
VALUES (:app, :scope, :source, :now)
ON CONFLICT (app, scope, source_id) DO UPDATE SET
  last_admitted_at = MAX(last_admitted_at, excluded.last_admitted_at);
INSERT INTO app_slots (app, active, share) VALUES (:app, 1, :share)
ON CONFLICT (app) DO UPDATE SET active = app_slots.active + 1, share = excluded.share;
UPDATE global_admission SET admitted = admitted + 1 WHERE id = 1
