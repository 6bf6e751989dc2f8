SELECT views, liked, position_secs, completed, version, projected_at
FROM video_user_engagements_projection
WHERE video_id = $1 AND user_id = $2
