-- The unfinished run of aggregate type $1, if any.
SELECT run_id, aggregate_type, cursor, emitted, batches, batch_size, started_at, started_by,
       reason, updated_at, finished_at
FROM {schema}.backfill_runs
WHERE aggregate_type = $1 AND finished_at IS NULL
