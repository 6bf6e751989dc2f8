-- Deletes up to $2 rows of the version ledger appended more than $1 hours ago
-- (retention.version_hours, through outbox_versions_appended_at), oldest first, from
-- appended_at $3 on (where the janitor's previous batch stopped; NULL: from the oldest);
-- returns how many it deleted and the newest appended_at among them. A version is refused a
-- second append for as long as its row is kept here (0015_versions_ledger.sql). Why $3: see
-- delete_published_outbox.sql.
WITH deleted AS (
    DELETE FROM {schema}.outbox_versions
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {schema}.outbox_versions
        WHERE appended_at >= COALESCE($3::timestamptz, '-infinity')
          AND appended_at < now() - make_interval(hours => $1)
        ORDER BY appended_at
        LIMIT $2))
    RETURNING appended_at)
SELECT count(*), max(appended_at) FROM deleted
