-- Records a batch of run $1: its last aggregate id $2 and its $3 snapshots.
UPDATE {schema}.backfill_runs
SET cursor = $2, emitted = emitted + $3, batches = batches + 1, updated_at = now()
WHERE run_id = $1
RETURNING emitted
