-- The embeddings item cache (docs/api.md, "Embeddings"): one vector per (app, scope,
-- item key), the key hashing the text, its source and revision, the dimension, the
-- deployment's configuration and the subject. Each entry belongs to the task that
-- computed it and goes with it (retention, owner deletion). Same shape as the
-- PostgreSQL migration of the same number.
CREATE TABLE embed_cache (
    app        TEXT NOT NULL,
    scope      TEXT NOT NULL,
    item_key   TEXT NOT NULL,
    task_id    TEXT NOT NULL,
    -- The vector as a JSON array of numbers.
    vector     TEXT NOT NULL,
    tokens     INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (app, scope, item_key)
);
CREATE INDEX embed_cache_task ON embed_cache (task_id);

-- An entry goes with the task that computed it (retention, owner deletion).
CREATE TRIGGER embed_cache_follows_tasks AFTER DELETE ON tasks
BEGIN
    DELETE FROM embed_cache WHERE task_id = OLD.id;
END;
