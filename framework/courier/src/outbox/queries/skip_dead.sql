-- Marks dead row $1 skipped: it counts as published, so its key's later versions flow again,
-- but it is never sent. Records who ($2) did it and why ($3).
WITH skipped AS (
    UPDATE {schema}.outbox
    SET published_at = now(), skipped_at = now(), lock_token = NULL, locked_at = NULL
    WHERE id = $1 AND published_at IS NULL AND dead_at IS NOT NULL
    RETURNING id, aggregate_id, version, shard
), audited AS (
    INSERT INTO {schema}.outbox_operator_actions (event_id, aggregate_id, version, action, reason, actor)
    SELECT id, aggregate_id, version, 'skip', $3, $2 FROM skipped
)
SELECT id, aggregate_id, version, shard FROM skipped
