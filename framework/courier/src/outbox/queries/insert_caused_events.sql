-- insert_events.sql after record_caused_versions.sql: a row for each version the ledger
-- recorded, none for a replay. The rows come out of the join with `versions`, so, as there,
-- the ledger's insert has given the transaction its id before the first row takes its seq.
-- Returns the ids of the rows written.
INSERT INTO {schema}.outbox (
    id, shard, topic, aggregate_type, aggregate_id, event_type,
    version, schema_version, payload, attributes, occurred_at)
SELECT e.* FROM UNNEST(
    $1::uuid[], $2::integer[], $3::text[], $4::text[], $5::text[], $6::text[],
    $7::bigint[], $8::integer[], $9::bytea[], $10::jsonb[], $11::timestamptz[])
    AS e(id, shard, topic, aggregate_type, aggregate_id, event_type,
         version, schema_version, payload, attributes, occurred_at)
JOIN versions v ON v.aggregate_id = e.aggregate_id AND v.version = e.version
RETURNING id
