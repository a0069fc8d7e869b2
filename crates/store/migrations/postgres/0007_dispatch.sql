-- SPEC §14 dispatch: fair share across (app, scope), priority with ageing, provider pace.

-- A task's priority (0–9, higher first) and its static within-scope start order:
-- created_at − (priority − 5) × ageing step (tollgate_core::dispatch_key).
ALTER TABLE tasks ADD COLUMN priority BIGINT NOT NULL DEFAULT 5;
ALTER TABLE tasks ADD COLUMN dispatch_key BIGINT NOT NULL DEFAULT 0;
UPDATE tasks SET dispatch_key = created_at WHERE status = 'queued';
-- A scope's queued tasks in start order: a fair claim reads the head of each queue here.
CREATE INDEX tasks_queued_dispatch ON tasks (app, scope, dispatch_key, id)
    WHERE status = 'queued';

-- One row per (app, scope) that ever had a queued task. `pass` is the queue's virtual
-- time (stride scheduling: claiming n tasks adds n × 1,000,000 / weight); `active` is
-- TRUE while it may have queued tasks. Creations set it (and lock the row to their
-- commit); a claim that finds the queue empty clears it under the row lock after a
-- fresh look, so a queue with a queued task is never left inactive.
CREATE TABLE dispatch_queues (
    app    TEXT COLLATE "C" NOT NULL,
    scope  TEXT COLLATE "C" NOT NULL,
    weight BIGINT NOT NULL,
    pass   BIGINT NOT NULL,
    active BOOLEAN NOT NULL,
    PRIMARY KEY (app, scope)
);
-- Claims take the active queues with the least virtual time.
CREATE INDEX dispatch_queues_active ON dispatch_queues (pass, app, scope) WHERE active;
-- A queue joining when none is active starts at the largest virtual time of all.
CREATE INDEX dispatch_queues_pass ON dispatch_queues (pass);
INSERT INTO dispatch_queues (app, scope, weight, pass, active)
    SELECT DISTINCT app, scope, 1, 0, TRUE FROM tasks WHERE status = 'queued';

-- Provider pace shared by every replica (times in microseconds since the epoch): the
-- theoretical arrival times of the request and token schedules (GCRA without burst: a
-- call may start at max(request_tat, token_tat, paused_until, now)), and a pause set by
-- a 429 with Retry-After.
CREATE TABLE provider_pace (
    pace_key     TEXT COLLATE "C" PRIMARY KEY,
    request_tat  BIGINT NOT NULL DEFAULT 0,
    token_tat    BIGINT NOT NULL DEFAULT 0,
    paused_until BIGINT NOT NULL DEFAULT 0
);
