-- Gives back rows that were not tried because an earlier row of their key failed; no attempt
-- is counted against them. Found at the addresses their claim left them at, guarded by the
-- claimer's token alone, as mark_published.sql explains.
UPDATE {schema}.outbox
SET lock_token = NULL, locked_at = NULL
WHERE ctid = ANY($1::tid[]) AND lock_token = $2
