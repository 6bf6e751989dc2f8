-- Registers this relay instance as alive and returns how many instances are alive
-- (heartbeat within $3 seconds), this one included. Long-dead instances are forgotten.
WITH beat AS (
    INSERT INTO {schema}.relay_instances (instance_id, owned_shards) VALUES ($1, $2)
    ON CONFLICT (instance_id) DO UPDATE SET heartbeat_at = now(), owned_shards = EXCLUDED.owned_shards
    RETURNING instance_id
), forget AS (
    DELETE FROM {schema}.relay_instances
    WHERE heartbeat_at < now() - make_interval(secs => $3::float8 * 20) AND instance_id <> $1
)
SELECT 1 + count(*) FROM {schema}.relay_instances
WHERE heartbeat_at >= now() - make_interval(secs => $3) AND instance_id <> $1
