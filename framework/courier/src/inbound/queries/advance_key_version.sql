-- Moves key $2 of group $1 to version $3; never backwards. $4: the publish time of the
-- event that starts the key, kept from its first advance.
INSERT INTO {schema}.projection_versions AS v (consumer_group, routing_key, version, first_publish_time)
VALUES ($1, $2, $3, $4)
ON CONFLICT (consumer_group, routing_key) DO UPDATE SET version = EXCLUDED.version
WHERE v.version < EXCLUDED.version
