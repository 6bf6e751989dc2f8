-- Records whether shard $1's claimer is idle (writers NOTIFY only idle shards).
INSERT INTO {schema}.outbox_shard_state (shard, idle, updated_at) VALUES ($1, $2, now())
ON CONFLICT (shard) DO UPDATE SET idle = EXCLUDED.idle, updated_at = now()
WHERE {schema}.outbox_shard_state.idle IS DISTINCT FROM EXCLUDED.idle
