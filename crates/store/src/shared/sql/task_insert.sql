-- docs/conformance.md#create-insert, both backends: a task row. A taken effect key inserts nothing and
-- returns no row.
-- {created_at} and {dispatch_key} are the creation time and the dispatch key: bound
-- (:now, :dispatch_key), or read from the statement's own clock. :released: the task is
-- released in this write (released_at = its creation time; the OpenAI door's tasks).
-- :worker: the task is created claimed by this worker (NewTask::claim_by; :status is
-- then 'running'): its first claim, at its creation time, as a claim would write it; the
-- statement around it opens the attempt. {insert_if}: the condition the row is inserted
-- on (`true`, or a guard of the statement around it).
INSERT INTO tasks (
  id, app, effect_key, kind, step, run_id, scope, subject_type, subject_id,
  source_id, source_revision, recompute, admitted,
  model_id, model_ref, model_config_hash, request, input_hash, cache_key,
  status, cached_from, output, usage, created_at, completed_at, reservation,
  priority, dispatch_key, trace_parent, max_attempts, released_at,
  worker, attempt, claimed_at, heartbeat_at
) SELECT
  :id, :app, :effect_key, :kind, :step, :run_id, :scope, :subject_type, :subject_id,
  :source_id, :source_revision, :recompute, :admitted,
  :model_id, :model_ref, :model_config_hash, :request, :input_hash, :cache_key,
  :status, :cached_from, :output, :usage, {created_at}, :completed_at, :reservation,
  :priority, {dispatch_key}, :trace_parent, :max_attempts,
  CASE WHEN :released THEN {created_at} END,
  :worker, CASE WHEN :worker IS NULL THEN 0 ELSE 1 END,
  CASE WHEN :worker IS NOT NULL THEN {created_at} END,
  CASE WHEN :worker IS NOT NULL THEN {created_at} END
WHERE {insert_if}
ON CONFLICT (app, effect_key) DO NOTHING
RETURNING {task_columns}
