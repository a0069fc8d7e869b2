-- Declarative pipelines over workflow runs.

-- Registered definitions, versioned by content hash; a name's latest is its newest row.
CREATE TABLE pipelines (
    app        TEXT COLLATE "C" NOT NULL,
    name       TEXT COLLATE "C" NOT NULL,
    version    TEXT COLLATE "C" NOT NULL,
    definition TEXT COLLATE "C" NOT NULL,
    created_at BIGINT NOT NULL,
    PRIMARY KEY (app, name, version)
);
CREATE INDEX pipelines_latest ON pipelines (app, name, created_at);

-- Runs of a pipeline, and who drives each: a driver holds a run while its lease lasts,
-- so replicas never drive one run at once; `wake_at` defers a run (admission retry).
CREATE TABLE pipeline_runs (
    run_id      TEXT COLLATE "C" PRIMARY KEY,
    app         TEXT COLLATE "C" NOT NULL,
    pipeline    TEXT COLLATE "C" NOT NULL,
    version     TEXT COLLATE "C" NOT NULL,
    driver      TEXT COLLATE "C",
    lease_until BIGINT,
    wake_at     BIGINT NOT NULL,
    done        BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX pipeline_runs_due ON pipeline_runs (wake_at) WHERE NOT done;
