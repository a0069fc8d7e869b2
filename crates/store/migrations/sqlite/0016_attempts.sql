-- Attempts (docs/routes.md, "Attempts"): a task makes attempts, each one deployment's
-- provider call with its re-asks. `max_attempts` is stored at submit; existing tasks
-- keep today's at-most-once behaviour (1). Same shape as the PostgreSQL migration of
-- the same number.
ALTER TABLE tasks ADD COLUMN max_attempts INTEGER NOT NULL DEFAULT 1;

-- One row per attempt. `reserved_*` is what the attempt reserved (the first attempt:
-- the admission's reservation; each re-ask and later attempt: what it reserved before
-- its call); `charged_*` is what it is charged once ended (its usage priced, or its
-- reservation when its usage is unknown). At most one row per task has no `ended_at`.
CREATE TABLE task_attempts (
    task_id         TEXT NOT NULL,
    n               INTEGER NOT NULL,
    deployment      TEXT NOT NULL,
    started_at      INTEGER NOT NULL,
    ended_at        INTEGER,
    outcome         TEXT NOT NULL,
    usage           TEXT,
    reserved_nano   INTEGER NOT NULL,
    reserved_tokens INTEGER NOT NULL,
    charged_nano    INTEGER,
    charged_tokens  INTEGER,
    error_code      TEXT,
    error_message   TEXT,
    PRIMARY KEY (task_id, n)
);

-- A task's attempts go with it (retention, owner deletion).
CREATE TRIGGER task_attempts_follow_tasks AFTER DELETE ON tasks
BEGIN
    DELETE FROM task_attempts WHERE task_id = OLD.id;
END;
