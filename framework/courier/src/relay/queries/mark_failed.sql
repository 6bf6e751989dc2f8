-- Records failed publishes: the error, either a retry time or death, and one more attempt
-- unless the failure was the broker's (slow, unreachable, overloaded), which is not the row's.
-- Rows are found at the addresses their claim left them at, guarded by the claimer's token
-- alone, as mark_published.sql explains (an index scan of every row published since the last
-- vacuum otherwise).
UPDATE {schema}.outbox o
SET publish_attempts = o.publish_attempts + CASE WHEN f.counts THEN 1 ELSE 0 END,
    last_error = f.error,
    next_retry_at = f.retry_at,
    dead_at = CASE WHEN f.dead THEN now() END,
    lock_token = NULL,
    locked_at = NULL
FROM UNNEST($1::tid[], $2::text[], $3::timestamptz[], $4::boolean[], $5::boolean[])
    AS f(address, error, retry_at, dead, counts)
WHERE o.ctid = f.address AND o.lock_token = $6
