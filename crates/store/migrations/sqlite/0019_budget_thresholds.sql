-- Budget threshold events (docs/webhooks.md, "Budget thresholds").

-- The shares of a USD limit an endpoint subscribed to `budget.threshold` hears about:
-- a JSON array of basis points (8000 = 80 %).
ALTER TABLE webhook_endpoints ADD COLUMN budget_thresholds TEXT NOT NULL DEFAULT '[8000]';

-- One row per (limit, threshold) some settlement checked: the lock that orders the
-- settlements of one limit (each writes its spend, locks the row, then reads the window),
-- and the window of the threshold's last event, so it is announced at most once per 24 h.
CREATE TABLE budget_alerts (
    app          TEXT NOT NULL,
    -- scope_usd_per_24_hours | app_usd_per_24_hours
    kind         TEXT NOT NULL,
    -- The scope of a scope's limit; '' for the app's.
    scope        TEXT NOT NULL,
    limit_nano   BIGINT NOT NULL,
    threshold_bp BIGINT NOT NULL,
    -- Start of the window (epoch ms) of the last event; NULL: none yet.
    window_start BIGINT,
    PRIMARY KEY (app, kind, scope, limit_nano, threshold_bp)
);
