-- docs/engine.md, "Dead rows": autovacuum's own thresholds on the tables every task's
-- life updates, for servers where autovacuum is on. Its defaults (20 % of the table plus
-- 50 rows) leave a one-row-per-key table of a few hot rows (a queue, a scope's counters,
-- a slot stripe) thousands of dead versions deep, and `tasks` tens of thousands; these
-- vacuum a hot table after a few hundred dead rows and `tasks` after 2 % of its rows.
-- The store also vacuums these tables itself when their dead rows pass a bound, so a
-- server without autovacuum stays lean (crates/store/src/postgres/stats.rs).
ALTER TABLE tasks SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000,
                       autovacuum_analyze_scale_factor = 0.05);
ALTER TABLE task_attempts SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
ALTER TABLE admissions SET (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
ALTER TABLE dispatch_queues SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200,
                                 autovacuum_vacuum_cost_delay = 0);
ALTER TABLE scope_state SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 200,
                             autovacuum_vacuum_cost_delay = 0);
ALTER TABLE scope_sources SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 500);
ALTER TABLE global_slots SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200,
                              autovacuum_vacuum_cost_delay = 0);
ALTER TABLE global_finished SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200,
                                 autovacuum_vacuum_cost_delay = 0);
ALTER TABLE app_slots SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200,
                           autovacuum_vacuum_cost_delay = 0);
ALTER TABLE scope_spend SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_vacuum_threshold = 200,
                             autovacuum_vacuum_cost_delay = 0);
ALTER TABLE app_spend SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200,
                           autovacuum_vacuum_cost_delay = 0);
