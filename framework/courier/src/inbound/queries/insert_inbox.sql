-- Records the events of one projection transaction; returns the ids seen for the first time.
-- $1 consumer group, $2 event ids, $3 their publish times.
INSERT INTO {schema}.inbox (consumer_group, event_id, publish_time)
SELECT $1, e.event_id, e.publish_time
FROM unnest($2::uuid[], $3::timestamptz[]) AS e(event_id, publish_time)
ON CONFLICT (consumer_group, event_id) DO NOTHING
RETURNING event_id
