-- A version of an aggregate is appended once: that rule moves from the outbox's
-- UNIQUE (aggregate_id, version) to a ledger written only by appends.
--
-- Marking a row published is a non-HOT update (every partial index names published_at), and
-- a unique index over every row took an entry for each marked row version, checked against
-- the row's previous version (a heap fetch). With a random key per aggregate (a fresh UUID
-- per entity) that entry was most of a mark: in a SQL loop marking 200,000 claimed rows 200
-- at a time, 20–25 µs a row with the constraint and 10–15 without (the same loop's scan for
-- the rows included). The ledger takes the same one entry per event, but at the append, and
-- nothing updates a ledger row, so the relay's mark writes only the published row version
-- and its entry in outbox_published_at.
--
-- * outbox_versions: one row per appended (aggregate_id, version), kept for
--   retention.version_hours after the append (the janitor deletes by appended_at; appends
--   reach that index at its right edge, in time order, not at a random page). A second
--   append of a version is refused while its first is kept, published or not, as before,
--   and now also when retention.outbox_hours = 0 deleted the published row.
-- * Among unpublished rows a version is unique by outbox_unpublished_versions, now a unique
--   index (a row's shard is a function of its aggregate id, so (shard, aggregate_id, version)
--   names one version). It was written by every append already; a mark leaves it alone.
CREATE TABLE outbox_versions (
    aggregate_id text        NOT NULL,
    version      bigint      NOT NULL,
    appended_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (aggregate_id, version)
);
CREATE INDEX outbox_versions_appended_at ON outbox_versions (appended_at);
INSERT INTO outbox_versions (aggregate_id, version, appended_at)
SELECT aggregate_id, version, created_at FROM outbox;

DROP INDEX outbox_unpublished_versions;
CREATE UNIQUE INDEX outbox_unpublished_versions ON outbox (shard, aggregate_id, version)
    WHERE published_at IS NULL;

-- The table's replica identity was the constraint's index (0014). No unique index over all
-- rows is left, so logical decoding (wal_level = logical only) logs whole old rows.
ALTER TABLE outbox REPLICA IDENTITY FULL;
ALTER TABLE outbox DROP CONSTRAINT outbox_aggregate_id_version_key;
