-- Issue 32: a lone creation of a task without a source under a USD or token limit (every
-- OpenAI door call under a metered policy) in ONE statement, without a transaction of
-- its own (docs/locking.md, "A creation in one statement").
--
-- Such a creation's decision is core's, on three facts of its scope: the model-token
-- bucket and the spend in the window (tollgate_cost_facts). The store reads them without
-- the scope's lock, in a plain statement, core decides, and the statement that writes
-- the task and its reservation inserts the task only when tollgate_cost_facts_hold says
-- so: it takes the scope's advisory lock (exclusive, held to the statement's end: its
-- implicit transaction's), then reads the facts again in a snapshot taken after the lock
-- was granted, and answers whether they are the ones decided on and the effect key is
-- still free. Every other write of that statement reads the task's row, so otherwise
-- nothing is written (no error: the server logs nothing), and the store creates the
-- task as before, in a transaction holding the lock from its reads to its commit. When
-- the facts are the same, core's decision on them stands, and no other creation of the
-- scope can change them before the statement commits (each takes the same lock first).
--
-- The facts and the window's first bucket are written once, as the SQL functions below
-- (inlined by the planner where they are called): tollgate_creation_reads (migration
-- 0028, replaced here with the same signature) uses them too.

-- The first spend bucket of the window ending at p_now: floor division in integers
-- (core's div_euclid, exact for any sign); callers check it against core's
-- window_first_bucket.
CREATE FUNCTION tollgate_first_bucket(p_now BIGINT, p_spend_window_ms BIGINT,
    p_bucket_ms BIGINT) RETURNS BIGINT
LANGUAGE sql IMMUTABLE AS $$
    SELECT ((p_now - p_spend_window_ms)
        - (((p_now - p_spend_window_ms) % p_bucket_ms) + p_bucket_ms) % p_bucket_ms)
        / p_bucket_ms
$$;

-- docs/budgets.md, "Tasks without a source": the cost checks' facts of a scope, one row
-- (NULL token bucket: never used): its model-token bucket and its settled + reserved
-- nano-dollars in the window's buckets from p_first_bucket.
CREATE FUNCTION tollgate_cost_facts(p_app TEXT, p_scope TEXT, p_first_bucket BIGINT)
RETURNS TABLE (token_units BIGINT, token_at BIGINT, scope_window_nano BIGINT)
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT s.token_units, s.token_at,
        (SELECT COALESCE(SUM(sp.reserved_nano + sp.settled_nano), 0)::BIGINT
         FROM scope_spend sp
         WHERE sp.app = p_app AND sp.scope = p_scope AND sp.bucket >= p_first_bucket)
    FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = p_app AND s.scope = p_scope
$$;

-- The guard of a creation in one statement (see above): p_lock is the scope's advisory
-- lock key; p_first_bucket, p_token_units, p_token_at, p_window_nano the facts decided on.
CREATE FUNCTION tollgate_cost_facts_hold(
    p_app TEXT, p_effect_key TEXT, p_scope TEXT, p_lock BIGINT, p_first_bucket BIGINT,
    p_token_units BIGINT, p_token_at BIGINT, p_window_nano BIGINT) RETURNS BOOLEAN
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_held BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock);
    -- A statement of its own: its snapshot is taken after the lock was granted.
    SELECT NOT EXISTS (SELECT 1 FROM tasks WHERE app = p_app AND effect_key = p_effect_key)
        AND f.token_units IS NOT DISTINCT FROM p_token_units
        AND f.token_at IS NOT DISTINCT FROM p_token_at
        AND f.scope_window_nano = p_window_nano
    INTO v_held
    FROM tollgate_cost_facts(p_app, p_scope, p_first_bucket) AS f;
    RETURN COALESCE(v_held, false);
END
$$;

-- tollgate_creation_reads as in migration 0028, its first bucket and cost facts from the
-- functions above.
CREATE OR REPLACE FUNCTION tollgate_creation_reads(
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
    first_bucket := tollgate_first_bucket(now, p_spend_window_ms, p_bucket_ms);
    facts_read := true;
    IF p_facts = 'cost' THEN
        -- docs/budgets.md, "Tasks without a source": the cost checks' facts only.
        SELECT f.token_units, f.token_at, f.scope_window_nano
        INTO token_units, token_at, scope_window_nano
        FROM tollgate_cost_facts(p_app, p_scope, first_bucket) AS f;
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
        (SELECT f.scope_window_nano FROM tollgate_cost_facts(p_app, p_scope, first_bucket) AS f),
        (SELECT COALESCE(SUM(o.active), 0)::BIGINT FROM app_slots o WHERE o.app = p_app),
        (SELECT COALESCE(SUM(GREATEST(c.active - c.share, 0)), 0)::BIGINT
                FROM app_slot_counts c)
    INTO pruned, bucket_units, bucket_at, sources_in_window, active, token_units, token_at,
        seen, steps, counted, global_active, scope_window_nano, app_active, borrowed
    FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = p_app AND s.scope = p_scope;
END
$$;
