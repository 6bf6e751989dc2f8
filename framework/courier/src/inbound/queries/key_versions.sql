-- The versions keys $2 of group $1 stand at (contiguous projections); $3: the version each key
-- is expected at (the one before its lowest event's). A key's newest entry is the first a
-- backward index scan meets, but PostgreSQL reads the rest of the key's entries on that index
-- page with it: under a pinned horizon, the dead ones of every earlier move. So the scan looks
-- from the expected version up first and stops there, and only a key found below it (a gap, or
-- none yet) is looked at whole. Either look returns the key's newest: a hint, never an answer.
-- A key without an entry has seen nothing yet. Run after lock_key_versions.sql, in a statement
-- of its own: its snapshot then sees what the transaction that held the lock committed.
SELECT k.routing_key, v.version
FROM unnest($2::text[], $3::bigint[]) AS k(routing_key, expected)
CROSS JOIN LATERAL (
    (SELECT l.version FROM {schema}.projection_version_log l
     WHERE l.consumer_group = $1 AND l.routing_key = k.routing_key AND l.version >= k.expected
     ORDER BY l.version DESC
     LIMIT 1)
    UNION ALL
    -- Not run when the look above found the key (PostgreSQL stops at LIMIT 1), nor when it
    -- already covered every version (0 and up).
    (SELECT l.version FROM {schema}.projection_version_log l
     WHERE k.expected > 0 AND l.consumer_group = $1 AND l.routing_key = k.routing_key
     ORDER BY l.version DESC
     LIMIT 1)
    LIMIT 1
) AS v
