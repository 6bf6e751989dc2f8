-- Marks rows published. The lock token guard makes a stale owner's mark a no-op;
-- `published_at IS NULL` (true of every claimed row) lets it use outbox_unpublished_seq.
UPDATE {schema}.outbox
SET published_at = now(),
    publish_attempts = publish_attempts + 1,
    lock_token = NULL,
    locked_at = NULL,
    next_retry_at = NULL,
    last_error = NULL
WHERE seq = ANY($1::bigint[]) AND lock_token = $2 AND published_at IS NULL
