-- The sweep deletes webhook events older than the retention, oldest first
-- (docs/webhooks.md, "Retention and deletion").
CREATE INDEX webhook_events_created ON webhook_events (created_at, id);
