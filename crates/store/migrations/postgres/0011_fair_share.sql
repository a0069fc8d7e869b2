-- SPEC §14 joining credit bounded across any number of new queues (docs/engine.md,
-- "Dispatch order"). `base` is the floor a queue found when it became active (the
-- least standing of the active queues): while its pass is below it, the queue holds
-- joining credit and stands at its base, so joining queues never lower the floor the
-- next one joins below. `joined` is the pass it became active at: while its pass is
-- still that (nothing claimed since), it is fresh, and its app's next new queue joins
-- one stride after it instead of one more burst below the floor.
ALTER TABLE dispatch_queues ADD COLUMN base BIGINT NOT NULL DEFAULT 0;
ALTER TABLE dispatch_queues ADD COLUMN joined BIGINT;
-- Existing queues hold no credit and are not fresh.
UPDATE dispatch_queues SET base = pass;
-- The least base of the queues that hold credit.
CREATE INDEX dispatch_queues_credit ON dispatch_queues (base) WHERE active AND pass < base;
-- An app's furthest fresh queue.
CREATE INDEX dispatch_queues_fresh ON dispatch_queues (app, pass) WHERE active AND pass = joined;

-- Each app's share of global_concurrent (docs/budgets.md, "Each app's share of the
-- global capacity"): its queued or running admitted tasks, and the share it was last
-- admitted with. An app takes one of its own slots under this row's lock; a slot
-- beyond its share only under the share pool's advisory lock, after counting
-- Σ max(0, active − share) over these rows.
CREATE TABLE app_slots (
    app    TEXT COLLATE "C" PRIMARY KEY,
    active BIGINT NOT NULL,
    share  BIGINT NOT NULL
);
INSERT INTO app_slots (app, active, share)
    SELECT app, COUNT(*), 0 FROM tasks
    WHERE admitted AND status IN ('queued', 'running') GROUP BY app;
