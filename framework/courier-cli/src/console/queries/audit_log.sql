-- The newest $1 operator actions of one schema, from the four audit tables: retries and skips
-- of dead outbox rows, releases of parked keys, resets of consumer offsets, republished dead
-- letters.
SELECT * FROM (
    SELECT acted_at AS at, actor AS by, action, reason,
           format('event %s (%s v%s)', event_id, aggregate_id, version) AS target
    FROM {schema}.outbox_operator_actions
    UNION ALL
    SELECT released_at, released_by,
           CASE WHEN skipped_to IS NULL THEN 'release' ELSE format('release, skip to v%s', skipped_to) END,
           reason,
           format('key %s of %s (%s event(s) republished)', routing_key, consumer_group, events_republished)
    FROM {schema}.parked_key_releases
    UNION ALL
    SELECT reset_at, reset_by, 'offset reset', reason,
           format('%s to %s', consumer_group, new_publish_time)
    FROM {schema}.consumer_offset_resets
    UNION ALL
    SELECT republished_at, republished_by, 'dead letter republished', reason,
           format('message %s (event %s, key %s) of %s', message_id, coalesce(event_id, '?'),
                  ordering_key, subscription)
    FROM {schema}.dead_letter_republishes
) actions
ORDER BY at DESC
LIMIT $1
