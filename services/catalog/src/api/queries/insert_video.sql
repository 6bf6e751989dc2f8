INSERT INTO videos (video_id, uploader_id, title, description, duration_secs, published_at, status, version)
VALUES ($1, $2, $3, $4, $5, $6, $7, 1)
