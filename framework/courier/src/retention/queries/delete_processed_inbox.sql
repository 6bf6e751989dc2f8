-- Deletes up to $2 inbox rows processed more than $1 hours ago (through inbox_processed_at),
-- oldest first, from processed_at $3 on (where the janitor's previous batch stopped; NULL:
-- from the oldest); returns how many it deleted and the newest processed_at among them. Why
-- $3: see delete_published_outbox.sql.
WITH deleted AS (
    DELETE FROM {schema}.inbox
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {schema}.inbox
        WHERE processed_at >= COALESCE($3::timestamptz, '-infinity')
          AND processed_at < now() - make_interval(hours => $1)
        ORDER BY processed_at
        LIMIT $2))
    RETURNING processed_at)
SELECT count(*), max(processed_at) FROM deleted
