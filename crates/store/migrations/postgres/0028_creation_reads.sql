-- Issue 32: what a creation reads before it writes, in one round trip
-- (docs/conformance.md#create-transaction, docs/locking.md, "A creation's reads").
--
-- Before this function a creation under admission or a cost check read in three round
-- trips: the early replay check, the scope's advisory lock with the probe (taken effect
-- key, cache hit, the clock), then the admission or cost facts in a statement of their
-- own. The facts needed their own statement
-- because a statement's snapshot predates a lock it waits for inside it: facts read there
-- could miss an admission of the same scope that committed while this one waited. A
-- VOLATILE function takes a fresh snapshot for each statement it runs, so here the
-- statements after the lock see every admission committed before it was granted.
--
-- The decision stays core's: this function only reads (and prunes the scope's expired
-- sightings, as the facts statement did).

-- An app's admitted tasks and share, summed over its stripes (migration 0026): read by the
-- admission facts below and by the global cap's rebalancing.
CREATE VIEW app_slot_counts AS
    SELECT app, SUM(active) AS active, MAX(share) AS share FROM app_slots GROUP BY app;

-- p_replay_first: the effect key is looked up before the lock is waited for (a replay
--   never waits for the scope's admissions); when taken, only `taken`, `early` (no lock
--   was taken) and the clock are answered.
-- p_lock: the scope's advisory lock key, taken exclusively (p_exclusive) or shared; NULL
--   when the caller already holds it (a run's task: its lock comes before its run row).
-- p_fixed_now: the test clock (NULL: the database's clock, as every statement's now_sql!).
-- p_facts: which facts to read: 'admission' (a scoped task's: docs/conformance.md#admission
--   and the scope's part of docs/conformance.md#money-and-tokens), 'cost' (a task without
--   a source under a USD or token limit: the scope's token bucket and spend window) or
--   NULL (none). Read only when the key is not taken and no cache hit was found.
-- p_source, p_logical_key: the source and logical step to admit ('admission').
-- p_admission_window_ms, p_spend_window_ms, p_bucket_ms: core's admission window, spend
--   window and spend bucket width; the caller checks `first_bucket` against core's
--   window_first_bucket(now).
CREATE FUNCTION tollgate_creation_reads(
    p_app TEXT, p_effect_key TEXT, p_scope TEXT, p_cache_key TEXT, p_probe_cache BOOLEAN,
    p_fixed_now BIGINT, p_lock BIGINT, p_exclusive BOOLEAN, p_replay_first BOOLEAN,
    p_facts TEXT, p_source TEXT, p_logical_key TEXT, p_admission_window_ms BIGINT,
    p_spend_window_ms BIGINT, p_bucket_ms BIGINT,
    OUT taken BOOLEAN, OUT hit_id TEXT, OUT hit_output TEXT, OUT hit_charged_nano BIGINT,
    OUT now BIGINT, OUT early BOOLEAN, OUT facts_read BOOLEAN, OUT first_bucket BIGINT, OUT pruned BIGINT,
    OUT bucket_units BIGINT, OUT bucket_at BIGINT, OUT sources_in_window BIGINT,
    OUT active BIGINT, OUT token_units BIGINT, OUT token_at BIGINT, OUT seen BOOLEAN,
    OUT steps BIGINT, OUT counted BOOLEAN, OUT global_active BIGINT,
    OUT scope_window_nano BIGINT, OUT app_active BIGINT, OUT borrowed BIGINT)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_cutoff BIGINT;
BEGIN
    facts_read := false;
    early := false;
    IF p_replay_first AND EXISTS (
        SELECT 1 FROM tasks WHERE app = p_app AND effect_key = p_effect_key
    ) THEN
        -- Answered before the lock: the caller reads the task, and if it went meanwhile
        -- (owner deletion), asks again without this check.
        early := true;
        taken := true;
        now := COALESCE(p_fixed_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT);
        RETURN;
    END IF;
    IF p_lock IS NOT NULL THEN
        IF p_exclusive THEN
            PERFORM pg_advisory_xact_lock(p_lock);
        ELSE
            PERFORM pg_advisory_xact_lock_shared(p_lock);
        END IF;
    END IF;
    -- Everything below reads in snapshots taken after the lock was granted. The clock as
    -- now_sql! reads it (crates/store/src/postgres/mod.rs).
    now := COALESCE(p_fixed_now, (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT);
    SELECT EXISTS (SELECT 1 FROM tasks k WHERE k.app = p_app AND k.effect_key = p_effect_key),
        h.id, h.output, h.charged_nano
    INTO taken, hit_id, hit_output, hit_charged_nano
    FROM (SELECT 1) AS one LEFT JOIN LATERAL (
        SELECT c.id, c.output, c.charged_nano FROM tasks c
        WHERE p_probe_cache AND c.app = p_app AND c.scope = p_scope
          AND c.cache_key = p_cache_key AND c.status = 'succeeded'
        ORDER BY c.completed_at DESC, c.id DESC LIMIT 1) AS h ON true;
    IF p_facts IS NULL OR taken OR hit_id IS NOT NULL THEN
        RETURN;
    END IF;
    -- Floor division in integers (core's div_euclid), exact for any sign.
    first_bucket := ((now - p_spend_window_ms)
        - (((now - p_spend_window_ms) % p_bucket_ms) + p_bucket_ms) % p_bucket_ms)
        / p_bucket_ms;
    facts_read := true;
    IF p_facts = 'cost' THEN
        -- docs/budgets.md, "Tasks without a source": the cost checks' facts only.
        SELECT s.token_units, s.token_at,
            (SELECT COALESCE(SUM(sp.reserved_nano + sp.settled_nano), 0)::BIGINT
             FROM scope_spend sp
             WHERE sp.app = p_app AND sp.scope = p_scope AND sp.bucket >= first_bucket)
        INTO token_units, token_at, scope_window_nano
        FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = p_app AND s.scope = p_scope;
        RETURN;
    END IF;
    -- docs/conformance.md#admission, docs/conformance.md#money-and-tokens: the facts core
    -- decides on. The prune and the read are one statement: the read sees the sightings
    -- as they were before the prune, and counts only those newer than the cutoff anyway.
    v_cutoff := now - p_admission_window_ms;
    WITH pruned_rows AS (
        DELETE FROM scope_sources
        WHERE app = p_app AND scope = p_scope AND last_admitted_at <= v_cutoff RETURNING 1
    )
    SELECT (SELECT COUNT(*) FROM pruned_rows)::BIGINT,
        s.bucket_units, s.bucket_at, s.sources_in_window, s.active, s.token_units, s.token_at,
        EXISTS (SELECT 1 FROM scope_sources ss WHERE ss.app = p_app AND ss.scope = p_scope
                AND ss.source_id = p_source AND ss.last_admitted_at > v_cutoff),
        (SELECT COUNT(DISTINCT a.logical_key) FROM admissions a WHERE a.app = p_app
                AND a.scope = p_scope AND a.source_id = p_source AND a.admitted_at > v_cutoff
                AND a.logical_key IS NOT NULL),
        EXISTS (SELECT 1 FROM admissions a WHERE a.app = p_app AND a.scope = p_scope
                AND a.source_id = p_source AND a.admitted_at > v_cutoff
                AND a.logical_key = p_logical_key),
        (SELECT COALESCE(SUM(g.admitted), 0)::BIGINT FROM global_slots g)
          - (SELECT COALESCE(SUM(f.finished), 0)::BIGINT FROM global_finished f),
        (SELECT COALESCE(SUM(sp.reserved_nano + sp.settled_nano), 0)::BIGINT FROM scope_spend sp
                WHERE sp.app = p_app AND sp.scope = p_scope AND sp.bucket >= first_bucket),
        (SELECT COALESCE(SUM(o.active), 0)::BIGINT FROM app_slots o WHERE o.app = p_app),
        (SELECT COALESCE(SUM(GREATEST(c.active - c.share, 0)), 0)::BIGINT
                FROM app_slot_counts c)
    INTO pruned, bucket_units, bucket_at, sources_in_window, active, token_units, token_at,
        seen, steps, counted, global_active, scope_window_nano, app_active, borrowed
    FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = p_app AND s.scope = p_scope;
END
$$;
