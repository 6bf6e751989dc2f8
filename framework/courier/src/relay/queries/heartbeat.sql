-- Registers this relay instance as alive, with what its publish limit sees ($4 limit, $5 rows
-- in flight, $6 latency in ms, $7 ordering keys out) and its backlog gauge's floors ($8, one per
-- shard: 0024_recorded_backlog_floors.sql), and returns how many instances are alive
-- (heartbeat within $3 seconds), this one included. Long-dead instances are forgotten.
WITH beat AS (
    INSERT INTO {schema}.relay_instances
        (instance_id, owned_shards, publish_limit, publishes_in_flight, publish_latency_ms,
         publish_keys_out, backlog_floors)
    VALUES ($1, $2, $4, $5, $6, $7, $8)
    ON CONFLICT (instance_id) DO UPDATE
    SET heartbeat_at = now(),
        owned_shards = EXCLUDED.owned_shards,
        publish_limit = EXCLUDED.publish_limit,
        publishes_in_flight = EXCLUDED.publishes_in_flight,
        publish_latency_ms = EXCLUDED.publish_latency_ms,
        publish_keys_out = EXCLUDED.publish_keys_out,
        backlog_floors = EXCLUDED.backlog_floors
    RETURNING instance_id
), forget AS (
    DELETE FROM {schema}.relay_instances
    WHERE heartbeat_at < now() - make_interval(secs => $3::float8 * 20) AND instance_id <> $1
)
SELECT 1 + count(*) FROM {schema}.relay_instances
WHERE heartbeat_at >= now() - make_interval(secs => $3) AND instance_id <> $1
