INSERT INTO engagements (video_id, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING
