-- Issue 26 item 13: a provider's `Retry-After: 1000000000` once paused it for 31 years
-- on every replica. Pauses are now at most `max_pause` (at most a day, docs/engine.md
-- "Provider pace"); this repairs rows written before: a pause, or a schedule pushed
-- behind it, more than a day ahead of now starts afresh.
UPDATE provider_pace
SET paused_until = CASE
        WHEN paused_until > CAST(strftime('%s', 'now') AS INTEGER) * 1000000 + 86400000000
        THEN 0 ELSE paused_until END,
    request_tat = CASE
        WHEN request_tat > CAST(strftime('%s', 'now') AS INTEGER) * 1000000 + 86400000000
        THEN 0 ELSE request_tat END,
    token_tat = CASE
        WHEN token_tat > CAST(strftime('%s', 'now') AS INTEGER) * 1000000 + 86400000000
        THEN 0 ELSE token_tat END
WHERE MAX(paused_until, request_tat, token_tat)
    > CAST(strftime('%s', 'now') AS INTEGER) * 1000000 + 86400000000;
