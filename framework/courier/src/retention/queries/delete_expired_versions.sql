-- Deletes up to $2 rows of the version ledger appended more than $1 hours ago
-- (retention.version_hours, through outbox_versions_appended_at): a version is refused a
-- second append for as long as its row is kept here (0015_versions_ledger.sql).
DELETE FROM {schema}.outbox_versions
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.outbox_versions
    WHERE appended_at < now() - make_interval(hours => $1)
    LIMIT $2))
