-- outbox_unpublished_by_shard (0001) served claims in seq order; since 0009 they read
-- outbox_ready and outbox_retrying. Kept, it misled the planner: with a generic plan the
-- claim's branch for due retries (`next_retry_at <= now()`, whose selectivity a generic plan
-- cannot know) walked it in seq order, fetching each of the shard's unpublished rows, in
-- flight included, to find the few due ones, on every claim (load-tests: throughput, 1,000
-- keys: ~2 such walks a claim, 68 heap fetches each, against 30 rows read by the claim's
-- own scan of outbox_ready). Without it that branch reads outbox_retrying; counting the
-- backlog reads outbox_unpublished_versions; and each append writes one index entry fewer.
DROP INDEX outbox_unpublished_by_shard;
