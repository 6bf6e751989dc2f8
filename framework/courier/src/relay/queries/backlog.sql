-- Outbox gauges over shards $1, each walked from its floor $2 (relay/backlog.rs): pending rows
-- (not dead), dead rows, the largest attempt count among pending rows, and the age in seconds
-- of the oldest pending row. Below a shard's floor every never-failed row is published or
-- waits behind a failed row of its key, so never-failed rows are counted from the floor on,
-- failed rows from their own index (outbox_parked), and the rows waiting behind them by their
-- key. While a long transaction pins the xmin horizon, no part walks the entries of the rows
-- published since the pin (P9): counting every unpublished-looking entry did, 0.6 s a call ten
-- minutes into a pin.
-- Each part is an aggregate in a LATERAL subquery (or behind OFFSET 0), which PostgreSQL
-- does not flatten into a join: every walk is an index range of one shard or key. The two
-- walks are ordered as their index is, with a bound no backlog reaches: without statistics
-- (a new outbox) PostgreSQL otherwise took other indexes, walking every unpublished row once
-- per failed row.
WITH floors AS (
    SELECT * FROM unnest($1::int[], $2::bigint[]) AS f(shard, floor)
), ahead AS (
    SELECT coalesce(sum(o.n), 0)::bigint AS n, min(o.oldest) AS oldest, max(o.attempts) AS attempts
    FROM floors f
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(created_at) AS oldest, max(publish_attempts) AS attempts
        FROM (SELECT created_at, publish_attempts
              FROM {schema}.outbox
              WHERE shard = f.shard
                AND seq >= f.floor
                AND published_at IS NULL
                AND dead_at IS NULL
                AND next_retry_at IS NULL
              -- In seq order: outbox_ready's range from the floor.
              ORDER BY seq
              LIMIT 10000000) ready) o
), failed AS MATERIALIZED (
    SELECT f.shard, f.floor, p.aggregate_id, p.version, p.dead_at, p.created_at, p.publish_attempts
    FROM floors f
    CROSS JOIN LATERAL (
        SELECT aggregate_id, version, dead_at, created_at, publish_attempts
        FROM {schema}.outbox
        WHERE shard = f.shard
          AND published_at IS NULL
          AND (dead_at IS NOT NULL OR next_retry_at IS NOT NULL)
        OFFSET 0) p
), behind AS (
    -- Never-failed rows below their shard's floor behind their key's first failed row.
    SELECT coalesce(sum(b.n), 0)::bigint AS n, min(b.oldest) AS oldest, max(b.attempts) AS attempts
    FROM (SELECT DISTINCT ON (shard, aggregate_id) shard, floor, aggregate_id, version
          FROM failed
          ORDER BY shard, aggregate_id, version) p
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, min(created_at) AS oldest, max(publish_attempts) AS attempts
        FROM (SELECT created_at, publish_attempts
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
              LIMIT 10000000) waiting) b
), retrying AS (
    SELECT count(*) AS n, min(created_at) AS oldest, max(publish_attempts) AS attempts
    FROM failed
    WHERE dead_at IS NULL
)
SELECT ahead.n + behind.n + retrying.n,
       (SELECT count(*) FROM failed WHERE dead_at IS NOT NULL),
       coalesce(greatest(ahead.attempts, behind.attempts, retrying.attempts), 0),
       coalesce(extract(epoch FROM now() - least(ahead.oldest, behind.oldest, retrying.oldest)), 0)::float8
FROM ahead, behind, retrying
