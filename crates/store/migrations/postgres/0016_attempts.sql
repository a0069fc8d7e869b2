-- Attempts (docs/routes.md, "Attempts"): a task makes attempts, each one deployment's
-- provider call with its re-asks. `max_attempts` is stored at submit; existing tasks
-- keep today's at-most-once behaviour (1). Same shape as the SQLite migration of the
-- same number.
ALTER TABLE tasks ADD COLUMN max_attempts BIGINT NOT NULL DEFAULT 1;

-- One row per attempt. `reserved_*` is what the attempt reserved (the first attempt:
-- the admission's reservation; each re-ask and later attempt: what it reserved before
-- its call); `charged_*` is what it is charged once ended (its usage priced, or its
-- reservation when its usage is unknown). At most one row per task has no `ended_at`.
-- A task's attempts go with it (retention, owner deletion).
CREATE TABLE task_attempts (
    task_id         TEXT COLLATE "C" NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    n               BIGINT NOT NULL,
    deployment      TEXT NOT NULL,
    started_at      BIGINT NOT NULL,
    ended_at        BIGINT,
    outcome         TEXT NOT NULL,
    usage           TEXT,
    reserved_nano   BIGINT NOT NULL,
    reserved_tokens BIGINT NOT NULL,
    charged_nano    BIGINT,
    charged_tokens  BIGINT,
    error_code      TEXT,
    error_message   TEXT,
    PRIMARY KEY (task_id, n)
);
