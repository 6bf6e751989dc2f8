-- Appends events, one row per array element (after record_versions.sql, in one statement).
INSERT INTO {schema}.outbox (
    id, shard, topic, aggregate_type, aggregate_id, event_type,
    version, schema_version, payload, attributes, occurred_at)
SELECT * FROM UNNEST(
    $1::uuid[], $2::integer[], $3::text[], $4::text[], $5::text[], $6::text[],
    $7::bigint[], $8::integer[], $9::bytea[], $10::jsonb[], $11::timestamptz[])
