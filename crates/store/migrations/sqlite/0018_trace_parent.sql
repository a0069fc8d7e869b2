-- Where a task's trace continues (docs/telemetry.md): the W3C `traceparent` of the span
-- that submitted it, so the worker that claims it (on any replica) adds its spans to the
-- same trace. NULL when the task was submitted with traces off.
ALTER TABLE tasks ADD COLUMN trace_parent TEXT;
