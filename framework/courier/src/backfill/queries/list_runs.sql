-- The latest $1 runs, newest first.
SELECT run_id, aggregate_type, cursor, emitted, batches, batch_size, started_at, started_by,
       reason, updated_at, finished_at
FROM {schema}.backfill_runs
ORDER BY run_id DESC
LIMIT $1
