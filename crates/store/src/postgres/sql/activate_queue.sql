-- docs/conformance.md#fair-share for a batch of creations: one queue of the batch joins, as a creation's
-- would (the batch runs this once per queue, in the order it names them).
WITH join_params AS (
  SELECT :app::TEXT AS app, :scope::TEXT AS scope, :weight::BIGINT AS weight,
         :credit::BIGINT AS credit, :stride::BIGINT AS stride
)
{queue_join}
