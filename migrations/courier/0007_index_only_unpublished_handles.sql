-- Rows are looked up by handle (seq) only while unpublished: claim, mark published, mark
-- failed, release. The hash index of 0001 held every row, published history included, and a
-- hash index spreads its entries over all of its pages; every claim and mark is a non-HOT
-- update (it changes indexed columns), so each one inserted an entry into a random page of an
-- index as large as the history: evictions and WAL full-page images grew with the history,
-- and the relay drained ~2x slower with 5M published rows in the table (load-tests: drain
-- --history). Keeping only unpublished rows keeps the index as small as the backlog; the
-- queries that use it say `published_at IS NULL` so the planner can. Still a hash index, for
-- the reason 0001 gives (no ordered index on seq besides outbox_unpublished_by_shard).
CREATE INDEX outbox_unpublished_seq ON outbox USING hash (seq) WHERE published_at IS NULL;
DROP INDEX outbox_seq;
