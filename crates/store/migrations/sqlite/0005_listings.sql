-- SPEC §15 listings: every list query of the API reads one of these (newest first,
-- keyset on (created_at, id)), never a whole table. Every index here is written by
-- every task insert unless its predicate leaves new tasks out, and admission inserts a
-- task, so the set is the smallest that keeps each listing bounded: the app's and the
-- scope's newest-first orders (kind and step filters walk them), a source's tasks, and
-- the statuses other than `succeeded` (few beside the successes; a `succeeded` filter
-- walks the newest-first order, where successes are dense).
CREATE INDEX tasks_app_created ON tasks (app, created_at, id);
CREATE INDEX tasks_app_scope_created ON tasks (app, scope, created_at, id);
CREATE INDEX tasks_app_source_created ON tasks (app, source_id, created_at, id)
    WHERE source_id IS NOT NULL;
CREATE INDEX tasks_app_unsucceeded ON tasks (app, status, created_at, id)
    WHERE status <> 'succeeded';
-- Stats: tasks that finished in the last hour (written when a task ends, not at insert).
CREATE INDEX tasks_app_completed ON tasks (app, completed_at) WHERE completed_at IS NOT NULL;
CREATE INDEX runs_app_created ON runs (app, created_at, id);
CREATE INDEX runs_app_scope_created ON runs (app, scope, created_at, id);
CREATE INDEX runs_app_state_created ON runs (app, state, created_at, id);
CREATE INDEX pipeline_runs_app_pipeline ON pipeline_runs (app, pipeline, run_id);
