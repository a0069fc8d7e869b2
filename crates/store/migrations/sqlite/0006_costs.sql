-- SPEC §13, money and tokens. Amounts are integer nano-dollars; spend is kept in hourly
-- buckets keyed by the hour of the task's admission, so admission reads at most 25 rows
-- per scope (and 25 × 8 per app) whatever the window holds. See docs/budgets.md.

-- A task's reservation (core `Reservation` as JSON), and what settlement charged it.
ALTER TABLE tasks ADD COLUMN reservation TEXT;
ALTER TABLE tasks ADD COLUMN charged_nano INTEGER;
ALTER TABLE tasks ADD COLUMN charged_tokens INTEGER;

-- The scope's model-token bucket and its capacity as of the last admission.
ALTER TABLE scope_state ADD COLUMN token_units INTEGER;
ALTER TABLE scope_state ADD COLUMN token_at INTEGER;
ALTER TABLE scope_state ADD COLUMN token_capacity INTEGER;

CREATE TABLE scope_spend (
    app             TEXT    NOT NULL,
    scope           TEXT    NOT NULL,
    bucket          INTEGER NOT NULL,
    reserved_nano   INTEGER NOT NULL DEFAULT 0,
    settled_nano    INTEGER NOT NULL DEFAULT 0,
    reserved_tokens INTEGER NOT NULL DEFAULT 0,
    settled_tokens  INTEGER NOT NULL DEFAULT 0,
    overrun_nano    INTEGER NOT NULL DEFAULT 0,
    saved_nano      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app, scope, bucket)
);
CREATE INDEX scope_spend_age ON scope_spend (bucket);

CREATE TABLE app_spend (
    app             TEXT    NOT NULL,
    bucket          INTEGER NOT NULL,
    stripe          INTEGER NOT NULL,
    reserved_nano   INTEGER NOT NULL DEFAULT 0,
    settled_nano    INTEGER NOT NULL DEFAULT 0,
    reserved_tokens INTEGER NOT NULL DEFAULT 0,
    settled_tokens  INTEGER NOT NULL DEFAULT 0,
    overrun_nano    INTEGER NOT NULL DEFAULT 0,
    saved_nano      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (app, bucket, stripe)
);
CREATE INDEX app_spend_age ON app_spend (bucket);
