-- docs/conformance.md#fair-share, both backends (docs/engine.md, "Dispatch order"): the (app, scope) queue of
-- a queued task joins. The statement around it names the joining queue in a one-row
-- `join_params` (app, scope, weight, credit: core's join_credit of the weight, stride:
-- core's stride); no row there, nothing joins.
--
-- The floor is the least standing of the active queues, a queue's standing being its
-- pass, or while it still holds joining credit (pass below its base) the floor it joined
-- at. Joining queues never lower it (they stand at the floor they found), so it never
-- runs away however many queues join; with no queue active it is the greatest pass of
-- all (0 for the first queue ever). A queue joins one burst (credit) below the floor,
-- but no earlier than one stride after the furthest fresh queue of its app (active and
-- not claimed from since it joined: pass = joined), so the queues an app opens together
-- share one burst of credit. `base` is the floor it found, `joined` the pass it joined
-- at. Its reads are index lookups (migration 0011). The inner subquery is DISTINCT (on
-- its one row: no change) so neither planner pulls it up into the expressions that use
-- its floor, top and fresh several times: each is read once.
INSERT INTO dispatch_queues (app, scope, weight, pass, base, joined, active)
SELECT y.app, y.scope, y.weight, y.pass, y.base, y.pass, TRUE
FROM (
  SELECT x.app, x.scope, x.weight,
         CASE WHEN x.floor IS NULL THEN x.top
              WHEN x.fresh IS NOT NULL AND x.fresh + x.stride > x.floor - x.credit
              THEN x.fresh + x.stride
              ELSE x.floor - x.credit END AS pass,
         COALESCE(x.floor, x.top) AS base
  FROM (
    SELECT DISTINCT p.app, p.scope, p.weight, p.credit, p.stride,
           (SELECT MIN(m) FROM (
              SELECT MIN(base) AS m FROM dispatch_queues WHERE active AND pass < base
              UNION ALL
              SELECT MIN(pass) AS m FROM dispatch_queues WHERE active AND pass >= base
            ) u) AS floor,
           COALESCE((SELECT MAX(pass) FROM dispatch_queues), 0) AS top,
           (SELECT MAX(f.pass) FROM dispatch_queues f
             WHERE f.app = p.app AND f.active AND f.pass = f.joined) AS fresh
    FROM join_params p
  ) x
) y
WHERE TRUE
-- A queue that exists: an active one keeps its pass; an idle one becomes active at the
-- greater of its own last pass and the joining pass, so it banks at most one burst of
-- credit however long it idled, standing at the floor it found. The weight follows the
-- task's policy.
ON CONFLICT (app, scope) DO UPDATE SET
  weight = excluded.weight,
  pass = CASE WHEN dispatch_queues.active THEN dispatch_queues.pass
              WHEN dispatch_queues.pass > excluded.pass THEN dispatch_queues.pass
              ELSE excluded.pass END,
  base = CASE WHEN dispatch_queues.active THEN dispatch_queues.base
              ELSE excluded.base END,
  joined = CASE WHEN dispatch_queues.active THEN dispatch_queues.joined
                WHEN dispatch_queues.pass > excluded.pass THEN dispatch_queues.pass
                ELSE excluded.pass END,
  active = TRUE
WHERE NOT dispatch_queues.active OR dispatch_queues.weight <> excluded.weight
