-- Follows record_versions.sql and insert_events.sql as
-- `WITH versions AS (<record>), inserted AS (<insert>) <this>`: queues a wake-up NOTIFY for
-- each of the appended events' shards ($2) whose claimer is idle, in the same statement.
-- PostgreSQL delivers the NOTIFY only if the transaction commits; the INSERT runs whether or
-- not this SELECT returns rows (data-modifying CTEs always do).
SELECT pg_notify($12, s.shard::text)
FROM {schema}.outbox_shard_state s
WHERE s.idle AND s.shard = ANY($2::integer[])
