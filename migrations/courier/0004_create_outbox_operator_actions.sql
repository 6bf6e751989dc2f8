-- What operators do to dead outbox rows, and the mark a skip leaves.

-- A skipped row counts as published (so it no longer blocks its key's later versions) but was
-- never sent; it keeps dead_at and last_error for the record.
ALTER TABLE outbox ADD COLUMN skipped_at timestamptz;

-- Every retry or skip of a dead row: which event, what, why, who, when.
CREATE TABLE outbox_operator_actions (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id     uuid        NOT NULL,
    aggregate_id text        NOT NULL,
    version      bigint      NOT NULL,
    action       text        NOT NULL CHECK (action IN ('retry', 'skip')),
    reason       text        NOT NULL,
    actor        text        NOT NULL,
    acted_at     timestamptz NOT NULL DEFAULT now()
);
