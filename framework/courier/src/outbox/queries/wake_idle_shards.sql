-- Follows record_versions.sql and insert_events.sql as
-- `WITH versions AS (<record>), inserted AS (<insert>) <this>`: queues a wake-up NOTIFY for
-- each of the appended events' shards ($2) whose claimer is idle, in the same statement (for
-- events of one shard: wake_idle_shard.sql).
-- A shard's flag is its newest entry in outbox_idle_flags, read newest first so the read never
-- walks older (possibly dead) entries. PostgreSQL delivers the NOTIFY only if the transaction
-- commits; the INSERT runs whether or not this SELECT returns rows (data-modifying CTEs
-- always do). {channel} and {shard} are the statement's parameters for the wake channel and
-- (wake_idle_shard.sql) the one shard: their numbers follow the columns' (append.rs).
SELECT pg_notify({channel}, s.shard::text)
FROM (SELECT DISTINCT unnest($2::integer[]) AS shard) s
WHERE (SELECT f.idle
       FROM {schema}.outbox_idle_flags f
       WHERE f.shard = s.shard
       ORDER BY f.flag_seq DESC
       LIMIT 1)
