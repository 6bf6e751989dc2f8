-- What each relay's congestion control sees, written with its heartbeat so `courier status`
-- can show it from the database: the adaptive limit on publishes in flight, the rows in flight
-- now, and the recent publish latency (outbox/publish_limit.rs). NULL until the first beat.
ALTER TABLE relay_instances
    ADD COLUMN publish_limit integer,
    ADD COLUMN publishes_in_flight integer,
    ADD COLUMN publish_latency_ms double precision;
