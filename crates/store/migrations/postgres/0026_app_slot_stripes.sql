-- docs/budgets.md, "Each app's share of the global capacity", on PostgreSQL: an app's
-- count of queued or running admitted tasks is the sum of its rows, one per stripe.
-- Stripe 0 is the row an app with a share takes its own slots on (a conditional update
-- under that row's lock) and every task's ending gives back on; an app without a share
-- only counts, on stripe 1–15 picked by the task's id, so its admissions do not queue
-- behind one row lock each (issue 32: the admission benchmark's one row every
-- admission of the app waited for). The existing rows become stripe 0.
ALTER TABLE app_slots ADD COLUMN stripe SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE app_slots DROP CONSTRAINT app_slots_pkey;
ALTER TABLE app_slots ADD PRIMARY KEY (app, stripe);
