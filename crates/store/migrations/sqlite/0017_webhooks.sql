-- Webhooks (docs/webhooks.md): endpoints per app, the outbox of events written in the
-- same transaction as the change they report, and one delivery per (event, endpoint)
-- (plus replays), leased by one replica at a time. Timestamps are epoch milliseconds.

CREATE TABLE webhook_endpoints (
    id          TEXT PRIMARY KEY,
    app         TEXT NOT NULL,
    url         TEXT NOT NULL,
    -- `whsec_<base64>`: deliveries are signed with it, so it is kept as given.
    secret      TEXT NOT NULL,
    -- JSON array of event type names, e.g. ["task.failed","task.succeeded"].
    events      TEXT NOT NULL,
    enabled     BOOLEAN NOT NULL DEFAULT TRUE,
    description TEXT,
    -- TRUE for the endpoints of the configuration file (replaced at each start).
    from_config BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX webhook_endpoints_app ON webhook_endpoints (app, created_at, id);

-- The outbox: one row per event, only when the app has an endpoint subscribed to it.
-- The id is stable (the `webhook-id` of every delivery of it).
CREATE TABLE webhook_events (
    id          TEXT PRIMARY KEY,
    app         TEXT NOT NULL,
    type        TEXT NOT NULL,
    task_id     TEXT,
    run_id      TEXT,
    scope       TEXT,
    state       TEXT,
    error_code  TEXT,
    -- Further fields of the event's data, a JSON object (budget thresholds).
    data        TEXT,
    created_at  BIGINT NOT NULL
);
CREATE INDEX webhook_events_app ON webhook_events (app, created_at, id);

CREATE TABLE webhook_deliveries (
    id               TEXT PRIMARY KEY,
    event_id         TEXT NOT NULL,
    endpoint_id      TEXT NOT NULL,
    app              TEXT NOT NULL,
    -- pending | delivered | dead
    state            TEXT NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_at          BIGINT NOT NULL,
    first_attempt_at BIGINT,
    last_attempt_at  BIGINT,
    response_code    BIGINT,
    last_error       TEXT,
    leased_by        TEXT,
    lease_until      BIGINT,
    -- The delivery this one replays, for replays.
    replay_of        TEXT,
    created_at       BIGINT NOT NULL,
    delivered_at     BIGINT
);
-- The delivery loop reads only due pending deliveries.
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at, id);
CREATE INDEX webhook_deliveries_event ON webhook_deliveries (event_id);
