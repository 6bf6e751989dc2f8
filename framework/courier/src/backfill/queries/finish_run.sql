-- Marks run $1 finished (no aggregate left after its cursor).
UPDATE {schema}.backfill_runs SET finished_at = now(), updated_at = now()
WHERE run_id = $1
RETURNING emitted
