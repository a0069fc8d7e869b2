-- The embeddings item cache (docs/api.md, "Embeddings"): one vector per (app, scope,
-- item key), the key hashing the text, its source and revision, the dimension, the
-- deployment's configuration and the subject. Each entry belongs to the task that
-- computed it and goes with it (retention, owner deletion). Same shape as the SQLite
-- migration of the same number.
CREATE TABLE embed_cache (
    app        TEXT COLLATE "C" NOT NULL,
    scope      TEXT COLLATE "C" NOT NULL,
    item_key   TEXT COLLATE "C" NOT NULL,
    task_id    TEXT COLLATE "C" NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    -- The vector as a JSON array of numbers.
    vector     TEXT COLLATE "C" NOT NULL,
    tokens     BIGINT NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (app, scope, item_key)
);
CREATE INDEX embed_cache_task ON embed_cache (task_id);
