-- SPEC §14 dispatch: fair share across (app, scope), priority with ageing, provider pace.
-- Same shape as the PostgreSQL migration of the same number.

ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 5;
ALTER TABLE tasks ADD COLUMN dispatch_key INTEGER NOT NULL DEFAULT 0;
UPDATE tasks SET dispatch_key = created_at WHERE status = 'queued';
CREATE INDEX tasks_queued_dispatch ON tasks (app, scope, dispatch_key, id)
    WHERE status = 'queued';

CREATE TABLE dispatch_queues (
    app    TEXT NOT NULL,
    scope  TEXT NOT NULL,
    weight INTEGER NOT NULL,
    pass   INTEGER NOT NULL,
    active INTEGER NOT NULL,
    PRIMARY KEY (app, scope)
);
CREATE INDEX dispatch_queues_active ON dispatch_queues (pass, app, scope) WHERE active;
CREATE INDEX dispatch_queues_pass ON dispatch_queues (pass);
INSERT INTO dispatch_queues (app, scope, weight, pass, active)
    SELECT DISTINCT app, scope, 1, 0, 1 FROM tasks WHERE status = 'queued';

CREATE TABLE provider_pace (
    pace_key     TEXT PRIMARY KEY,
    request_tat  INTEGER NOT NULL DEFAULT 0,
    token_tat    INTEGER NOT NULL DEFAULT 0,
    paused_until INTEGER NOT NULL DEFAULT 0
);
