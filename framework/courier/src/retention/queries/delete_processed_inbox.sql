-- Deletes up to $2 inbox rows processed more than $1 hours ago (through inbox_processed_at).
DELETE FROM {schema}.inbox
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.inbox
    WHERE processed_at < now() - make_interval(hours => $1)
    LIMIT $2))
