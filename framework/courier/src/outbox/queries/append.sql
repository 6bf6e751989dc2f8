-- Appends events and, in the same statement, queues a wake-up NOTIFY for each of their shards
-- whose claimer is idle. PostgreSQL delivers the NOTIFY only if the transaction commits.
-- The INSERT runs whether or not the SELECT returns rows (data-modifying CTEs always do).
WITH inserted AS (
    INSERT INTO {schema}.outbox (
        id, shard, topic, aggregate_type, aggregate_id, event_type,
        version, schema_version, payload, attributes, occurred_at)
    SELECT * FROM UNNEST(
        $1::uuid[], $2::integer[], $3::text[], $4::text[], $5::text[], $6::text[],
        $7::bigint[], $8::integer[], $9::bytea[], $10::jsonb[], $11::timestamptz[])
)
SELECT pg_notify($12, s.shard::text)
FROM {schema}.outbox_shard_state s
WHERE s.idle AND s.shard = ANY($2::integer[])
