-- record_versions.sql for appends some of whose events name their cause ($12, causation ids,
-- NULL where unset): a version already recorded with the same cause is a replay of its
-- append and is skipped (0021_caused_appends.sql), a version recorded with another cause or
-- none is refused by the primary key as always. Returns the versions it recorded, which
-- insert_caused_events.sql writes rows for.
INSERT INTO {schema}.outbox_versions (aggregate_id, version, causation_id)
SELECT * FROM UNNEST($5::text[], $7::bigint[], $12::text[])
ON CONFLICT (aggregate_id, version, causation_id) WHERE causation_id IS NOT NULL DO NOTHING
RETURNING aggregate_id, version
