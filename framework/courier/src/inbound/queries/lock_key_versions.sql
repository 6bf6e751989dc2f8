-- Locks keys $2 of group $1 for the transaction, so one projection transaction of a key at a
-- time reads and moves its version (0019_append_key_versions.sql). In key order, so concurrent
-- transactions cannot deadlock here. A key not seen yet has no row: two first transactions of
-- it meet at the insert of its row (advance_key_version.sql).
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.projection_keys
    WHERE consumer_group = $1 AND routing_key = ANY($2)
    ORDER BY routing_key
    FOR UPDATE
) AS locked
