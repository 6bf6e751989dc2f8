-- The ordering keys among each relay's rows in flight, written with its heartbeat so
-- `courier status` can show them: each key out is one publish request asked of the relay's
-- connection, and with a key per row the publish limit stops where they fill it
-- (outbox/keys_out.rs, outbox/publish_limit.rs). NULL until the first beat.
ALTER TABLE relay_instances
    ADD COLUMN publish_keys_out integer;
