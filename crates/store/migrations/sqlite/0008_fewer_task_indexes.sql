-- Issue 18: fewer index entries for every task write (the same set as PostgreSQL's).
--
-- Recovery asks for the oldest queued task only (first_queued): tasks_queued_age serves it.
DROP INDEX IF EXISTS tasks_queued_id;
-- Owner deletion walks the scope's tasks (tasks_app_scope_created) or the source's
-- (tasks_app_source_created); nothing else read this one.
DROP INDEX IF EXISTS tasks_app_owned;
-- The liveness sweep's index is keyed on the claim time, which a heartbeat does not
-- change, so a heartbeat writes no index. A task's last heartbeat is never before its
-- claim, so the sweep's bound on heartbeat_at bounds claimed_at too.
DROP INDEX IF EXISTS tasks_running_heartbeat;
CREATE INDEX tasks_running_claimed ON tasks (claimed_at) WHERE status = 'running';
