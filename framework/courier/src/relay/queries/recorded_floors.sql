-- The highest backlog floor a relay recorded for each of the $1 shards (heartbeat.sql), 0 for
-- a shard none has: only relays of the same shard count are read.
SELECT coalesce(max(r.backlog_floors[s + 1]), 0)::bigint AS floor
FROM generate_series(0, $1::int - 1) AS s
LEFT JOIN {schema}.relay_instances r ON cardinality(r.backlog_floors) = $1::int
GROUP BY s
ORDER BY s
