-- The body of `WITH RECURSIVE positions AS (…)` in the offset queries: each lane of group $1
-- with its position, the lane's newest entry in consumer_offset_log (0018_append_offsets.sql).
-- A skip scan: one backward index probe per lane, from the highest lane down, each meeting the
-- next lane's newest entry first, so no reader walks the older (possibly dead) entries.
(SELECT lane, subscription, message_id, publish_time, lag_millis, updated_at
 FROM {schema}.consumer_offset_log
 WHERE consumer_group = $1
 ORDER BY lane DESC, reset_id DESC, publish_time DESC
 LIMIT 1)
UNION ALL
SELECT next.*
FROM positions p
CROSS JOIN LATERAL (
    SELECT o.lane, o.subscription, o.message_id, o.publish_time, o.lag_millis, o.updated_at
    FROM {schema}.consumer_offset_log o
    WHERE o.consumer_group = $1 AND o.lane < p.lane
    ORDER BY o.lane DESC, o.reset_id DESC, o.publish_time DESC
    LIMIT 1
) next
