UPDATE videos
SET status = 'deleted', deleted_at = $2, deleted_reason = $3, version = $4, updated_at = now()
WHERE video_id = $1
