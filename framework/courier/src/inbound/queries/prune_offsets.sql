-- Deletes the entries of lane $2 of group $1 below the lane's newest one, from ($3, $4) up
-- (reset_id, publish time: where this process pruned before; NULL, NULL: from the start), and
-- returns the newest entry, which it keeps ($5, $6: where this store last saw it, as
-- lane_newest.sql reads it). Bounded below, so it does not walk again the dead entries that
-- earlier prunes left to a pinned horizon. SKIP LOCKED: two prunes of a lane never wait for
-- each other, and saves insert only, so nothing else locks these rows.
WITH newest AS (
{newest}
), pruned AS (
    DELETE FROM {schema}.consumer_offset_log
    WHERE consumer_group = $1 AND lane = $2
      AND (reset_id, publish_time) >= (coalesce($3::bigint, -1), coalesce($4::timestamptz, '-infinity'))
      AND ctid = ANY(ARRAY(
        SELECT o.ctid FROM {schema}.consumer_offset_log o
        WHERE o.consumer_group = $1 AND o.lane = $2
          AND (o.reset_id, o.publish_time)
              >= (coalesce($3::bigint, -1), coalesce($4::timestamptz, '-infinity'))
          AND (o.reset_id, o.publish_time)
              < ((SELECT reset_id FROM newest), (SELECT publish_time FROM newest))
        FOR UPDATE OF o SKIP LOCKED))
    RETURNING 1
)
SELECT reset_id, publish_time, (SELECT count(*) FROM pruned) AS pruned FROM newest
