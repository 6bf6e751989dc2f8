-- Moves keys $2 of group $1 to versions $3; never backwards. $4: the publish time of the
-- event that starts each key, kept from its first advance.
INSERT INTO {schema}.projection_versions AS v (consumer_group, routing_key, version, first_publish_time)
SELECT $1, k.routing_key, k.version, k.first_publish_time
FROM unnest($2::text[], $3::bigint[], $4::timestamptz[]) AS k(routing_key, version, first_publish_time)
ORDER BY k.routing_key
ON CONFLICT (consumer_group, routing_key) DO UPDATE SET version = EXCLUDED.version
WHERE v.version < EXCLUDED.version
