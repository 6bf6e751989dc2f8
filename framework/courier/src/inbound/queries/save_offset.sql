-- Moves a lane's position forward in the projection's transaction; never backwards.
-- $1 group, $2 lane, $3 subscription, $4 message id, $5 publish time, $6 lag ms, $7 instance.
INSERT INTO {schema}.consumer_offsets AS o
    (consumer_group, lane, subscription, message_id, publish_time, lag_millis, updated_at, updated_by)
VALUES ($1, $2, $3, $4, $5, $6, now(), $7)
ON CONFLICT (consumer_group, lane) DO UPDATE
SET subscription = EXCLUDED.subscription,
    message_id   = EXCLUDED.message_id,
    publish_time = EXCLUDED.publish_time,
    lag_millis   = EXCLUDED.lag_millis,
    updated_at   = EXCLUDED.updated_at,
    updated_by   = EXCLUDED.updated_by
WHERE o.publish_time <= EXCLUDED.publish_time
