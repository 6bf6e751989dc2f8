-- A dead letter sent back to its topic: audited in dead_letter_republishes (who $6, why $7) and
-- closed in the log (message $2 from subscription $1), in one statement. Returns the log rows
-- it closed (none when the letter was not this schema's or was closed already).
WITH audited AS (
    INSERT INTO {schema}.dead_letter_republishes
        (subscription, message_id, event_id, ordering_key, dead_reason, republished_by, reason)
    VALUES ($1, $2, $3, $4, $5, $6, $7)
)
UPDATE {schema}.dead_letter_log SET republished_at = now()
WHERE subscription = $1 AND message_id = $2 AND republished_at IS NULL
