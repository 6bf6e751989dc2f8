SELECT status FROM videos_replica WHERE video_id = $1
