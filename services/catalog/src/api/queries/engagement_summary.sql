SELECT count(*) AS viewers,
       COALESCE(sum(views), 0)::bigint AS views,
       count(*) FILTER (WHERE liked) AS likes,
       count(*) FILTER (WHERE completed) AS completions
FROM video_user_engagements_projection
WHERE video_id = $1
