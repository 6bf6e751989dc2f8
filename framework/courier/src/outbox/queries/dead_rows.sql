-- Dead rows (they block their key's later versions), oldest first, at most $1.
SELECT id, shard, topic, aggregate_id, event_type, version, publish_attempts, last_error, dead_at
FROM {schema}.outbox
WHERE published_at IS NULL AND dead_at IS NOT NULL
ORDER BY seq
LIMIT $1
