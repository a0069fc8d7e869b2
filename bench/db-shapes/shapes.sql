-- The database's own ceiling for three shapes of a task's claim and completion (issue 18,
-- docs/benchmarks.md#database-ceiling). Run by run.sh on a fresh database that holds
-- Tollgate's migrations; each procedure claims `n` queued tasks with FOR UPDATE SKIP
-- LOCKED in one transaction and records their ends in a second one.

-- 400,000 queued tasks shaped like the bench's unscoped ones.
INSERT INTO tasks (id, app, effect_key, kind, step, scope, source_id, model_id, model_ref,
                   model_config_hash, request, input_hash, cache_key, status, created_at,
                   dispatch_key)
SELECT 'tsk_' || lpad(g::text, 26, '0'), 'bench', 'effect-' || g, 'generate_text', 'step',
       'default', 'src-' || (g % 1000), 'dev', 'dev/instant', md5(g::text) || md5(g::text),
       '{"kind":"generate_text","input":{"prompt":"hello world number ' || g
         || ' with a bit more text to be realistic"},"model":"dev/instant"}',
       md5((g + 1)::text) || md5(g::text), md5((g + 2)::text) || md5(g::text),
       'queued', 1000000 + g, 1000000 + g
FROM generate_series(1, 400000) g;

-- Shape A, today's: the claim and the completion both update the task row.
CREATE PROCEDURE cycle_today(w TEXT, n INT) LANGUAGE plpgsql AS $$
DECLARE ids TEXT[];
BEGIN
  WITH picked AS MATERIALIZED (SELECT id FROM tasks WHERE status = 'queued'
         ORDER BY created_at, id LIMIT n FOR UPDATE SKIP LOCKED),
       u AS (UPDATE tasks SET status = 'running', worker = w, attempt = attempt + 1,
               claimed_at = 5, heartbeat_at = 5
             FROM picked WHERE tasks.id = picked.id AND tasks.status = 'queued'
             RETURNING tasks.id)
  SELECT array_agg(id) INTO ids FROM u;
  COMMIT;
  UPDATE tasks SET status = 'succeeded', output = '{"text":"ok"}',
         usage = '{"input_tokens":3,"output_tokens":2}', completed_at = 6
   WHERE id = ANY(ids) AND status = 'running' AND worker = w;
  COMMIT;
END $$;

-- Shape A+, today's with the attempt rows a claim opens and a completion ends (the
-- attempts of docs/routes.md, "Attempts", written since issue 18 measured shape A): the
-- claim inserts one task_attempts row per task in its statement, the completion ends it.
CREATE PROCEDURE cycle_attempts(w TEXT, n INT) LANGUAGE plpgsql AS $$
DECLARE ids TEXT[];
BEGIN
  WITH picked AS MATERIALIZED (SELECT id FROM tasks WHERE status = 'queued'
         ORDER BY created_at, id LIMIT n FOR UPDATE SKIP LOCKED),
       u AS (UPDATE tasks SET status = 'running', worker = w, attempt = attempt + 1,
               claimed_at = 5, heartbeat_at = 5
             FROM picked WHERE tasks.id = picked.id AND tasks.status = 'queued'
             RETURNING tasks.id, tasks.attempt, tasks.claimed_at),
       o AS (INSERT INTO task_attempts (task_id, n, deployment, started_at, outcome,
               reserved_nano, reserved_tokens)
             SELECT id, attempt, 'dev/instant', claimed_at, 'running', 0, 0 FROM u)
  SELECT array_agg(id) INTO ids FROM u;
  COMMIT;
  WITH d AS (UPDATE tasks SET status = 'succeeded', output = '{"text":"ok"}',
               usage = '{"input_tokens":3,"output_tokens":2}', completed_at = 6
             WHERE id = ANY(ids) AND status = 'running' AND worker = w RETURNING id)
  UPDATE task_attempts SET ended_at = 6, outcome = 'succeeded',
         usage = '{"input_tokens":3,"output_tokens":2}', charged_nano = 0, charged_tokens = 0
    FROM d WHERE task_attempts.task_id = d.id AND task_attempts.ended_at IS NULL;
  COMMIT;
END $$;

-- A narrow queue table beside the task rows (shapes B and C use it).
CREATE TABLE task_queue (
    task_id      TEXT COLLATE "C" PRIMARY KEY,
    app          TEXT COLLATE "C" NOT NULL,
    scope        TEXT COLLATE "C" NOT NULL,
    dispatch_key BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    worker       TEXT COLLATE "C",
    attempt      BIGINT NOT NULL DEFAULT 0,
    claimed_at   BIGINT,
    heartbeat_at BIGINT
) WITH (fillfactor = 70);
CREATE INDEX task_queue_age ON task_queue (created_at, task_id) WHERE worker IS NULL;
CREATE INDEX task_queue_dispatch ON task_queue (app, scope, dispatch_key, task_id)
    WHERE worker IS NULL;
INSERT INTO task_queue (task_id, app, scope, dispatch_key, created_at)
    SELECT id, app, scope, dispatch_key, created_at FROM tasks;

-- A claim of the narrow rows (shapes B and C): the ids of the tasks claimed.
-- (plpgsql, as the procedures: a SQL function would plan `LIMIT n` as a tenth of the
-- table and sort all of it.)
CREATE FUNCTION claim_queue_rows(w TEXT, n INT) RETURNS TEXT[] LANGUAGE plpgsql AS $$
DECLARE ids TEXT[];
BEGIN
  WITH picked AS MATERIALIZED (SELECT task_id FROM task_queue WHERE worker IS NULL
         ORDER BY created_at, task_id LIMIT n FOR UPDATE SKIP LOCKED),
       u AS (UPDATE task_queue q SET worker = w, attempt = attempt + 1, claimed_at = 5,
               heartbeat_at = 5
             FROM picked WHERE q.task_id = picked.task_id AND q.worker IS NULL
             RETURNING q.task_id)
  SELECT array_agg(u.task_id) INTO ids FROM u;
  RETURN ids;
END $$;

-- Shape B: claims update the narrow row (and read the task rows they return); the
-- completion deletes it and writes the task row once.
CREATE PROCEDURE cycle_narrow(w TEXT, n INT) LANGUAGE plpgsql AS $$
DECLARE ids TEXT[];
BEGIN
  ids := claim_queue_rows(w, n);
  PERFORM 1 FROM tasks WHERE id = ANY(ids);
  COMMIT;
  WITH d AS (DELETE FROM task_queue WHERE task_id = ANY(ids) AND worker = w
             RETURNING task_id)
  UPDATE tasks SET status = 'succeeded', output = '{"text":"ok"}',
         usage = '{"input_tokens":3,"output_tokens":2}', completed_at = 6, attempt = 1,
         worker = w
    FROM d WHERE tasks.id = d.task_id;
  COMMIT;
END $$;

-- Shape C, a bare job queue's (graphile_worker's): claim the narrow row, delete it when
-- done; no task record is written at all.
CREATE PROCEDURE cycle_bare(w TEXT, n INT) LANGUAGE plpgsql AS $$
DECLARE ids TEXT[];
BEGIN
  ids := claim_queue_rows(w, n);
  COMMIT;
  DELETE FROM task_queue WHERE task_id = ANY(ids) AND worker = w;
  COMMIT;
END $$;
