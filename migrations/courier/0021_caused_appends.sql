-- An append caused by an event is idempotent: the same version of an aggregate appended again
-- with the same causation_id is a replay (a redelivered or Seek-replayed cause re-running the
-- projection that emitted it), and is skipped instead of refused. A rebuild of an emitting
-- projection then re-emits nothing and dead-letters nothing.
--
-- * outbox_versions.causation_id: the cause an append recorded with the version (NULL for
--   appends without one). Kept as long as the version: retention.version_hours, by default
--   the 7 days Pub/Sub retains messages, so as far back as a Seek can replay.
-- * outbox_versions_caused: the arbiter of the caused appends' ON CONFLICT … DO NOTHING
--   (outbox/queries/record_caused_versions.sql). Partial: appends without a cause write no
--   entry into it. A caused append of a version recorded with another cause, or with none,
--   finds no conflict here and is refused by the primary key as before (23505).
ALTER TABLE outbox_versions ADD COLUMN causation_id text;
CREATE UNIQUE INDEX outbox_versions_caused ON outbox_versions (aggregate_id, version, causation_id)
    WHERE causation_id IS NOT NULL;
