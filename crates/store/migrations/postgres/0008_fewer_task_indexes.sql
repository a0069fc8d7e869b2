-- Issue 18: fewer index entries for every task write. Every claim and completion is a
-- non-HOT update of the task row (its status is in index keys and predicates), so it
-- writes an entry into every index whose predicate holds; every creation writes one into
-- each index that takes new tasks.
--
-- Recovery asks for the oldest queued task only (first_queued): tasks_queued_age serves it.
DROP INDEX IF EXISTS tasks_queued_id;
-- Owner deletion walks the scope's tasks (tasks_app_scope_created) or the source's
-- (tasks_app_source_created); nothing else read this one.
DROP INDEX IF EXISTS tasks_app_owned;
-- The liveness sweep's index is keyed on the claim time, which a heartbeat does not
-- change: a heartbeat then changes no indexed column, so PostgreSQL can update the row
-- in place (a HOT update, no index entry at all). A task's last heartbeat is never
-- before its claim, so the sweep's bound on heartbeat_at bounds claimed_at too.
DROP INDEX IF EXISTS tasks_running_heartbeat;
--
-- Its predicate also asks for claimed_at IS NOT NULL (always true of a running task), which
-- only a query bounding claimed_at implies (the sweep's). So statements that find running
-- tasks by id (heartbeats, completions, failures) cannot walk this index: on PostgreSQL,
-- with statistics taken while no task ran, the planner believed it held one row and
-- joined every running task to every id (11 s for a heartbeat of 2,500 of 10,000
-- running tasks, instead of 0.1–0.4 s by the primary key).
CREATE INDEX tasks_running_claimed ON tasks (claimed_at)
    WHERE status = 'running' AND claimed_at IS NOT NULL;
