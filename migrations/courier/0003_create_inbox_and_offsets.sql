-- The read side's bookkeeping: which events a consumer group already applied, and how far it is.

-- One row per (consumer group, event) applied. The projector inserts it in the projection's
-- transaction with ON CONFLICT DO NOTHING: a redelivered or duplicated event finds its row and
-- has no second effect. publish_time lets an offset reset forget exactly the events it replays.
CREATE TABLE inbox (
    consumer_group text        NOT NULL,
    event_id       uuid        NOT NULL,
    publish_time   timestamptz NOT NULL,
    processed_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, event_id)
);

-- Retention deletes by age; a reset deletes what it will replay.
CREATE INDEX inbox_processed_at ON inbox (processed_at);
CREATE INDEX inbox_group_publish_time ON inbox (consumer_group, publish_time);

-- How far a consumer group is, saved in each projection transaction. One row per lane
-- (stable_hash(ordering key) % lanes) rather than per group: every projection transaction
-- updates its offset row, and one row per group would serialize all of them on its row lock.
-- A lane's position only moves forward, except by an audited reset.
CREATE TABLE consumer_offsets (
    consumer_group text        NOT NULL,
    lane           integer     NOT NULL CHECK (lane >= 0),
    subscription   text        NOT NULL,
    message_id     text,
    publish_time   timestamptz NOT NULL,
    lag_millis     bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    updated_by     text        NOT NULL,
    PRIMARY KEY (consumer_group, lane)
);

-- Every reset: who, when, from where to where, and why.
CREATE TABLE consumer_offset_resets (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer_group    text        NOT NULL,
    subscription      text        NOT NULL,
    old_publish_time  timestamptz,
    new_publish_time  timestamptz NOT NULL,
    inbox_rows_forgotten bigint   NOT NULL,
    reset_by          text        NOT NULL,
    reason            text        NOT NULL,
    reset_at          timestamptz NOT NULL DEFAULT now()
);
