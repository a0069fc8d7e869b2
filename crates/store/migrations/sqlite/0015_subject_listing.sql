-- A subject's tasks, newest first (docs/api.md, "Subjects"): a key bound to a subject
-- lists through this index, so its pages — and the cursors they hand out — only ever
-- touch that subject's rows. Partial: tasks without a subject do not pay for it.
CREATE INDEX tasks_app_subject_created ON tasks (app, subject_type, subject_id, created_at, id)
    WHERE subject_id IS NOT NULL;
