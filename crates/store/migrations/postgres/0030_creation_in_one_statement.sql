-- Issue 32: a lone creation of a task without a source under a USD or token limit (every
-- OpenAI door call under a metered policy) in ONE statement, without a transaction of
-- its own (docs/locking.md, "A creation in one statement").
--
-- Such a creation's decision is core's, on three facts of its scope: the model-token
-- bucket and the spend in the window (tollgate_creation_reads, 'cost'). The store reads
-- them without the scope's lock, core decides, and the statement that writes the task
-- and its reservation calls this function first: it takes the scope's advisory lock
-- (exclusive, held to the statement's end: its implicit transaction's), reads the facts
-- again with the same function (a fresh snapshot after the lock was granted) and
-- answers whether they are the ones decided on and the effect key is still free: the
-- statement inserts the task only if so, and every other write of it reads the task's
-- row, so otherwise nothing is written (the statement answers no row; no error, so the
-- server logs nothing) and the store creates the task as before, in a transaction
-- holding the lock from its reads to its commit. When the facts are the same, core's
-- decision on them stands, and no other creation of the scope can change them before
-- the statement commits (each takes the same lock first).
CREATE FUNCTION tollgate_cost_facts_hold(
    p_app TEXT, p_effect_key TEXT, p_scope TEXT, p_fixed_now BIGINT, p_lock BIGINT,
    p_spend_window_ms BIGINT, p_bucket_ms BIGINT, p_first_bucket BIGINT,
    p_token_units BIGINT, p_token_at BIGINT, p_window_nano BIGINT) RETURNS BOOLEAN
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r RECORD;
BEGIN
    SELECT * INTO r FROM tollgate_creation_reads(p_app, p_effect_key, p_scope, '', false,
        p_fixed_now, p_lock, true, false, 'cost', NULL, NULL, 0, p_spend_window_ms,
        p_bucket_ms);
    RETURN NOT r.taken AND r.first_bucket IS NOT DISTINCT FROM p_first_bucket
        AND r.token_units IS NOT DISTINCT FROM p_token_units
        AND r.token_at IS NOT DISTINCT FROM p_token_at
        AND r.scope_window_nano IS NOT DISTINCT FROM p_window_nano;
END
$$;
