-- Gives back rows that were not tried because an earlier row of their key failed; no attempt
-- is counted against them. (`published_at IS NULL`: see mark_published.sql.)
UPDATE {schema}.outbox
SET lock_token = NULL, locked_at = NULL
WHERE seq = ANY($1::bigint[]) AND lock_token = $2 AND published_at IS NULL
