-- Claims become HOT updates. A claim sets lock_token and locked_at; outbox_blocking named
-- lock_token in its predicate, so every claim was a non-HOT update that inserted an entry into
-- each of the table's five indexes (60 µs of the ~70 µs a claimed row cost; load-tests: drain).
-- Now no index mentions lock_token or locked_at, and pages keep 20 % free for the claim's new
-- row version, so a claim (and a release) rewrites the row in place.
--
-- The head-of-line check of 0001 probed outbox_blocking for two kinds of rows:
-- * parked rows (dead, or waiting for their retry): outbox_parked below, empty while all is well;
-- * rows held by another owner's live claim: those exist only after the shard's claim token
--   changed (a takeover or a restart), until their lease ends. The claim records its token in
--   outbox_shard_state and runs that check only while the shard is contested (claim.sql).
CREATE INDEX outbox_parked ON outbox (shard, aggregate_id, version)
    WHERE published_at IS NULL AND (dead_at IS NOT NULL OR next_retry_at IS NOT NULL);
DROP INDEX outbox_blocking;
ALTER TABLE outbox SET (fillfactor = 80);

-- The token that claimed in the shard last, and until when claims of other tokens may still
-- be live (computed when the token changes: their latest claim + the lease).
ALTER TABLE outbox_shard_state
    ADD COLUMN claim_token uuid,
    ADD COLUMN contested_until timestamptz;
