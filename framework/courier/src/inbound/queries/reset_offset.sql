-- Rewinds (or forwards) every lane of a group to $3 and forgets the inbox rows of the events
-- that the Seek will replay, so they are applied again; audited in consumer_offset_resets.
-- $1 group, $2 subscription, $3 new publish time, $4 who, $5 why.
-- Each lane gets an entry under the reset's audit id, which ranks above all the lane's
-- entries of earlier ids (0018_append_offsets.sql): readers take it as the lane's position.
WITH RECURSIVE positions AS ({positions}),
forgotten AS (
    DELETE FROM {schema}.inbox WHERE consumer_group = $1 AND publish_time >= $3
    RETURNING 1
), restarted AS (
    -- Contiguous projections: keys whose first event is replayed start again from it; keys
    -- older than $3 keep their version, so their replayed events have no second effect.
    DELETE FROM {schema}.projection_keys WHERE consumer_group = $1 AND first_publish_time >= $3
    RETURNING routing_key
), restarted_versions AS (
    DELETE FROM {schema}.projection_version_log l USING restarted r
    WHERE l.consumer_group = $1 AND l.routing_key = r.routing_key
), audit AS (
    INSERT INTO {schema}.consumer_offset_resets
        (consumer_group, subscription, old_publish_time, new_publish_time, inbox_rows_forgotten, reset_by, reason)
    SELECT $1, $2, (SELECT max(publish_time) FROM positions), $3, (SELECT count(*) FROM forgotten), $4, $5
    RETURNING id, old_publish_time, inbox_rows_forgotten
), moved AS (
    INSERT INTO {schema}.consumer_offset_log
        (consumer_group, lane, reset_id, publish_time, subscription, message_id, lag_millis,
         updated_at, updated_by)
    SELECT $1, p.lane, audit.id, $3, p.subscription, NULL, p.lag_millis, now(), $4
    FROM positions p, audit
    RETURNING 1
)
SELECT id, old_publish_time, inbox_rows_forgotten, (SELECT count(*) FROM moved) AS lanes_moved
FROM audit
