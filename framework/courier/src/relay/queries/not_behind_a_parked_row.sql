-- Candidate `o` of shard $1 is not behind a parked row of its key: no earlier unpublished
-- version of the key is dead or failed with its retry not yet due (outbox_parked holds only
-- such rows). Written into claim.sql (both candidate walks) and claim_floor.sql, always in an
-- OR behind a check that the shard has a parked row at all (see claim.sql).
NOT EXISTS (
    SELECT 1
    FROM {schema}.outbox e
    WHERE e.shard = $1
      AND e.aggregate_id = o.aggregate_id
      AND e.version < o.version
      AND e.published_at IS NULL
      AND (e.dead_at IS NOT NULL OR e.next_retry_at IS NOT NULL)
      AND (e.dead_at IS NOT NULL OR e.next_retry_at > now()))
