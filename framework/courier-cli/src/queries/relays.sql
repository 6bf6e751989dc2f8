-- The live relays of one service (heartbeat within $1 seconds): the shards each owns, how long
-- ago it last beat, and what its publish limit saw at that heartbeat (relay/publish_limit.rs).
SELECT instance_id::text AS instance,
       cardinality(owned_shards) AS shards,
       owned_shards,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age_secs,
       publish_limit,
       publishes_in_flight,
       publish_latency_ms,
       publish_keys_out
FROM {schema}.relay_instances
WHERE heartbeat_at > now() - make_interval(secs => $1)
ORDER BY started_at
