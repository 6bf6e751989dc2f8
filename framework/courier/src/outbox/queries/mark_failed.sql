-- Records failed publishes: one more attempt, the error, and either a retry time or death.
-- (`published_at IS NULL`: see mark_published.sql.)
UPDATE {schema}.outbox o
SET publish_attempts = o.publish_attempts + 1,
    last_error = f.error,
    next_retry_at = f.retry_at,
    dead_at = CASE WHEN f.dead THEN now() END,
    lock_token = NULL,
    locked_at = NULL
FROM UNNEST($1::bigint[], $2::text[], $3::timestamptz[], $4::boolean[]) AS f(seq, error, retry_at, dead)
WHERE o.seq = f.seq AND o.lock_token = $5 AND o.published_at IS NULL
