UPDATE engagements
SET views = $3, liked = $4, position_secs = $5, completed = $6, version = $7, updated_at = now()
WHERE video_id = $1 AND user_id = $2
