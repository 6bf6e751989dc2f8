-- One service's pipeline at a glance, from its own schema: publish rate over the last minute,
-- live relays, and what its consumers applied over the last minute (the backlog is read from
-- the shards' floors: relay/queries/backlog.sql).
SELECT
    (SELECT count(*) FROM {schema}.outbox
       WHERE published_at > now() - interval '1 minute' AND skipped_at IS NULL) AS published_last_minute,
    (SELECT count(*) FROM {schema}.relay_instances
       WHERE heartbeat_at > now() - make_interval(secs => $1)) AS live_relays,
    (SELECT count(*) FROM {schema}.relay_instances
       WHERE started_at > now() - interval '1 hour') AS relays_started_last_hour,
    (SELECT count(*) FROM {schema}.inbox WHERE processed_at > now() - interval '1 minute') AS applied_last_minute
