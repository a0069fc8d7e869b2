-- Issue 32: fewer index entries for every task write. Retention deletes released
-- application tasks once they have finished (completed_at set, a terminal status), so
-- its index lists finished tasks only. A task released in the write that creates it (the
-- OpenAI door's) wrote an entry at its creation and again at its claim (each a new row
-- version); now it writes one, when it finishes. The sweep's statement names every term
-- of the predicate, so it still walks this index.
DROP INDEX IF EXISTS tasks_retention;
CREATE INDEX tasks_retention ON tasks (released_at)
    WHERE run_id IS NULL AND released_at IS NOT NULL AND completed_at IS NOT NULL;
