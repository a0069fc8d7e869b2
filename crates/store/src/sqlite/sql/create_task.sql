-- docs/conformance.md#create-insert on SQLite, in one query (one hop to the connection's thread): the task
-- row first (shared/sql/task_insert.sql, the only statement that returns a row), then
-- what follows it. The write lock is held and step 2 found the effect key free in this
-- transaction, so the insert cannot conflict (if it somehow did, it returns no row and
-- the caller fails and rolls back) — but for an unscoped task with nothing to check,
-- whose key is not looked up first: a taken key inserts nothing, and the statements
-- after the insert write only for the row it inserted (:id is new), so none writes.
{task_insert};
-- docs/conformance.md#cost-cache-hits: a cache hit's saving (:saved_nano) in the spend buckets of now
-- (a hit was looked up: its key was free).
{spend_upserts};
-- docs/engine.md, "Tasks claimed at creation": a task created claimed (its insert
-- wrote it running) has its first attempt opened, as a claim's are.
{open_claimed} WHERE id = :id AND :status = 'running';
-- docs/conformance.md#fair-share: a queued task's queue joins.
WITH join_params AS (
  SELECT :app AS app, :scope AS scope, :weight AS weight, :credit AS credit,
         :stride AS stride
  WHERE :status = 'queued' AND EXISTS (SELECT 1 FROM tasks WHERE id = :id)
)
{queue_join};
-- docs/conformance.md#admission: an admitted task's admission record (:source, NULL: not admitted).
INSERT INTO admissions (app, scope, source_id, task_id, logical_key, admitted_at)
SELECT :app, :scope, :source, :id, :logical_key, :now
WHERE :source IS NOT NULL AND EXISTS (SELECT 1 FROM tasks WHERE id = :id)
