-- Moves keys $2 of group $1 to versions $3, never backwards: appends each key's new entry and
-- deletes the one it replaces by its address (a key's newest, found from $5, the version the
-- transaction read the key at, up first: key_newest.sql), so no statement walks
-- the dead entries a pinned horizon keeps. A key's first move writes its row, with $4: the
-- publish time of the event that starts it. The caller holds the keys' locks
-- (lock_key_versions.sql).
WITH moves AS (
    SELECT k.routing_key, k.version, k.first_publish_time, cur.ctid AS replaced
    FROM unnest($2::text[], $3::bigint[], $4::timestamptz[], $5::bigint[])
        AS k(routing_key, version, first_publish_time, from_version)
    LEFT JOIN LATERAL (
{newest}
    ) AS cur ON true
    WHERE cur.version IS NULL OR cur.version < k.version
), first_moves AS (
    INSERT INTO {schema}.projection_keys (consumer_group, routing_key, first_publish_time)
    SELECT $1, routing_key, first_publish_time FROM moves WHERE replaced IS NULL
    ORDER BY routing_key
    ON CONFLICT DO NOTHING
), replaced AS (
    -- A join, not `ctid = ANY(ARRAY(…))`: PostgreSQL scans a table for the latter.
    DELETE FROM {schema}.projection_version_log l USING moves m WHERE l.ctid = m.replaced
)
-- Two first transactions of a key (not locked: it had no row) may both append: the later one
-- changes nothing, as a move to a version already there.
INSERT INTO {schema}.projection_version_log (consumer_group, routing_key, version)
SELECT $1, routing_key, version FROM moves
ON CONFLICT DO NOTHING
