-- Records one dead letter of group $1 (again: a republished message that died once more is
-- open again) and returns how many of the group's dead letters are open.
WITH logged AS (
    INSERT INTO {schema}.dead_letter_log (consumer_group, message_id, subscription, ordering_key, reason)
    VALUES ($1, $2, $3, $4, $5)
    ON CONFLICT (consumer_group, message_id) DO UPDATE
    SET reason = EXCLUDED.reason, dead_lettered_at = now(), republished_at = NULL
    RETURNING republished_at
)
SELECT count(*) + 1 FROM {schema}.dead_letter_log
WHERE consumer_group = $1 AND republished_at IS NULL AND message_id <> $2
