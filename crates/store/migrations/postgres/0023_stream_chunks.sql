-- The stream log (docs/api.md, "Streaming a task"; docs/engine.md, "Live streams across
-- replicas"): the live output of running tasks, so a reader on any replica follows a task
-- another replica executes. Each row is one flush of one execution's pieces (a few
-- coalesced every ~25 ms), numbered within the execution's claim (`claim` is the task's
-- `attempt` at that claim). The pieces are a JSON array of delta/restart events; `answered`
-- marks the execution's last row when it produced the task's output.
--
-- Rows go with their task (owner deletion, retention: the foreign key) and are swept
-- shortly after it ends (readers of an ended task read its stored output). UNLOGGED: the
-- log is a view of work in flight, worth no write-ahead log; a database crash empties it
-- and readers then get each task's whole answer at its end, as a reader of a provider
-- that does not stream does. Same shape as the SQLite migration of the same number.
CREATE UNLOGGED TABLE stream_chunks (
    task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    app        TEXT COLLATE "C" NOT NULL,
    claim      BIGINT NOT NULL,
    seq        BIGINT NOT NULL,
    events     TEXT COLLATE "C" NOT NULL,
    answered   BOOLEAN NOT NULL DEFAULT FALSE,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (task_id, claim, seq)
);
