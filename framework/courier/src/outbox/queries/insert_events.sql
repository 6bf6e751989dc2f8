-- Appends events, one row per array element (after record_versions.sql, in one statement).
-- It reads `versions`, so the ledger's insert runs first and the transaction has its id before
-- the first row takes its seq: a claim that took its snapshot after a seq was handed out then
-- sees that transaction as running or ended, never as not yet begun (relay/scan_from.rs
-- relies on it to know when no row can still appear below a seq).
INSERT INTO {schema}.outbox (
    id, shard, topic, aggregate_type, aggregate_id, event_type,
    version, schema_version, payload, attributes, occurred_at)
SELECT * FROM UNNEST(
    $1::uuid[], $2::integer[], $3::text[], $4::text[], $5::text[], $6::text[],
    $7::bigint[], $8::integer[], $9::bytea[], $10::jsonb[], $11::timestamptz[])
WHERE EXISTS (SELECT 1 FROM versions)
