SELECT views, liked, position_secs, completed, version
FROM engagements
WHERE video_id = $1 AND user_id = $2
FOR UPDATE
