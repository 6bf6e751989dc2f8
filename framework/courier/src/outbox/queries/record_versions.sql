-- Precedes insert_events.sql as `WITH versions AS (<this>) <insert>`: records each appended
-- (aggregate_id, version) in the version ledger, whose primary key refuses a version appended
-- before, published or not (0015_versions_ledger.sql). $5 and $7 are the insert's aggregate
-- ids and versions.
INSERT INTO {schema}.outbox_versions (aggregate_id, version)
SELECT * FROM UNNEST($5::text[], $7::bigint[])
-- The row count the insert waits for (insert_events.sql): this insert gives the transaction its
-- id before any outbox row takes a seq.
RETURNING 1
