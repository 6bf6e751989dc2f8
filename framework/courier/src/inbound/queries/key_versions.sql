-- The versions keys $2 of group $1 stand at (contiguous projections): each key's newest entry,
-- the first a backward index scan meets (never the dead entries a pinned horizon keeps below
-- it); a key without one has seen nothing yet. Run after lock_key_versions.sql, in a statement
-- of its own: its snapshot then sees what the transaction that held the lock committed.
SELECT k.routing_key, v.version
FROM unnest($2::text[]) AS k(routing_key)
CROSS JOIN LATERAL (
    SELECT l.version FROM {schema}.projection_version_log l
    WHERE l.consumer_group = $1 AND l.routing_key = k.routing_key
    ORDER BY l.version DESC
    LIMIT 1
) AS v
