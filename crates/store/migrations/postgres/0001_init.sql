-- Tollgate schema, PostgreSQL backend (same shape as the SQLite one). Text sorts bytewise
-- (COLLATE "C") so keyset pages order exactly as on SQLite. Timestamps are milliseconds since the Unix epoch.

CREATE TABLE runs (
    id               TEXT COLLATE "C" PRIMARY KEY,
    app              TEXT COLLATE "C" NOT NULL,
    scope            TEXT COLLATE "C" NOT NULL,
    subject_type     TEXT COLLATE "C",
    subject_id       TEXT COLLATE "C",
    state            TEXT COLLATE "C" NOT NULL,
    cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    input            TEXT COLLATE "C" NOT NULL,
    output           TEXT COLLATE "C",
    error_code       TEXT COLLATE "C",
    error_message    TEXT COLLATE "C",
    waiting_on       TEXT COLLATE "C",
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    woken_at         BIGINT
);
-- Wake and lost-wake repair (SPEC §6.4) look only at waiting runs.
CREATE INDEX runs_waiting ON runs (waiting_on) WHERE state = 'waiting';

CREATE TABLE tasks (
    id                TEXT COLLATE "C" PRIMARY KEY,
    app               TEXT COLLATE "C" NOT NULL,
    effect_key        TEXT COLLATE "C" NOT NULL,
    kind              TEXT COLLATE "C" NOT NULL,
    step              TEXT COLLATE "C" NOT NULL,
    run_id            TEXT COLLATE "C",
    scope             TEXT COLLATE "C" NOT NULL,
    subject_type      TEXT COLLATE "C",
    subject_id        TEXT COLLATE "C",
    source_id         TEXT COLLATE "C",
    source_revision   TEXT COLLATE "C",
    recompute         BOOLEAN NOT NULL DEFAULT FALSE,
    -- TRUE when admission counted the task (scoped and not served from the cache).
    admitted          BOOLEAN NOT NULL DEFAULT FALSE,
    model_id          TEXT COLLATE "C" NOT NULL,
    model_ref         TEXT COLLATE "C" NOT NULL,
    model_config_hash TEXT COLLATE "C" NOT NULL,
    request           TEXT COLLATE "C" NOT NULL,
    input_hash        TEXT COLLATE "C" NOT NULL,
    cache_key         TEXT COLLATE "C",
    status            TEXT COLLATE "C" NOT NULL,
    cancel_requested  BOOLEAN NOT NULL DEFAULT FALSE,
    cached_from       TEXT COLLATE "C",
    output            TEXT COLLATE "C",
    usage             TEXT COLLATE "C",
    error_code        TEXT COLLATE "C",
    error_message     TEXT COLLATE "C",
    attempt           BIGINT NOT NULL DEFAULT 0,
    worker            TEXT COLLATE "C",
    created_at        BIGINT NOT NULL,
    claimed_at        BIGINT,
    heartbeat_at      BIGINT,
    completed_at      BIGINT,
    released_at       BIGINT,
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
    id          BIGSERIAL PRIMARY KEY,
    app         TEXT COLLATE "C" NOT NULL,
    scope       TEXT COLLATE "C" NOT NULL,
    source_id   TEXT COLLATE "C" NOT NULL,
    task_id     TEXT COLLATE "C" NOT NULL,
    logical_key TEXT COLLATE "C",
    admitted_at BIGINT NOT NULL
);
-- Steps of one source in the window: bounded by that source's own records.
CREATE INDEX admissions_source ON admissions (app, scope, source_id, admitted_at);
CREATE INDEX admissions_task ON admissions (task_id);
CREATE INDEX admissions_age ON admissions (admitted_at);

-- What admission keeps per scope so one admission is O(1) in the window's size:
-- the token bucket, the number of distinct sources seen in the window, and the number of
-- admitted tasks still queued or running.
CREATE TABLE scope_state (
    app               TEXT COLLATE "C" NOT NULL,
    scope             TEXT COLLATE "C" NOT NULL,
    bucket_units      BIGINT NOT NULL,
    bucket_at         BIGINT NOT NULL,
    sources_in_window BIGINT NOT NULL DEFAULT 0,
    active            BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (app, scope)
);

-- Global concurrency = admitted - SUM(finished): admissions count up one row, and tasks
-- leaving queued/running count up one of 64 stripes, so finishing never contends with
-- admitting (the PostgreSQL backend relies on this; SQLite keeps the same shape).
CREATE TABLE global_admission (
    id       BIGINT PRIMARY KEY CHECK (id = 1),
    admitted BIGINT NOT NULL
);
INSERT INTO global_admission (id, admitted) VALUES (1, 0);
CREATE TABLE global_finished (
    stripe   BIGINT PRIMARY KEY,
    finished BIGINT NOT NULL
);
INSERT INTO global_finished (stripe, finished) SELECT i, 0 FROM generate_series(0, 63) AS i;

-- Distinct sources of a scope with their latest admission; rows leave once it is 24 h old.
CREATE TABLE scope_sources (
    app              TEXT COLLATE "C" NOT NULL,
    scope            TEXT COLLATE "C" NOT NULL,
    source_id        TEXT COLLATE "C" NOT NULL,
    last_admitted_at BIGINT NOT NULL,
    PRIMARY KEY (app, scope, source_id)
);
CREATE INDEX scope_sources_scope_age ON scope_sources (app, scope, last_admitted_at);
CREATE INDEX scope_sources_age ON scope_sources (last_admitted_at);
