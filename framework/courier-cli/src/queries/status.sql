-- One service's pipeline at a glance, from its own schema: outbox backlog, publish rate over
-- the last minute, live relays, and what its consumers applied over the last minute.
SELECT
    (SELECT count(*) FROM {schema}.outbox WHERE published_at IS NULL AND dead_at IS NULL) AS pending,
    (SELECT count(*) FROM {schema}.outbox WHERE published_at IS NULL AND dead_at IS NOT NULL) AS dead,
    (SELECT coalesce(extract(epoch FROM now() - min(created_at)), 0)::float8
       FROM {schema}.outbox WHERE published_at IS NULL AND dead_at IS NULL) AS oldest_pending_secs,
    (SELECT count(*) FROM {schema}.outbox
       WHERE published_at > now() - interval '1 minute' AND skipped_at IS NULL) AS published_last_minute,
    (SELECT count(*) FROM {schema}.relay_instances
       WHERE heartbeat_at > now() - make_interval(secs => $1)) AS live_relays,
    (SELECT count(*) FROM {schema}.relay_instances
       WHERE started_at > now() - interval '1 hour') AS relays_started_last_hour,
    (SELECT count(*) FROM {schema}.inbox WHERE processed_at > now() - interval '1 minute') AS applied_last_minute
