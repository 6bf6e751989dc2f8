-- Backfill runs: an operator's pass emitting a full-snapshot event for every aggregate of one
-- type through the outbox. Each batch commits its events together with the run's cursor, so
-- a run stopped at any instant resumes after its last committed batch.
CREATE TABLE backfill_runs (
    run_id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    aggregate_type text        NOT NULL,
    -- The last aggregate id snapshotted (keyset cursor); NULL before the first batch.
    cursor         text,
    -- Snapshots emitted and batches committed so far.
    emitted        bigint      NOT NULL DEFAULT 0,
    batches        bigint      NOT NULL DEFAULT 0,
    -- The batch size of the latest start or resume (informational).
    batch_size     integer     NOT NULL CHECK (batch_size >= 1),
    started_at     timestamptz NOT NULL DEFAULT now(),
    started_by     text        NOT NULL,
    reason         text        NOT NULL DEFAULT '',
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz
);

-- At most one unfinished run per aggregate type: a second start resumes it instead.
CREATE UNIQUE INDEX backfill_runs_one_open ON backfill_runs (aggregate_type)
    WHERE finished_at IS NULL;
