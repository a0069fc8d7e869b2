-- The global concurrency cap without one hot row: the single `global_admission` counter
-- every admission of every app incremented (and held until its commit) becomes 16 slot
-- stripes. Each stripe holds an allowance (`capacity`) handed out by the last rebalance
-- for the cap `cap_for`; an admission takes one slot of a random stripe while that
-- stripe has allowance left, and only when it has none locks every stripe, recounts the
-- global figure exactly and hands out fresh allowances. See docs/locking.md.
CREATE TABLE global_slots (
    stripe   INT PRIMARY KEY,
    admitted BIGINT NOT NULL,
    capacity BIGINT NOT NULL,
    cap_for  BIGINT NOT NULL
);
-- Every admission so far is carried over on stripe 0; no stripe has an allowance yet
-- (cap_for -1 matches no configuration), so the first admission rebalances.
INSERT INTO global_slots (stripe, admitted, capacity, cap_for)
    SELECT i, 0, 0, -1 FROM generate_series(0, 15) AS i;
UPDATE global_slots
    SET admitted = (SELECT admitted FROM global_admission WHERE id = 1),
        capacity = (SELECT admitted FROM global_admission WHERE id = 1)
    WHERE stripe = 0;
DROP TABLE global_admission;
