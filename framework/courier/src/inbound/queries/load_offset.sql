-- A group's position: its newest lane (what was processed last) and its oldest lane.
WITH RECURSIVE positions AS ({positions})
SELECT max(subscription) AS subscription,
       (array_agg(message_id ORDER BY publish_time DESC))[1] AS message_id,
       max(publish_time) AS newest_publish_time,
       min(publish_time) AS oldest_publish_time,
       max(lag_millis) AS max_lag_millis,
       max(updated_at) AS updated_at,
       count(*) AS lanes
FROM positions
HAVING count(*) > 0
