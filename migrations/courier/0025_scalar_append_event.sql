-- append_event without arrays (issue 57: the SQL append within 10 % of Outbox::append).
--
-- Since 0020 append_event has wrapped its event in one-element arrays and called append_events.
-- Per call that cost some 130 µs of CPU more than Outbox::append's statement (pgbench, each
-- append its own transaction): the wrapper's call, the batch's length checks, its loop over the
-- events, an array of ids and of causes built an element at a time, and a ten-array UNNEST
-- whose generic plan PostgreSQL keeps only when told to (its estimate is ten rows a
-- parameter). Written for one event, with scalar parameters, the same checks, ledger, row and
-- wake-up cost about 50 µs more than Outbox::append's statement: what Outbox::append does in
-- the client (the checks ~14 µs, the shard's FNV-1a hash ~10 for a 12-byte id: shard_of loops
-- over the id's bytes in PL/pgSQL), the search_path switch ~6 and the call ~16.
--
-- Unchanged: the checks (outbox_plainly_valid, then outbox_check_event for an event it does not
-- pass, so errors keep their words and "event 1 of 1 in the call"), the shard count read in
-- the insert (55000 while none is recorded), the ledger's insert before the row's (the
-- transaction has its id before the row takes its seq: insert_events.sql), the NOTIFY of an
-- idle shard. An event that names its cause (causation_id) still goes through append_events,
-- which records the cause and tells a replay (NULL) from a conflict.
SELECT set_config('search_path', current_setting('search_path') || ', pg_temp', true);

CREATE OR REPLACE FUNCTION append_event(
    topic          text,
    aggregate_type text,
    aggregate_id   text,
    event_type     text,
    version        bigint,
    payload        bytea,
    attributes     jsonb       DEFAULT '{}',
    schema_version integer     DEFAULT 1,
    event_id       uuid        DEFAULT NULL,
    occurred_at    timestamptz DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT
AS $$
DECLARE
    new_id uuid;
    woken bigint;
BEGIN
    IF attributes ->> 'causation_id' IS NOT NULL THEN
        RETURN (append_events(ARRAY[topic], ARRAY[aggregate_type], ARRAY[aggregate_id],
            ARRAY[event_type], ARRAY[version], ARRAY[payload], ARRAY[attributes],
            ARRAY[schema_version], ARRAY[event_id], ARRAY[occurred_at]))[1];
    END IF;
    IF NOT coalesce(outbox_plainly_valid(topic, aggregate_type, aggregate_id, event_type,
            version, schema_version, payload, attributes), false) THEN
        PERFORM outbox_check_event(1, 1, topic, aggregate_type, aggregate_id, event_type,
            version, schema_version, payload, attributes, occurred_at);
    END IF;
    new_id := coalesce(event_id, new_event_id());
    WITH recorded AS (
        INSERT INTO outbox_versions (aggregate_id, version)
        VALUES (append_event.aggregate_id, append_event.version)
        RETURNING 1
    ), inserted AS (
        INSERT INTO outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                            version, schema_version, payload, attributes, occurred_at)
        SELECT new_id,
               shard_of(append_event.aggregate_id,
                        coalesce((SELECT s.shard_count FROM outbox_settings s), outbox_shard_count())),
               append_event.topic, append_event.aggregate_type, append_event.aggregate_id,
               append_event.event_type, append_event.version,
               coalesce(append_event.schema_version, 1), append_event.payload,
               jsonb_strip_nulls(coalesce(append_event.attributes, '{}')),
               coalesce(append_event.occurred_at, clock_timestamp())
        WHERE EXISTS (SELECT 1 FROM recorded)
        RETURNING shard
    )
    SELECT count(pg_notify(current_schema() || '_outbox_wake', s.shard::text)) INTO woken
    FROM inserted s
    WHERE (SELECT f.idle
           FROM outbox_idle_flags f
           WHERE f.shard = s.shard
           ORDER BY f.flag_seq DESC
           LIMIT 1);
    RETURN new_id;
END
$$;
