-- docs/conformance.md#cost-limits: a delta added to the scope's spend bucket and to the app's (one stripe of
-- it), two statements of the query around them; {spend_when} says whether they write.
INSERT INTO scope_spend (app, scope, bucket, reserved_nano, reserved_tokens, saved_nano)
SELECT :app, :scope, :bucket, :reserved_nano, :reserved_tokens, :saved_nano
WHERE {spend_when}
ON CONFLICT (app, scope, bucket) DO UPDATE SET
  reserved_nano = reserved_nano + excluded.reserved_nano,
  reserved_tokens = reserved_tokens + excluded.reserved_tokens,
  saved_nano = saved_nano + excluded.saved_nano;
INSERT INTO app_spend (app, bucket, stripe, reserved_nano, reserved_tokens, saved_nano)
SELECT :app, :bucket, :stripe, :reserved_nano, :reserved_tokens, :saved_nano
WHERE {spend_when}
ON CONFLICT (app, bucket, stripe) DO UPDATE SET
  reserved_nano = reserved_nano + excluded.reserved_nano,
  reserved_tokens = reserved_tokens + excluded.reserved_tokens,
  saved_nano = saved_nano + excluded.saved_nano
