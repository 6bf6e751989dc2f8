-- The outbox's backlog per shard and topic, shards $1 each walked from its floor $2
-- (relay/backlog.rs): pending rows (not dead), those of them in flight (claimed under a live
-- lease of $3 seconds), dead rows, the largest attempt count among pending rows, and the age in
-- seconds of the oldest pending row. A (shard, topic) with no unpublished row is not listed.
-- Below a shard's floor every never-failed row is published or waits behind a failed row of
-- its key, so never-failed rows are counted from the floor on, failed rows from their own index
-- (outbox_parked), and the rows waiting behind them by their key. While a long transaction
-- pins the xmin horizon, no part walks the entries of the rows published since the pin (P9):
-- counting every unpublished-looking entry did, 0.6 s a call ten minutes into a pin.
-- Each part is an aggregate in a LATERAL subquery (or behind OFFSET 0), which PostgreSQL
-- does not flatten into a join: every walk is an index range of one shard or key. The two
-- walks are ordered as their index is, with a bound no backlog reaches: without statistics
-- (a new outbox) PostgreSQL otherwise took other indexes, walking every unpublished row once
-- per failed row.
WITH floors AS (
    SELECT * FROM unnest($1::int[], $2::bigint[]) AS f(shard, floor)
), ahead AS (
    SELECT f.shard, o.*
    FROM floors f
    CROSS JOIN LATERAL (
        SELECT topic, count(*) AS pending, count(*) FILTER (WHERE live) AS in_flight,
               min(created_at) AS oldest, max(publish_attempts) AS attempts
        FROM (SELECT topic, created_at, publish_attempts,
                     lock_token IS NOT NULL AND locked_at >= now() - make_interval(secs => $3) AS live
              FROM {schema}.outbox
              WHERE shard = f.shard
                AND seq >= f.floor
                AND published_at IS NULL
                AND dead_at IS NULL
                AND next_retry_at IS NULL
              -- In seq order: outbox_ready's range from the floor.
              ORDER BY seq
              LIMIT 10000000) ready
        GROUP BY topic) o
), failed AS MATERIALIZED (
    SELECT f.shard, f.floor, p.*
    FROM floors f
    CROSS JOIN LATERAL (
        SELECT topic, aggregate_id, version, dead_at, created_at, publish_attempts,
               lock_token IS NOT NULL AND locked_at >= now() - make_interval(secs => $3) AS live
        FROM {schema}.outbox
        WHERE shard = f.shard
          AND published_at IS NULL
          AND (dead_at IS NOT NULL OR next_retry_at IS NOT NULL)
        OFFSET 0) p
), behind AS (
    -- Never-failed rows below their shard's floor behind their key's first failed row.
    SELECT p.shard, b.*
    FROM (SELECT DISTINCT ON (shard, aggregate_id) shard, floor, aggregate_id, version
          FROM failed
          ORDER BY shard, aggregate_id, version) p
    CROSS JOIN LATERAL (
        SELECT topic, count(*) AS pending, count(*) FILTER (WHERE live) AS in_flight,
               min(created_at) AS oldest, max(publish_attempts) AS attempts
        FROM (SELECT topic, created_at, publish_attempts,
                     lock_token IS NOT NULL AND locked_at >= now() - make_interval(secs => $3) AS live
              FROM {schema}.outbox
              WHERE shard = p.shard
                AND aggregate_id = p.aggregate_id
                AND version > p.version
                AND published_at IS NULL
                AND dead_at IS NULL
                AND next_retry_at IS NULL
                AND seq < p.floor
              -- In version order: the key's range of outbox_unpublished_versions.
              ORDER BY version
              LIMIT 10000000) waiting
        GROUP BY topic) b
), parts AS (
    SELECT shard, topic, pending, in_flight, 0::bigint AS dead, oldest, attempts FROM ahead
    UNION ALL
    SELECT shard, topic, pending, in_flight, 0, oldest, attempts FROM behind
    UNION ALL
    -- The failed rows themselves: retrying ones are pending, dead ones are not.
    SELECT shard, topic,
           count(*) FILTER (WHERE dead_at IS NULL),
           count(*) FILTER (WHERE dead_at IS NULL AND live),
           count(*) FILTER (WHERE dead_at IS NOT NULL),
           min(created_at) FILTER (WHERE dead_at IS NULL),
           max(publish_attempts) FILTER (WHERE dead_at IS NULL)
    FROM failed
    GROUP BY shard, topic
)
SELECT shard,
       topic,
       sum(pending)::bigint AS pending,
       sum(in_flight)::bigint AS in_flight,
       sum(dead)::bigint AS dead,
       coalesce(max(attempts), 0) AS max_attempts,
       coalesce(extract(epoch FROM now() - min(oldest)), 0)::float8 AS oldest_pending_secs
FROM parts
GROUP BY shard, topic
ORDER BY shard, topic
