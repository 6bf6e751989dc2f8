-- Parked keys with how many events each holds, oldest first.
SELECT k.consumer_group, k.routing_key, k.subscription, k.expected_version, k.reason, k.parked_at,
       count(e.event_id) AS held_events,
       min(e.version) AS first_held_version,
       max(e.version) AS last_held_version
FROM {schema}.parked_keys k
LEFT JOIN {schema}.parked_events e USING (consumer_group, routing_key)
GROUP BY k.consumer_group, k.routing_key
ORDER BY k.parked_at, k.consumer_group, k.routing_key
