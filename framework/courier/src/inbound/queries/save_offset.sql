-- Moves a lane's position forward in the projection's transaction; never backwards.
-- $1 group, $2 lane, $3 subscription, $4 message id, $5 publish time, $6 lag ms, $7 instance,
-- $8 and $9 where this store last saw the lane's newest entry (lane_newest.sql).
-- Appends an entry when $5 is past the lane's newest one, under that entry's reset_id, and
-- nothing otherwise (messages of different keys arrive out of publish order, so many saves
-- move nothing); returns the entry appended. Insert-only: it locks no row, so concurrent
-- projection transactions of a lane never wait for each other's commits, and it reads no
-- entry below the one last seen however many dead ones a pinned horizon keeps
-- (0018_append_offsets.sql).
WITH newest AS (
{newest}
)
INSERT INTO {schema}.consumer_offset_log
    (consumer_group, lane, reset_id, publish_time, subscription, message_id, lag_millis,
     updated_at, updated_by)
SELECT $1, $2, coalesce((SELECT reset_id FROM newest), 0), $5, $3, $4, $6, now(), $7
WHERE NOT EXISTS (SELECT 1 FROM newest WHERE publish_time >= $5)
RETURNING reset_id, publish_time
