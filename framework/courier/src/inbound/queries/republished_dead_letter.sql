-- Closes the dead letter of message $2 that came from subscription $1.
UPDATE {schema}.dead_letter_log SET republished_at = now()
WHERE subscription = $1 AND message_id = $2 AND republished_at IS NULL
