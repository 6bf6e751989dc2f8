SELECT video_id, uploader_id, title, description, duration_secs, published_at, status, version,
       created_at, updated_at, deleted_at, deleted_reason
FROM videos
WHERE video_id = $1
