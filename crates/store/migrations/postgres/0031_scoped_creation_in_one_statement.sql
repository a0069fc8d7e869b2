-- Issue 32: a lone creation of a scoped application task — its admission, or its cache
-- hit — in ONE statement after one plain read, without a transaction of its own
-- (docs/locking.md, "A creation in one statement"), as migration 0030 made it for a task
-- without a source under a USD or token limit.
--
-- The admission's facts are read without the scope's lock (tollgate_admission_facts),
-- core decides, and the statement that writes the task and the admission's rows
-- inserts the task only when tollgate_admission_facts_hold says so: it takes the scope's
-- advisory lock (exclusive, held to the statement's end), reads the facts of the scope
-- again in a snapshot taken after the lock was granted, and answers whether they are
-- the ones decided on, no sighting of the scope has expired (the locked path prunes
-- those), and the effect key is still free. The service-wide facts (active admitted
-- tasks, the app's count, what apps borrow) are not compared: as on the locked path,
-- whose scope lock does not cover them either, the global slot's conditional increment
-- at the statement's end enforces them; when that increment finds no allowance the
-- statement fails (tollgate_slot_taken: SQLSTATE TG001) and writes nothing, and the
-- store admits the task as before, in a transaction that can rebalance the stripes.
--
-- The facts and the cache probe are written once, below; tollgate_creation_reads
-- (migration 0030, replaced here with the same signature) reads them through the same
-- functions.

-- docs/conformance.md#admission, docs/conformance.md#money-and-tokens: the facts core decides a scoped task's
-- admission on, one row: p_cutoff is "now" minus the admission window, p_first_bucket
-- the spend window's first bucket. `expired`: the scope's sightings at or before the
-- cutoff (the locked path prunes them and counts them out of sources_in_window).
CREATE FUNCTION tollgate_admission_facts(p_app TEXT, p_scope TEXT, p_source TEXT,
    p_logical_key TEXT, p_cutoff BIGINT, p_first_bucket BIGINT)
RETURNS TABLE (expired BIGINT, bucket_units BIGINT, bucket_at BIGINT,
    sources_in_window BIGINT, active BIGINT, token_units BIGINT, token_at BIGINT,
    seen BOOLEAN, steps BIGINT, counted BOOLEAN, global_active BIGINT,
    scope_window_nano BIGINT, app_active BIGINT, borrowed BIGINT)
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT
        (SELECT COUNT(*) FROM scope_sources x WHERE x.app = p_app AND x.scope = p_scope
                AND x.last_admitted_at <= p_cutoff)::BIGINT,
        s.bucket_units, s.bucket_at, s.sources_in_window, s.active, s.token_units, s.token_at,
        EXISTS (SELECT 1 FROM scope_sources ss WHERE ss.app = p_app AND ss.scope = p_scope
                AND ss.source_id = p_source AND ss.last_admitted_at > p_cutoff),
        (SELECT COUNT(DISTINCT a.logical_key) FROM admissions a WHERE a.app = p_app
                AND a.scope = p_scope AND a.source_id = p_source AND a.admitted_at > p_cutoff
                AND a.logical_key IS NOT NULL),
        EXISTS (SELECT 1 FROM admissions a WHERE a.app = p_app AND a.scope = p_scope
                AND a.source_id = p_source AND a.admitted_at > p_cutoff
                AND a.logical_key = p_logical_key),
        (SELECT COALESCE(SUM(g.admitted), 0)::BIGINT FROM global_slots g)
          - (SELECT COALESCE(SUM(f.finished), 0)::BIGINT FROM global_finished f),
        (SELECT f.scope_window_nano FROM tollgate_cost_facts(p_app, p_scope, p_first_bucket) AS f),
        (SELECT COALESCE(SUM(o.active), 0)::BIGINT FROM app_slots o WHERE o.app = p_app),
        (SELECT COALESCE(SUM(GREATEST(c.active - c.share, 0)), 0)::BIGINT
                FROM app_slot_counts c)
    FROM (SELECT 1) AS one LEFT JOIN scope_state s ON s.app = p_app AND s.scope = p_scope
$$;

-- docs/conformance.md#create-cache: the newest success of a cache key in an (app, scope),
-- at most one row (its id, output and charge): the hit a creation copies.
CREATE FUNCTION tollgate_newest_success(p_app TEXT, p_scope TEXT, p_cache_key TEXT)
RETURNS TABLE (id TEXT, output TEXT, charged_nano BIGINT)
LANGUAGE sql STABLE ROWS 1 AS $$
    SELECT c.id, c.output, c.charged_nano FROM tasks c
    WHERE c.app = p_app AND c.scope = p_scope AND c.cache_key = p_cache_key
      AND c.status = 'succeeded'
    ORDER BY c.completed_at DESC, c.id DESC LIMIT 1
$$;

-- The guard of a scoped creation in one statement (see above): p_lock is the scope's
-- advisory lock key; the p_seen_* arguments the scope's facts decided on.
CREATE FUNCTION tollgate_admission_facts_hold(
    p_app TEXT, p_effect_key TEXT, p_scope TEXT, p_lock BIGINT, p_source TEXT,
    p_logical_key TEXT, p_cutoff BIGINT, p_first_bucket BIGINT,
    p_seen_bucket_units BIGINT, p_seen_bucket_at BIGINT, p_seen_sources BIGINT,
    p_seen_active BIGINT, p_seen_token_units BIGINT, p_seen_token_at BIGINT,
    p_seen_seen BOOLEAN, p_seen_steps BIGINT, p_seen_counted BOOLEAN,
    p_seen_window_nano BIGINT) RETURNS BOOLEAN
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_held BOOLEAN;
BEGIN
    PERFORM pg_advisory_xact_lock(p_lock);
    -- A statement of its own: its snapshot is taken after the lock was granted.
    SELECT NOT EXISTS (SELECT 1 FROM tasks WHERE app = p_app AND effect_key = p_effect_key)
        AND f.expired = 0
        AND f.bucket_units IS NOT DISTINCT FROM p_seen_bucket_units
        AND f.bucket_at IS NOT DISTINCT FROM p_seen_bucket_at
        AND f.sources_in_window IS NOT DISTINCT FROM p_seen_sources
        AND f.active IS NOT DISTINCT FROM p_seen_active
        AND f.token_units IS NOT DISTINCT FROM p_seen_token_units
        AND f.token_at IS NOT DISTINCT FROM p_seen_token_at
        AND f.seen = p_seen_seen
        AND f.steps = p_seen_steps
        AND f.counted = p_seen_counted
        AND f.scope_window_nano = p_seen_window_nano
    INTO v_held
    FROM tollgate_admission_facts(p_app, p_scope, p_source, p_logical_key, p_cutoff,
                                  p_first_bucket) AS f;
    RETURN COALESCE(v_held, false);
END
$$;

-- The global slot of an admission in one statement: its count when the conditional
-- increment took one; otherwise the statement fails (nothing it wrote stays), with
-- SQLSTATE TG001, which the store answers by admitting the task in a transaction.
CREATE FUNCTION tollgate_slot_taken(p_took BIGINT) RETURNS BIGINT
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_took IS NULL THEN
        RAISE EXCEPTION 'no global slot allowance on the fast path'
            USING ERRCODE = 'TG001';
    END IF;
    RETURN p_took;
END
$$;

-- tollgate_creation_reads as in migration 0030, its cache probe from
-- tollgate_newest_success and its admission facts from tollgate_admission_facts (the
-- prune and the read still one statement: the read sees the sightings as they were
-- before the prune, and counts only those newer than the cutoff anyway).
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
        SELECT n.id, n.output, n.charged_nano
        FROM tollgate_newest_success(p_app, p_scope, p_cache_key) AS n
        WHERE p_probe_cache) AS h ON true;
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
    v_cutoff := now - p_admission_window_ms;
    WITH pruned_rows AS (
        DELETE FROM scope_sources
        WHERE app = p_app AND scope = p_scope AND last_admitted_at <= v_cutoff RETURNING 1
    )
    SELECT (SELECT COUNT(*) FROM pruned_rows)::BIGINT,
        f.bucket_units, f.bucket_at, f.sources_in_window, f.active, f.token_units, f.token_at,
        f.seen, f.steps, f.counted, f.global_active, f.scope_window_nano, f.app_active,
        f.borrowed
    INTO pruned, bucket_units, bucket_at, sources_in_window, active, token_units, token_at,
        seen, steps, counted, global_active, scope_window_nano, app_active, borrowed
    FROM tollgate_admission_facts(p_app, p_scope, p_source, p_logical_key, v_cutoff,
                                  first_bucket) AS f;
END
$$;

-- The cache probe's index: tollgate_newest_success reads one entry, in its order
-- (completed_at, then id), among the key's successes only. tasks_cache (migration 0001)
-- held every task of a key, in completed_at order only, so the probe read and sorted
-- every success of its key (each hit is one more) to take the newest. Tasks that are not
-- succeeded are no longer in it. Built in the migration's transaction: on a large
-- `tasks` table the upgrade holds task writes for as long as the build takes (run
-- `tollgate migrate` before the new replicas start).
CREATE INDEX tasks_newest_success ON tasks (app, scope, cache_key, completed_at, id)
    WHERE status = 'succeeded';
DROP INDEX tasks_cache;
