-- The stream log (docs/api.md, "Streaming a task"; docs/engine.md, "Live streams across
-- replicas"): the live output of running tasks, so a reader in another process on the same
-- database follows a task this one executes. Each row is one flush of one execution's
-- pieces (a few coalesced every ~25 ms), numbered within the execution's claim (`claim` is
-- the task's `attempt` at that claim). The pieces are a JSON array of delta/restart
-- events; `answered` marks the execution's last row when it produced the task's output.
-- Rows go with their task (owner deletion, retention: the trigger) and are swept shortly
-- after it ends. Same shape as the PostgreSQL migration of the same number.
CREATE TABLE stream_chunks (
    task_id    TEXT NOT NULL,
    app        TEXT NOT NULL,
    claim      INTEGER NOT NULL,
    seq        INTEGER NOT NULL,
    events     TEXT NOT NULL,
    answered   INTEGER NOT NULL DEFAULT 0,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (task_id, claim, seq)
) WITHOUT ROWID;

-- A task's rows go with it (retention, owner deletion).
CREATE TRIGGER stream_chunks_follow_tasks AFTER DELETE ON tasks
BEGIN
    DELETE FROM stream_chunks WHERE task_id = OLD.id;
END;
