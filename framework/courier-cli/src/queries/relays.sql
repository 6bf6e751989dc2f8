-- The live relays of one service (heartbeat within $1 seconds) and what each one's publish limit
-- saw at its last heartbeat (relay/publish_limit.rs).
SELECT instance_id::text AS instance,
       cardinality(owned_shards) AS shards,
       publish_limit,
       publishes_in_flight,
       publish_latency_ms,
       publish_keys_out
FROM {schema}.relay_instances
WHERE heartbeat_at > now() - make_interval(secs => $1)
ORDER BY started_at
