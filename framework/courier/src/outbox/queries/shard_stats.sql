-- Per shard with unpublished rows: pending (not dead), in flight (claimed under a live lease
-- of $1 seconds), dead, and the age in seconds of the oldest pending row.
SELECT shard,
       count(*) FILTER (WHERE dead_at IS NULL) AS pending,
       count(*) FILTER (WHERE dead_at IS NULL AND lock_token IS NOT NULL
                          AND locked_at >= now() - make_interval(secs => $1)) AS in_flight,
       count(*) FILTER (WHERE dead_at IS NOT NULL) AS dead,
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8
           AS oldest_pending_secs
FROM {schema}.outbox
WHERE published_at IS NULL
GROUP BY shard
ORDER BY shard
