-- Records failed publishes: the error, either a retry time or death, and one more attempt
-- unless the failure was the broker's (slow, unreachable, overloaded), which is not the row's.
-- (`published_at IS NULL`: see mark_published.sql.)
UPDATE {schema}.outbox o
SET publish_attempts = o.publish_attempts + CASE WHEN f.counts THEN 1 ELSE 0 END,
    last_error = f.error,
    next_retry_at = f.retry_at,
    dead_at = CASE WHEN f.dead THEN now() END,
    lock_token = NULL,
    locked_at = NULL
FROM UNNEST($1::bigint[], $2::text[], $3::timestamptz[], $4::boolean[], $5::boolean[])
    AS f(seq, error, retry_at, dead, counts)
WHERE o.seq = f.seq AND o.lock_token = $6 AND o.published_at IS NULL
