-- Outbox gauges: pending rows, dead rows, the largest attempt count among pending rows, and
-- the age in seconds of the oldest pending row.
SELECT count(*) FILTER (WHERE dead_at IS NULL),
       count(*) FILTER (WHERE dead_at IS NOT NULL),
       coalesce(max(publish_attempts) FILTER (WHERE dead_at IS NULL), 0),
       coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_at IS NULL)), 0)::float8
FROM {schema}.outbox
WHERE published_at IS NULL
