-- Locks run $1 for one batch: concurrent runners of the same run take turns, and each reads
-- the cursor the previous batch committed.
SELECT cursor, finished_at IS NOT NULL AS finished
FROM {schema}.backfill_runs
WHERE run_id = $1
FOR UPDATE
