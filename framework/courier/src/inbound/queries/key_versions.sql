-- The versions keys $2 of group $1 stand at (contiguous projections), each read from $3, the
-- version it is expected at (the one before its lowest event's) up first (key_newest.sql). A
-- key without an entry has seen nothing yet. Run after lock_key_versions.sql, in a statement
-- of its own: its snapshot then sees what the transaction that held the lock committed.
SELECT k.routing_key, v.version
FROM unnest($2::text[], $3::bigint[]) AS k(routing_key, from_version)
CROSS JOIN LATERAL (
{newest}
) AS v
