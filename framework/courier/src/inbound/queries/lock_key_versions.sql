-- Locks keys $2 of group $1 for the transaction, so one projection transaction of a key at a
-- time reads and moves its version (0019_append_key_versions.sql). In key order, so concurrent
-- transactions cannot deadlock here: the sorted keys drive a nested loop that locks each key's
-- row as it meets it. A key not seen yet has no row: two first transactions of it meet at the
-- insert of its row (advance_key_version.sql).
-- A probe of the primary key per key, whatever PostgreSQL knows of the table: the plain
-- `routing_key = ANY($2)` was planned, on a table not analyzed since it grew (a new service,
-- autovacuum off or behind), as a scan of the whole group filtered by key, which a prepared
-- statement keeps: its cost grew with every key the projection had seen.
SELECT count(*)
FROM (SELECT DISTINCT routing_key FROM unnest($2::text[]) AS k(routing_key) ORDER BY 1) AS k
CROSS JOIN LATERAL (
    SELECT 1 FROM {schema}.projection_keys p
    WHERE p.consumer_group = $1 AND p.routing_key = k.routing_key
    FOR UPDATE
) AS locked
