-- Claims up to $4 rows of shard $1 for the owner whose lock token is $2, in append order.
-- A row is claimable when it is unpublished, not dead, due, and either unclaimed or claimed by
-- another (earlier) owner whose lease of $3 seconds has expired.
--
-- Head of line: no version may overtake an earlier unpublished one of its key.
-- * Rows behind a parked row (dead, or waiting for its retry) are skipped while choosing
--   candidates, so a parked key never stalls the shard.
-- * Of the first $5 candidates, rows behind a row held by another owner's live claim are left
--   for later (the window bounds that work). Rows behind this owner's own claims are taken:
--   its publishers keep each key in claim order and give back, untried, any row that would
--   overtake a failure not yet recorded here.
-- Both checks probe outbox_blocking, which holds only claimed, retrying and dead rows.
-- Lookups by seq say `published_at IS NULL` (true of every claimed row) so they can use
-- outbox_unpublished_seq, the handle index that holds no history.
WITH candidates AS (
    SELECT o.seq, o.aggregate_id, o.version
    FROM {schema}.outbox o
    WHERE o.shard = $1
      AND o.published_at IS NULL
      AND o.dead_at IS NULL
      AND (o.next_retry_at IS NULL OR o.next_retry_at <= now())
      AND (o.lock_token IS NULL
           OR (o.lock_token <> $2 AND o.locked_at < now() - make_interval(secs => $3)))
      AND NOT EXISTS (
          SELECT 1
          FROM {schema}.outbox e
          WHERE e.shard = $1
            AND e.aggregate_id = o.aggregate_id
            AND e.version < o.version
            AND e.published_at IS NULL
            AND (e.lock_token IS NOT NULL OR e.dead_at IS NOT NULL OR e.next_retry_at IS NOT NULL)
            AND (e.dead_at IS NOT NULL OR e.next_retry_at > now()))
    ORDER BY o.seq
    LIMIT $5
), claimable AS (
    SELECT o.seq
    FROM {schema}.outbox o
    JOIN candidates c ON c.seq = o.seq AND o.published_at IS NULL
    WHERE NOT EXISTS (
          SELECT 1
          FROM {schema}.outbox e
          WHERE e.shard = $1
            AND e.aggregate_id = c.aggregate_id
            AND e.version < c.version
            AND e.published_at IS NULL
            AND (e.lock_token IS NOT NULL OR e.dead_at IS NOT NULL OR e.next_retry_at IS NOT NULL)
            AND e.lock_token IS NOT NULL
            AND e.lock_token <> $2
            AND e.locked_at >= now() - make_interval(secs => $3))
    ORDER BY o.seq
    LIMIT $4
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET lock_token = $2, locked_at = now()
FROM claimable c
WHERE o.seq = c.seq AND o.published_at IS NULL
RETURNING o.seq, o.id, o.topic, o.aggregate_type, o.aggregate_id, o.event_type, o.version,
          o.schema_version, o.payload, o.attributes, o.occurred_at, o.publish_attempts
