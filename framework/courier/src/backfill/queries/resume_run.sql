-- Records the batch size a resumed run $1 goes on with.
UPDATE {schema}.backfill_runs SET batch_size = $2, updated_at = now()
WHERE run_id = $1
