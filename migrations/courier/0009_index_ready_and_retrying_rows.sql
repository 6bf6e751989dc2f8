-- Rows parked for a retry no longer cost the claim. The claim walked
-- outbox_unpublished_by_shard in seq order and fetched, to skip it, every row ahead of the
-- claimable ones that waited for its retry or was dead: with 50,000 rows parked ahead of the
-- others, a claim of 200 rows fetched all 50,000, for 2.3x the buffers and 3 to 5x the time
-- of a claim with none parked (load-tests: claim-cost). It now takes its candidates from two
-- indexes that hold no parked row:
-- * outbox_ready: rows that never failed, in claim order. Unpublished rows only, like
--   outbox_unpublished_by_shard, so no plan can walk published history through it (0001).
-- * outbox_retrying: rows that failed and will be retried, by retry time, so a claim reads
--   only the retries that are due (the work waiting; it sorts them by seq).
-- Dead rows are in neither. Neither names lock_token or locked_at, so claims stay HOT (0008).
-- The price: one more index entry per append, per recorded failure, and per claim that finds
-- no room for the row's new version on its page (claim-cost: +9 % buffers per claim with
-- one shard, none with eight).
CREATE INDEX outbox_ready ON outbox (shard, seq)
    WHERE published_at IS NULL AND dead_at IS NULL AND next_retry_at IS NULL;
CREATE INDEX outbox_retrying ON outbox (shard, next_retry_at)
    WHERE published_at IS NULL AND dead_at IS NULL AND next_retry_at IS NOT NULL;
