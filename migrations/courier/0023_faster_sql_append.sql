-- The SQL appends (0020_sql_append.sql), faster and idempotent by cause like Outbox::append.
--
-- * Speed (issue 57: within 10 % of Outbox::append). Per call, 0020 ran some thirty PL/pgSQL
--   statements of checks, a function switching search_path for the shard count, and two for
--   each shard (fnv1a_64, shard_of): a GUC switch is a save and restore of the setting, and
--   each statement's expression is prepared again in every transaction. Now an event is first
--   tested by one inlined expression, outbox_plainly_valid, that passes only events every
--   check passes; only an event it does not pass runs the checks one by one
--   (outbox_check_event, 0020's checks unchanged), so errors keep their words. The shard count
--   is read in the insert, fnv1a_64 switches nothing, shard_of and append_event are SQL bodies
--   the planner inlines (BEGIN ATOMIC: names bound at creation, so no search_path is needed).
-- * Caused appends (0021_caused_appends.sql): an event whose attributes name a causation_id is
--   recorded with it in the ledger, and the same version appended again with the same cause
--   is a replay: nothing is written and its element of the returned ids is NULL, where
--   Outbox::append returns Appended { replay: true }. Another cause, or none, is refused by
--   the primary key (23505) as always.
SELECT set_config('search_path', current_setting('search_path') || ', pg_temp', true);

-- fnv1a_64 reads no table and calls only built-ins: it needs no search_path of its own.
ALTER FUNCTION fnv1a_64(text) RESET search_path;

-- shard.rs's shard_of: the hash as an unsigned 64-bit number modulo the count.
CREATE OR REPLACE FUNCTION shard_of(aggregate_id text, shard_count integer) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
BEGIN ATOMIC
    SELECT (mod(fnv1a_64(aggregate_id)::numeric + 18446744073709551616, 18446744073709551616)
            % greatest(shard_count, 1))::integer;
END;

-- True only for an event every check of outbox_check_event passes (it may be false for some
-- valid ones, which the checks then pass): the fast path of append_events.
CREATE FUNCTION outbox_plainly_valid(
    topic text, aggregate_type text, aggregate_id text, event_type text, version bigint,
    schema_version integer, payload bytea, attributes jsonb)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT octet_length(topic) BETWEEN 3 AND 255
       AND topic ~ '^[A-Za-z][A-Za-z0-9._~+%-]*$'
       AND lower(left(topic, 4)) <> 'goog'
       AND aggregate_type ~ '^[^\s\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]'
       AND aggregate_id ~ '^[^\s\u0085\u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]'
       AND event_type ~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$'
       AND version >= 1
       AND coalesce(schema_version, 1) >= 1
       AND (attributes IS NULL OR attributes = '{}'
            OR (jsonb_typeof(attributes) = 'object'
                AND attributes - ARRAY['correlation_id', 'causation_id', 'user_id',
                    'source_service', 'source_version', 'trace_id', 'span_id', 'traceparent'] = '{}'
                AND NOT jsonb_path_exists(attributes, 'strict $.* ? (@.type() != "string" && @.type() != "null")')
                AND octet_length(attributes::text) <= 1024))
       AND greatest(octet_length(aggregate_id), octet_length(aggregate_type), octet_length(event_type)) <= 1024
       AND octet_length(payload) <= 9990000
$$;

-- The checks of one event, each with its own error (outbox_refuse): what append_events runs for
-- an event outbox_plainly_valid does not pass. Returns if the event is valid after all.
CREATE FUNCTION outbox_check_event(
    i integer, total integer, v_topic text, v_type text, v_id text, v_event_type text,
    v_version bigint, v_sv integer, v_payload bytea, v_attrs jsonb, v_at timestamptz)
RETURNS void
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    optional constant text[] := ARRAY['correlation_id', 'causation_id', 'user_id',
        'source_service', 'source_version', 'trace_id', 'span_id', 'traceparent'];
    -- The attributes whose values vary, in the byte order event.rs checks them in.
    sized constant text[] := ARRAY['aggregate_id', 'aggregate_type', 'causation_id',
        'correlation_id', 'event_type', 'source_service', 'source_version', 'span_id',
        'trace_id', 'traceparent', 'user_id'];
    white constant text := E' \t\n\r\x0B\f\u0085\u00A0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200A\u2028\u2029\u202F\u205F\u3000';
    v_all jsonb;
    v_key text;
    v_value jsonb;
    v_text text;
    v_bad text;
    attribute_bytes bigint;
    message_bytes bigint;
    longest integer;
BEGIN
    v_topic := coalesce(v_topic, '');
    v_type := coalesce(v_type, '');
    v_id := coalesce(v_id, '');
    v_event_type := coalesce(v_event_type, '');
    v_sv := coalesce(v_sv, 1);
    v_attrs := coalesce(v_attrs, '{}');
    v_at := coalesce(v_at, clock_timestamp());
    -- event.rs's check_topic_id.
    IF octet_length(v_topic) NOT BETWEEN 3 AND 255 THEN
        PERFORM outbox_refuse('topic', outbox_quote(v_topic) || ' must be 3 to 255 characters', i, total);
    END IF;
    IF v_topic !~ '^[A-Za-z]' THEN
        PERFORM outbox_refuse('topic', outbox_quote(v_topic) || ' must start with a letter', i, total);
    END IF;
    IF lower(left(v_topic, 4)) = 'goog' THEN
        PERFORM outbox_refuse('topic', outbox_quote(v_topic) || ' must not start with "goog"', i, total);
    END IF;
    v_bad := substring(v_topic FROM '[^A-Za-z0-9._~+%-]');
    IF v_bad IS NOT NULL THEN
        PERFORM outbox_refuse('topic', format('%s contains %s; allowed are letters, digits and -_.~+%%',
            outbox_quote(v_topic), '''' || replace(replace(v_bad, '\', '\\'), '''', '\''') || ''''), i, total);
    END IF;
    -- Rust's trim(): Unicode White_Space.
    IF btrim(v_type, white) = '' THEN
        PERFORM outbox_refuse('aggregate_type', 'must not be empty', i, total);
    END IF;
    IF btrim(v_id, white) = '' THEN
        PERFORM outbox_refuse('aggregate_id', 'must not be empty', i, total);
    END IF;
    IF btrim(v_event_type, white) = '' THEN
        PERFORM outbox_refuse('event_type', 'must not be empty', i, total);
    END IF;
    -- attributes.rs's is_event_type.
    IF v_event_type !~ '^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$' THEN
        PERFORM outbox_refuse('event_type', outbox_quote(v_event_type)
            || ' is not a lowercase, dotted name like video.created', i, total);
    END IF;
    IF v_version IS NULL OR v_version < 1 THEN
        PERFORM outbox_refuse('version', format('must be at least 1, got %s', coalesce(v_version::text, 'null')), i, total);
    END IF;
    IF v_sv < 1 THEN
        PERFORM outbox_refuse('schema_version', format('must be at least 1, got %s', v_sv), i, total);
    END IF;
    IF v_payload IS NULL THEN
        PERFORM outbox_refuse('payload', 'must not be null (an empty payload is an empty bytea)', i, total);
    END IF;
    -- The optional attributes: known keys with string values; null means unset.
    IF jsonb_typeof(v_attrs) <> 'object' THEN
        PERFORM outbox_refuse('attributes', 'must be a JSON object of strings, got ' || jsonb_typeof(v_attrs), i, total);
    END IF;
    -- Pub/Sub's limits on the attributes the relay publishes (attributes.rs's build): the
    -- bytes of every name and value, and the longest value.
    attribute_bytes := octet_length('aggregate_id') + octet_length(v_id)
        + octet_length('aggregate_type') + octet_length(v_type)
        + octet_length('event_type') + octet_length(v_event_type);
    longest := greatest(octet_length(v_id), octet_length(v_type), octet_length(v_event_type));
    FOR v_key, v_value IN SELECT key, value FROM jsonb_each(v_attrs) ORDER BY key COLLATE "C" LOOP
        IF NOT v_key = ANY (optional) THEN
            PERFORM outbox_refuse('attributes', format('unknown attribute %s; allowed are %s',
                outbox_quote(v_key), array_to_string(optional, ', ')), i, total);
        END IF;
        IF jsonb_typeof(v_value) NOT IN ('string', 'null') THEN
            PERFORM outbox_refuse(v_key, 'must be a string, got ' || jsonb_typeof(v_value), i, total);
        END IF;
        IF jsonb_typeof(v_value) = 'string' THEN
            v_text := v_value #>> '{}';
            attribute_bytes := attribute_bytes + octet_length(v_key) + octet_length(v_text);
            longest := greatest(longest, octet_length(v_text));
        END IF;
    END LOOP;
    IF longest > 1024 THEN
        -- The first too long in the attributes' byte order, as event.rs reports it.
        v_all := jsonb_strip_nulls(v_attrs) || jsonb_build_object('aggregate_id', v_id,
            'aggregate_type', v_type, 'event_type', v_event_type);
        FOREACH v_key IN ARRAY sized LOOP
            v_text := v_all ->> v_key;
            IF octet_length(v_text) > 1024 THEN
                PERFORM outbox_refuse(v_key, format('is %s bytes; Pub/Sub allows at most 1024',
                    octet_length(v_text)), i, total);
            END IF;
        END LOOP;
    END IF;
    attribute_bytes := attribute_bytes
        + octet_length('event_id') + 36
        + octet_length('version') + octet_length(v_version::text)
        + octet_length('occurred_at')
        + octet_length(to_char(v_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'))
        + octet_length('schema_version') + octet_length('v' || v_sv);
    message_bytes := octet_length(v_payload) + attribute_bytes;
    IF message_bytes > 10000000 THEN
        PERFORM outbox_refuse('payload', format('message would be %s bytes (payload %s + attributes %s); '
            'Pub/Sub allows at most 10000000', message_bytes, octet_length(v_payload), attribute_bytes), i, total);
    END IF;
END
$$;

-- append_events as in 0020 (validated all first, the ledger, the rows, the NOTIFY of each idle
-- shard among theirs), with the fast path above and the caused form: when some event names its
-- cause, the ledger records it and skips a replay (record_caused_versions.sql), and the rows
-- are written for the versions recorded (insert_caused_events.sql).
CREATE OR REPLACE FUNCTION append_events(
    topics          text[],
    aggregate_types text[],
    aggregate_ids   text[],
    event_types     text[],
    versions        bigint[],
    payloads        bytea[],
    attributes      jsonb[]       DEFAULT NULL,
    schema_versions integer[]     DEFAULT NULL,
    event_ids       uuid[]        DEFAULT NULL,
    occurred_ats    timestamptz[] DEFAULT NULL
) RETURNS uuid[]
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path FROM CURRENT
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    total integer := coalesce(cardinality(topics), 0);
    ids uuid[] := '{}';
    causes text[] := '{}';
    caused boolean := false;
    earlier integer[];
    written uuid[];
    woken bigint;
BEGIN
    IF total = 0 THEN
        RETURN '{}';
    END IF;
    IF coalesce(cardinality(aggregate_types), 0) <> total
       OR coalesce(cardinality(aggregate_ids), 0) <> total
       OR coalesce(cardinality(event_types), 0) <> total
       OR coalesce(cardinality(versions), 0) <> total
       OR coalesce(cardinality(payloads), 0) <> total
       OR (attributes IS NOT NULL AND cardinality(attributes) <> total)
       OR (schema_versions IS NOT NULL AND cardinality(schema_versions) <> total)
       OR (event_ids IS NOT NULL AND cardinality(event_ids) <> total)
       OR (occurred_ats IS NOT NULL AND cardinality(occurred_ats) <> total) THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('append_events: every array must have %s elements, one per event', total);
    END IF;
    -- For each event, the earlier one of the same (aggregate_id, version), if any.
    IF total > 1 THEN
        SELECT array_agg(e.prior ORDER BY e.i) INTO earlier
        FROM (SELECT i, lag(i) OVER (PARTITION BY a, v ORDER BY i) AS prior
              FROM unnest(aggregate_ids, versions) WITH ORDINALITY AS u(a, v, i)) e;
    END IF;
    FOR i IN 1 .. total LOOP
        ids[i] := coalesce(event_ids[i], new_event_id());
        IF NOT coalesce(outbox_plainly_valid(topics[i], aggregate_types[i], aggregate_ids[i],
                event_types[i], versions[i], schema_versions[i], payloads[i], attributes[i]), false) THEN
            PERFORM outbox_check_event(i, total, topics[i], aggregate_types[i], aggregate_ids[i],
                event_types[i], versions[i], schema_versions[i], payloads[i], attributes[i],
                occurred_ats[i]);
        END IF;
        -- AppendError::DuplicateVersion.
        IF earlier[i] IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = '22023',
                MESSAGE = format('events %s and %s are both version %s of aggregate %s',
                    ids[earlier[i]], ids[i], versions[i], aggregate_ids[i]),
                COLUMN = 'version';
        END IF;
        causes[i] := attributes[i] ->> 'causation_id';
        caused := caused OR causes[i] IS NOT NULL;
    END LOOP;
    IF NOT caused THEN
        -- One statement, as Outbox::append's: the ledger first (record_versions.sql: the
        -- transaction has its id before a row takes a seq, insert_events.sql says why), the
        -- rows, and the NOTIFY of each idle shard (wake_idle_shards.sql).
        WITH recorded AS (
            INSERT INTO outbox_versions (aggregate_id, version)
            SELECT * FROM unnest(aggregate_ids, versions)
            RETURNING 1
        ), inserted AS (
            INSERT INTO outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                                version, schema_version, payload, attributes, occurred_at)
            SELECT e.id, shard_of(e.aggregate_id, coalesce((SELECT s.shard_count FROM outbox_settings s), outbox_shard_count())), e.topic, e.aggregate_type,
                   e.aggregate_id, e.event_type, e.version, coalesce(e.schema_version, 1), e.payload,
                   jsonb_strip_nulls(coalesce(e.attributes, '{}')), coalesce(e.occurred_at, clock_timestamp())
            FROM unnest(ids, topics, aggregate_types, aggregate_ids, event_types, versions,
                        schema_versions, payloads, attributes, occurred_ats)
                AS e(id, topic, aggregate_type, aggregate_id, event_type, version,
                     schema_version, payload, attributes, occurred_at)
            WHERE EXISTS (SELECT 1 FROM recorded)
            RETURNING shard
        )
        SELECT count(pg_notify(current_schema() || '_outbox_wake', s.shard::text)) INTO woken
        FROM (SELECT DISTINCT shard FROM inserted) s
        WHERE (SELECT f.idle
               FROM outbox_idle_flags f
               WHERE f.shard = s.shard
               ORDER BY f.flag_seq DESC
               LIMIT 1);
        RETURN ids;
    END IF;
    WITH recorded AS (
        INSERT INTO outbox_versions (aggregate_id, version, causation_id)
        SELECT * FROM unnest(aggregate_ids, versions, causes)
        ON CONFLICT (aggregate_id, version, causation_id) WHERE causation_id IS NOT NULL DO NOTHING
        RETURNING aggregate_id, version
    ), inserted AS (
        INSERT INTO outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                            version, schema_version, payload, attributes, occurred_at)
        SELECT e.id, shard_of(e.aggregate_id, coalesce((SELECT s.shard_count FROM outbox_settings s), outbox_shard_count())), e.topic, e.aggregate_type,
               e.aggregate_id, e.event_type, e.version, coalesce(e.schema_version, 1), e.payload,
               jsonb_strip_nulls(coalesce(e.attributes, '{}')), coalesce(e.occurred_at, clock_timestamp())
        FROM unnest(ids, topics, aggregate_types, aggregate_ids, event_types, versions,
                    schema_versions, payloads, attributes, occurred_ats)
            AS e(id, topic, aggregate_type, aggregate_id, event_type, version,
                 schema_version, payload, attributes, occurred_at)
        JOIN recorded v ON v.aggregate_id = e.aggregate_id AND v.version = e.version
        RETURNING id, shard
    )
    SELECT (SELECT array_agg(id) FROM inserted),
           (SELECT count(pg_notify(current_schema() || '_outbox_wake', s.shard::text))
            FROM (SELECT DISTINCT shard FROM inserted) s
            WHERE (SELECT f.idle
                   FROM outbox_idle_flags f
                   WHERE f.shard = s.shard
                   ORDER BY f.flag_seq DESC
                   LIMIT 1))
    INTO written, woken;
    -- A replay of its cause wrote nothing: its id is NULL.
    RETURN ARRAY(SELECT CASE WHEN id = ANY (written) THEN id END
                 FROM unnest(ids) WITH ORDINALITY AS u(id, n) ORDER BY n);
END
$$;

-- Appends one event (append_events with one element); returns its id, NULL for a replay.
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
LANGUAGE sql VOLATILE
BEGIN ATOMIC
    SELECT (append_events(ARRAY[topic], ARRAY[aggregate_type], ARRAY[aggregate_id],
        ARRAY[event_type], ARRAY[version], ARRAY[payload], ARRAY[attributes],
        ARRAY[schema_version], ARRAY[event_id], ARRAY[occurred_at]))[1];
END;
