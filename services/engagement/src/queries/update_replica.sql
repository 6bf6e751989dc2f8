-- Applies a VideoUpdated: absent fields ($2–$4 NULL) keep their value; an older or equal
-- version changes nothing.
UPDATE videos_replica
SET title = COALESCE($2, title),
    duration_secs = COALESCE($3, duration_secs),
    status = COALESCE($4, status),
    version = $5,
    replicated_at = now()
WHERE video_id = $1 AND version < $5
