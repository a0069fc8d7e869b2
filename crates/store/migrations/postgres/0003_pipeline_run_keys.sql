-- A pipeline run may be started under a key (the HTTP Idempotency-Key): one run per key
-- and app, so a client retrying a start gets the run it started.
ALTER TABLE pipeline_runs ADD COLUMN start_key TEXT COLLATE "C";
CREATE UNIQUE INDEX pipeline_runs_start_key ON pipeline_runs (app, start_key)
    WHERE start_key IS NOT NULL;
