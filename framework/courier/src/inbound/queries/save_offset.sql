-- Moves a lane's position forward in the projection's transaction; never backwards.
-- $1 group, $2 lane, $3 subscription, $4 message id, $5 publish time, $6 lag ms, $7 instance.
-- Appends an entry when $5 is past the lane's newest one, under that entry's reset_id, and
-- nothing otherwise (messages of different keys arrive out of publish order, so many saves
-- move nothing). Insert-only: it locks no row, so concurrent projection transactions of a
-- lane never wait for each other's commits, and the newest entry, met first by the backward
-- index scan, is the only one it reads however many dead ones a pinned horizon keeps below
-- (0018_append_offsets.sql).
WITH newest AS (
    SELECT reset_id, publish_time FROM {schema}.consumer_offset_log
    WHERE consumer_group = $1 AND lane = $2
    ORDER BY reset_id DESC, publish_time DESC
    LIMIT 1
)
INSERT INTO {schema}.consumer_offset_log
    (consumer_group, lane, reset_id, publish_time, subscription, message_id, lag_millis,
     updated_at, updated_by)
SELECT $1, $2, coalesce((SELECT reset_id FROM newest), 0), $5, $3, $4, $6, now(), $7
WHERE NOT EXISTS (SELECT 1 FROM newest WHERE publish_time >= $5)
