-- The body of the LATERAL subquery in key_versions.sql and advance_key_version.sql: key
-- k.routing_key of group $1's newest entry ({columns}), looked for from version k.from_version
-- up first (where the key is expected to stand, or where the transaction read it). A backward
-- index scan returns a key's newest entry first, but PostgreSQL reads the rest of the key's
-- entries on that index page with it: under a pinned horizon, the dead ones of every earlier
-- move. Bounded, the scan stops at k.from_version; only a key found below it (a gap, or none
-- yet) is read whole, and not when the first look already covered every version (0 and up).
-- Either look returns the key's newest: the version decides how far a scan goes, never the
-- answer.
(SELECT {columns} FROM {schema}.projection_version_log l
 WHERE l.consumer_group = $1 AND l.routing_key = k.routing_key AND l.version >= k.from_version
 ORDER BY l.version DESC
 LIMIT 1)
UNION ALL
(SELECT {columns} FROM {schema}.projection_version_log l
 WHERE k.from_version > 0 AND l.consumer_group = $1 AND l.routing_key = k.routing_key
 ORDER BY l.version DESC
 LIMIT 1)
LIMIT 1
