-- Starts a run for aggregate type $1 unless one is unfinished (then returns nothing).
INSERT INTO {schema}.backfill_runs (aggregate_type, batch_size, started_by, reason)
VALUES ($1, $2, $3, $4)
ON CONFLICT (aggregate_type) WHERE finished_at IS NULL DO NOTHING
RETURNING run_id, aggregate_type, cursor, emitted, batches, batch_size, started_at, started_by,
          reason, updated_at, finished_at
