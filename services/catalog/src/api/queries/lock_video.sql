SELECT title, description, duration_secs, status, version
FROM videos
WHERE video_id = $1
FOR UPDATE
