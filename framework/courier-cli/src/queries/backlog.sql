-- The outbox backlog per topic and shard: rows waiting to be published (pending), dead rows,
-- and the age of the oldest pending one. Only unpublished rows are read, which the partial
-- indexes on unpublished rows cover.
SELECT topic,
       shard,
       count(*) FILTER (WHERE dead_at IS NULL) AS pending,
       count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8
           AS oldest_pending_secs
FROM {schema}.outbox
WHERE published_at IS NULL
GROUP BY topic, shard
ORDER BY topic, shard
