-- Rewinds (or forwards) every lane of a group to $3 and forgets the inbox rows of the events
-- that the Seek will replay, so they are applied again; audited in consumer_offset_resets.
-- $1 group, $2 subscription, $3 new publish time, $4 who, $5 why.
WITH old AS (
    SELECT max(publish_time) AS publish_time
    FROM {schema}.consumer_offsets WHERE consumer_group = $1
), forgotten AS (
    DELETE FROM {schema}.inbox WHERE consumer_group = $1 AND publish_time >= $3
    RETURNING 1
), restarted AS (
    -- Contiguous projections: keys whose first event is replayed start again from it; keys
    -- older than $3 keep their version, so their replayed events have no second effect.
    DELETE FROM {schema}.projection_versions WHERE consumer_group = $1 AND first_publish_time >= $3
), moved AS (
    UPDATE {schema}.consumer_offsets
    SET publish_time = $3, message_id = NULL, updated_at = now(), updated_by = $4
    WHERE consumer_group = $1
    RETURNING 1
)
INSERT INTO {schema}.consumer_offset_resets
    (consumer_group, subscription, old_publish_time, new_publish_time, inbox_rows_forgotten, reset_by, reason)
SELECT $1, $2, old.publish_time, $3, (SELECT count(*) FROM forgotten), $4, $5
FROM old
RETURNING id, old_publish_time, inbox_rows_forgotten, (SELECT count(*) FROM moved) AS lanes_moved
