-- Gives dead rows ($1 ids, or every dead row when $2) a fresh start — attempts, retry time and
-- error cleared — so the claimer publishes them again, and records who ($3) did it and why ($4).
WITH retried AS (
    UPDATE {schema}.outbox
    SET dead_at = NULL, publish_attempts = 0, next_retry_at = NULL, last_error = NULL,
        lock_token = NULL, locked_at = NULL
    WHERE published_at IS NULL AND dead_at IS NOT NULL AND ($2 OR id = ANY($1))
    RETURNING id, aggregate_id, version, shard
), audited AS (
    INSERT INTO {schema}.outbox_operator_actions (event_id, aggregate_id, version, action, reason, actor)
    SELECT id, aggregate_id, version, 'retry', $4, $3 FROM retried
)
SELECT id, aggregate_id, version, shard FROM retried
