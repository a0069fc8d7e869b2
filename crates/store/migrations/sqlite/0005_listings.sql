-- SPEC §15 listings: every list query of the API reads one of these (newest first,
-- keyset on (created_at, id)), never a whole table.
CREATE INDEX tasks_app_created ON tasks (app, created_at, id);
CREATE INDEX tasks_app_scope_created ON tasks (app, scope, created_at, id);
CREATE INDEX tasks_app_status_created ON tasks (app, status, created_at, id);
CREATE INDEX tasks_app_step_created ON tasks (app, step, created_at, id);
CREATE INDEX tasks_app_kind_created ON tasks (app, kind, created_at, id);
CREATE INDEX tasks_app_source_created ON tasks (app, source_id, created_at, id)
    WHERE source_id IS NOT NULL;
-- Stats: tasks that finished in the last hour.
CREATE INDEX tasks_app_completed ON tasks (app, completed_at) WHERE completed_at IS NOT NULL;
CREATE INDEX runs_app_created ON runs (app, created_at, id);
CREATE INDEX runs_app_scope_created ON runs (app, scope, created_at, id);
CREATE INDEX runs_app_state_created ON runs (app, state, created_at, id);
CREATE INDEX pipeline_runs_app_pipeline ON pipeline_runs (app, pipeline, run_id);
