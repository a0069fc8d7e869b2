-- SPEC §13, money and tokens. Amounts are integer nano-dollars; spend is kept in hourly
-- buckets keyed by the hour of the task's admission, so admission reads at most 25 rows
-- per scope (and 25 × 8 per app) whatever the window holds. See docs/budgets.md.

-- A task's reservation (core `Reservation` as JSON: tokens, nano_usd, prices, bounded),
-- and what settlement charged it.
ALTER TABLE tasks
    ADD COLUMN reservation    TEXT,
    ADD COLUMN charged_nano   BIGINT,
    ADD COLUMN charged_tokens BIGINT;

-- The scope's model-token bucket (units of 1/60,000 token) and its capacity as of the
-- last admission (a settlement's refund never fills it past that).
ALTER TABLE scope_state
    ADD COLUMN token_units    BIGINT,
    ADD COLUMN token_at       BIGINT,
    ADD COLUMN token_capacity BIGINT;

-- Spend per (app, scope, hour of admission): reserved until settled, then settled.
CREATE TABLE scope_spend (
    app             TEXT   NOT NULL,
    scope           TEXT   NOT NULL,
    bucket          BIGINT NOT NULL,
    reserved_nano   BIGINT NOT NULL DEFAULT 0,
    settled_nano    BIGINT NOT NULL DEFAULT 0,
    reserved_tokens BIGINT NOT NULL DEFAULT 0,
    settled_tokens  BIGINT NOT NULL DEFAULT 0,
    overrun_nano    BIGINT NOT NULL DEFAULT 0,
    saved_nano      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (app, scope, bucket)
);
CREATE INDEX scope_spend_age ON scope_spend (bucket);

-- The same per app, striped by scope (8 stripes) so that scopes of one app do not all
-- add to one row.
CREATE TABLE app_spend (
    app             TEXT   NOT NULL,
    bucket          BIGINT NOT NULL,
    stripe          INT    NOT NULL,
    reserved_nano   BIGINT NOT NULL DEFAULT 0,
    settled_nano    BIGINT NOT NULL DEFAULT 0,
    reserved_tokens BIGINT NOT NULL DEFAULT 0,
    settled_tokens  BIGINT NOT NULL DEFAULT 0,
    overrun_nano    BIGINT NOT NULL DEFAULT 0,
    saved_nano      BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (app, bucket, stripe)
);
CREATE INDEX app_spend_age ON app_spend (bucket);
