-- A lane's position is appended, no longer rewritten in place (P9).
--
-- Every projection transaction updated its lane's row in consumer_offsets. While a long
-- transaction pins the xmin horizon no version of that row can be removed, and each save then
-- walked the lane's whole chain of dead versions: its cost grew with the saves since the pin.
-- A save now inserts an entry when it moves the lane forward, and nothing otherwise; readers
-- take a lane's newest entry with a backward index scan, which meets the live entry first and
-- never the dead ones below it. The saves delete a lane's older entries now and then
-- (inbound/offsets.rs), a range at a time, so no statement walks what the pin keeps either.
--
-- * consumer_offset_log: a lane's entries. reset_id is the consumer_offset_resets row an entry
--   descends from (0 before any reset): a reset appends an entry per lane under its id, which
--   ranks above every entry of an earlier id, however late their publish time, and saves
--   continue under the reset_id of the entry they moved past. No unique key: two projection
--   transactions saving one lane at one publish time must not wait for each other.
--   consumer_group compares byte-wise (COLLATE "C"): every save's index probe and insert
--   compares it, and the order of group names means nothing.
-- * consumer_offsets: a view with the table's old columns, a lane's current entry.
CREATE TABLE consumer_offset_log (
    consumer_group text        COLLATE "C" NOT NULL,
    lane           integer     NOT NULL CHECK (lane >= 0),
    reset_id       bigint      NOT NULL DEFAULT 0,
    publish_time   timestamptz NOT NULL,
    subscription   text        NOT NULL,
    message_id     text,
    lag_millis     bigint      NOT NULL DEFAULT 0,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    updated_by     text        NOT NULL
);

-- Ascending, read backwards: a lane's newest entry is the first one a backward scan meets.
CREATE INDEX consumer_offset_log_position
    ON consumer_offset_log (consumer_group, lane, reset_id, publish_time);

-- No unique index identifies an entry: logical replication (wal_level = logical only) is to
-- identify a pruned entry by its whole row, as it does the outbox's (0015).
ALTER TABLE consumer_offset_log REPLICA IDENTITY FULL;

INSERT INTO consumer_offset_log
    (consumer_group, lane, reset_id, publish_time, subscription, message_id, lag_millis,
     updated_at, updated_by)
SELECT consumer_group, lane, 0, publish_time, subscription, message_id, lag_millis,
       updated_at, updated_by
FROM consumer_offsets;

DROP TABLE consumer_offsets;

CREATE VIEW consumer_offsets AS
SELECT DISTINCT ON (consumer_group, lane)
       consumer_group, lane, subscription, message_id, publish_time, lag_millis, updated_at,
       updated_by
FROM consumer_offset_log
ORDER BY consumer_group, lane, reset_id DESC, publish_time DESC;
