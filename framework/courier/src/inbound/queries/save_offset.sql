-- Moves a lane's position forward in the projection's transaction; never backwards.
-- $1 group, $2 lane, $3 subscription, $4 message id, $5 publish time, $6 lag ms, $7 instance.
-- A plain UPDATE first: when the lane is already further (messages of different keys arrive
-- out of publish order, so most saves move nothing) it skips the row without locking it. An
-- INSERT … ON CONFLICT DO UPDATE locks the row even when its WHERE is false, which made
-- concurrent projection transactions of a lane wait for each other's commits.
-- The INSERT runs only for a lane that has no row yet.
WITH moved AS (
    UPDATE {schema}.consumer_offsets
    SET subscription = $3, message_id = $4, publish_time = $5, lag_millis = $6,
        updated_at = now(), updated_by = $7
    WHERE consumer_group = $1 AND lane = $2 AND publish_time <= $5
    RETURNING 1
)
INSERT INTO {schema}.consumer_offsets AS o
    (consumer_group, lane, subscription, message_id, publish_time, lag_millis, updated_at, updated_by)
SELECT $1, $2, $3, $4, $5, $6, now(), $7
WHERE NOT EXISTS (SELECT 1 FROM moved)
  AND NOT EXISTS (SELECT 1 FROM {schema}.consumer_offsets WHERE consumer_group = $1 AND lane = $2)
ON CONFLICT (consumer_group, lane) DO UPDATE
SET subscription = EXCLUDED.subscription,
    message_id   = EXCLUDED.message_id,
    publish_time = EXCLUDED.publish_time,
    lag_millis   = EXCLUDED.lag_millis,
    updated_at   = EXCLUDED.updated_at,
    updated_by   = EXCLUDED.updated_by
WHERE o.publish_time <= EXCLUDED.publish_time
