-- Where a run's tasks' traces continue (docs/telemetry.md, "Runs"): the W3C `traceparent`
-- of the run's span, the parent of every task submitted for it. NULL when the run was
-- created with traces off.
ALTER TABLE runs ADD COLUMN trace_parent TEXT;
