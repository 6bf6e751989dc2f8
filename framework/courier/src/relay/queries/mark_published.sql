-- Marks rows published, found at the addresses their claim left them at
-- (relay/row_address.rs). The lock token guard makes a stale owner's mark a no-op and a
-- reused address match nothing: only a claim sets a token, and every statement that marks a
-- row published clears it in the same update.
--
-- No `published_at IS NULL` here, though the token implies it: that conjunct lets the planner
-- read the rows through any of the partial indexes on unpublished rows, and when few rows are
-- unpublished (a relay keeping up) it judges a full scan of one cheaper than fetching the
-- addresses. Those indexes hold an entry for every row published since the table's last
-- vacuum, so the mark cost 3 ms a call at 500 rows/s (a 2-minute unique-key soak) where the
-- address fetch costs microseconds. Without it no index applies, and the relay's sessions run
-- with seq scans disabled (db::relay_pool), so the plan is a TID scan however the outbox
-- looks when it is planned.
--
-- Addresses joined to their acknowledgements' ages ($3, microseconds before this statement),
-- as mark_failed.sql joins its failures: the plan stays a TID scan per address.
--
-- published_at is when the broker acknowledged the row, not when it was marked (marks are
-- gathered for some milliseconds): the database's now() less the age the relay measured, so it
-- is on the same clock as locked_at however far the relay's clock is off. locked_at stays:
-- when the row was claimed, which nothing reads of a published row but a latency breakdown
-- (committed → claimed → published) and an operator.
UPDATE {schema}.outbox o
SET published_at = now() - p.ack_age_micros * interval '1 microsecond',
    publish_attempts = o.publish_attempts + 1,
    lock_token = NULL,
    next_retry_at = NULL,
    last_error = NULL
FROM UNNEST($1::tid[], $3::int8[]) AS p(address, ack_age_micros)
WHERE o.ctid = p.address AND o.lock_token = $2
