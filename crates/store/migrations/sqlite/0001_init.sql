-- Tollgate schema, SQLite backend. Timestamps are milliseconds since the Unix epoch.

CREATE TABLE runs (
    id               TEXT PRIMARY KEY,
    app              TEXT NOT NULL,
    scope            TEXT NOT NULL,
    subject_type     TEXT,
    subject_id       TEXT,
    state            TEXT NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    input            TEXT NOT NULL,
    output           TEXT,
    error_code       TEXT,
    error_message    TEXT,
    waiting_on       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    woken_at         INTEGER
);
-- Wake and lost-wake repair (SPEC §6.4) look only at waiting runs.
CREATE INDEX runs_waiting ON runs (waiting_on) WHERE state = 'waiting';

CREATE TABLE tasks (
    id                TEXT PRIMARY KEY,
    app               TEXT NOT NULL,
    effect_key        TEXT NOT NULL,
    kind              TEXT NOT NULL,
    step              TEXT NOT NULL,
    run_id            TEXT,
    scope             TEXT NOT NULL,
    subject_type      TEXT,
    subject_id        TEXT,
    source_id         TEXT,
    source_revision   TEXT,
    recompute         INTEGER NOT NULL DEFAULT 0,
    -- 1 when admission counted the task (scoped and not served from the cache).
    admitted          INTEGER NOT NULL DEFAULT 0,
    model_id          TEXT NOT NULL,
    model_ref         TEXT NOT NULL,
    model_config_hash TEXT NOT NULL,
    request           TEXT NOT NULL,
    input_hash        TEXT NOT NULL,
    cache_key         TEXT,
    status            TEXT NOT NULL,
    cancel_requested  INTEGER NOT NULL DEFAULT 0,
    cached_from       TEXT,
    output            TEXT,
    usage             TEXT,
    error_code        TEXT,
    error_message     TEXT,
    attempt           INTEGER NOT NULL DEFAULT 0,
    worker            TEXT,
    created_at        INTEGER NOT NULL,
    claimed_at        INTEGER,
    heartbeat_at      INTEGER,
    completed_at      INTEGER,
    released_at       INTEGER,
    -- SPEC §12: effect keys are unique per app.
    UNIQUE (app, effect_key)
);
-- Claim (oldest first) and queue-timeout sweep.
CREATE INDEX tasks_queued_age ON tasks (created_at, id) WHERE status = 'queued';
-- Recovery pages (keyset on id).
CREATE INDEX tasks_queued_id ON tasks (id) WHERE status = 'queued';
-- Liveness sweep.
CREATE INDEX tasks_running_heartbeat ON tasks (heartbeat_at) WHERE status = 'running';
-- Cache lookup, newest success first.
CREATE INDEX tasks_cache ON tasks (app, scope, cache_key, completed_at)
    WHERE status = 'succeeded' AND cache_key IS NOT NULL;
-- A run's tasks (cancel cascade).
CREATE INDEX tasks_run ON tasks (run_id) WHERE run_id IS NOT NULL;
-- Unreleased application sources (keyset pages) and owner deletion.
CREATE INDEX tasks_app_owned ON tasks (app, scope, source_id, step) WHERE run_id IS NULL;
CREATE INDEX tasks_unreleased ON tasks (app, scope, source_id, step)
    WHERE run_id IS NULL AND released_at IS NULL AND source_id IS NOT NULL;
-- Retention of released application tasks.
CREATE INDEX tasks_retention ON tasks (released_at)
    WHERE run_id IS NULL AND released_at IS NOT NULL;

-- SPEC §4: one record per admitted task. Never deleted by owner deletion; pruned after 24 h.
CREATE TABLE admissions (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    app         TEXT NOT NULL,
    scope       TEXT NOT NULL,
    source_id   TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    logical_key TEXT,
    admitted_at INTEGER NOT NULL
);
-- Steps of one source in the window: bounded by that source's own records.
CREATE INDEX admissions_source ON admissions (app, scope, source_id, admitted_at);
CREATE INDEX admissions_task ON admissions (task_id);
CREATE INDEX admissions_age ON admissions (admitted_at);

-- What admission keeps per scope so one admission is O(1) in the window's size:
-- the token bucket, the number of distinct sources seen in the window, and the number of
-- admitted tasks still queued or running.
CREATE TABLE scope_state (
    app               TEXT NOT NULL,
    scope             TEXT NOT NULL,
    bucket_units      INTEGER NOT NULL,
    bucket_at         INTEGER NOT NULL,
    sources_in_window INTEGER NOT NULL DEFAULT 0,
    active            INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app, scope)
);

-- Global concurrency = admitted - SUM(finished): admissions count up one row, and tasks
-- leaving queued/running count up one of 64 stripes, so finishing never contends with
-- admitting (the PostgreSQL backend relies on this; SQLite keeps the same shape).
CREATE TABLE global_admission (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    admitted INTEGER NOT NULL
);
INSERT INTO global_admission (id, admitted) VALUES (1, 0);
CREATE TABLE global_finished (
    stripe   INTEGER PRIMARY KEY,
    finished INTEGER NOT NULL
);
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 63)
INSERT INTO global_finished (stripe, finished) SELECT i, 0 FROM n;

-- Distinct sources of a scope with their latest admission; rows leave once it is 24 h old.
CREATE TABLE scope_sources (
    app              TEXT NOT NULL,
    scope            TEXT NOT NULL,
    source_id        TEXT NOT NULL,
    last_admitted_at INTEGER NOT NULL,
    PRIMARY KEY (app, scope, source_id)
);
CREATE INDEX scope_sources_scope_age ON scope_sources (app, scope, last_admitted_at);
CREATE INDEX scope_sources_age ON scope_sources (last_admitted_at);
