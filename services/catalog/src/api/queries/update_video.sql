UPDATE videos
SET title = COALESCE($2, title),
    description = COALESCE($3, description),
    duration_secs = COALESCE($4, duration_secs),
    status = COALESCE($5, status),
    version = $6,
    updated_at = now()
WHERE video_id = $1
