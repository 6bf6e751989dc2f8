-- Keeps events of parked key $2 of group $1 (columns as arrays, one element per event).
INSERT INTO {schema}.parked_events
    (consumer_group, routing_key, event_id, version, message_id, ordering_key, attributes, data, publish_time)
SELECT $1, $2, e.event_id, e.version, e.message_id, e.ordering_key, e.attributes, e.data, e.publish_time
FROM unnest($3::uuid[], $4::bigint[], $5::text[], $6::text[], $7::jsonb[], $8::bytea[], $9::timestamptz[])
    AS e(event_id, version, message_id, ordering_key, attributes, data, publish_time)
-- Parked again (a release republished it and the gap is still there): fresh, so the release
-- that republished it does not delete it.
ON CONFLICT (consumer_group, routing_key, event_id) DO UPDATE SET parked_at = now()
