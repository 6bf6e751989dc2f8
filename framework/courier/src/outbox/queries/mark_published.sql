-- Marks rows published, found at the addresses their claim left them at
-- (outbox/row_address.rs). The lock token guard makes a stale owner's mark a no-op, and with
-- `published_at IS NULL` makes a reused address match nothing.
UPDATE {schema}.outbox
SET published_at = now(),
    publish_attempts = publish_attempts + 1,
    lock_token = NULL,
    locked_at = NULL,
    next_retry_at = NULL,
    last_error = NULL
WHERE ctid = ANY($1::tid[]) AND lock_token = $2 AND published_at IS NULL
