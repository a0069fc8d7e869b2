-- docs/conformance.md#cost-cache-hits: a cache hit's saving (:saved_nano, the copied task's charge) added to the
-- scope's and the app's spend bucket of now (scope bucket first: the lock order).
WITH {spend_add}
SELECT 1
