-- Parks key $2 of group $1 (subscription $3), waiting for version $4, because of $5; a key
-- already parked keeps its first reason and expected version. Returns whether it was parked
-- before.
WITH parked AS (
    INSERT INTO {schema}.parked_keys (consumer_group, routing_key, subscription, expected_version, reason)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (consumer_group, routing_key) DO NOTHING
    RETURNING 1
)
SELECT NOT EXISTS (SELECT 1 FROM parked)
