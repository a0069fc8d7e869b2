-- Declarative pipelines over workflow runs.

-- Registered definitions, versioned by content hash; a name's latest is its newest row.
CREATE TABLE pipelines (
    app        TEXT NOT NULL,
    name       TEXT NOT NULL,
    version    TEXT NOT NULL,
    definition TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    PRIMARY KEY (app, name, version)
);
CREATE INDEX pipelines_latest ON pipelines (app, name, created_at);

-- Runs of a pipeline, and who drives each: a driver holds a run while its lease lasts,
-- so replicas never drive one run at once; `wake_at` defers a run (admission retry).
CREATE TABLE pipeline_runs (
    run_id      TEXT PRIMARY KEY,
    app         TEXT NOT NULL,
    pipeline    TEXT NOT NULL,
    version     TEXT NOT NULL,
    driver      TEXT,
    lease_until INTEGER,
    wake_at     INTEGER NOT NULL,
    done        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX pipeline_runs_due ON pipeline_runs (wake_at) WHERE done = 0;
