-- The outbox as a SQL contract: append_event / append_events let a producer in any language
-- append events in its own business transaction, applying what Outbox::append applies
-- (outbox/append.rs): the same validation and error messages (event.rs, attributes.rs), the
-- same shard, the version ledger, and the wake-up of an idle shard's claimer. docs/sql-producers.md
-- is the guide; tests/sql_producers.rs checks that both paths write identical rows.
--
-- * outbox_settings: the deployment's relay.shard_count, one row. `<service> migrate` and the
--   relay write it from their config at start (Outbox::record_shard_count); a row in a shard no
--   relay owns would never be published, so the functions refuse to append (SQLSTATE 55000)
--   until it is recorded, rather than guess.
-- * fnv1a_64 / shard_of: outbox/shard.rs's FNV-1a 64 of the UTF-8 bytes, in 32-bit halves so
--   no step overflows a bigint; the Rust and SQL hashes are checked equal on thousands of keys.
-- * append_events: SECURITY DEFINER with a fixed search_path (this schema, then pg_temp), so a
--   producer's role needs only EXECUTE (role <schema>_producer, below) and no right on the
--   tables. The NOTIFY channel is the schema's (<schema>_outbox_wake, append.rs's wake_channel).
CREATE TABLE outbox_settings (
    singleton   boolean     PRIMARY KEY DEFAULT true CHECK (singleton),
    shard_count integer     NOT NULL CHECK (shard_count BETWEEN 1 AND 1024),
    recorded_at timestamptz NOT NULL DEFAULT now()
);

-- The functions below run with this schema first and pg_temp last, whoever calls them.
SELECT set_config('search_path', current_setting('search_path') || ', pg_temp', true);

-- FNV-1a 64 of `key`'s UTF-8 bytes, as the bigint with the same bits as shard.rs's u64.
-- hash * prime mod 2^64, prime = 2^40 + 0x1b3, on halves: lo' = low 32 bits of lo * 0x1b3,
-- hi' = (hi * 0x1b3 + carry + (lo << 8)) mod 2^32 (the 2^40 term moves lo 8 bits into hi).
CREATE FUNCTION fnv1a_64(key text) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    bytes bytea := convert_to(key, 'UTF8');
    hi bigint := 3421674724;  -- 0xcbf29ce4
    lo bigint := 2216829733;  -- 0x84222325
    m bigint;
BEGIN
    FOR i IN 0 .. length(bytes) - 1 LOOP
        lo := lo # get_byte(bytes, i);
        m := lo * 435;  -- 0x1b3
        hi := (hi * 435 + (m >> 32) + (lo << 8)) & 4294967295;
        lo := m & 4294967295;
    END LOOP;
    RETURN (hi << 32) | lo;
END
$$;

-- The shard of `aggregate_id` among `shard_count` shards: shard.rs's shard_of, the u64 hash
-- modulo the count (a negative bigint is the u64 minus 2^64).
CREATE FUNCTION shard_of(aggregate_id text, shard_count integer) RETURNS integer
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path FROM CURRENT
AS $$
DECLARE
    h bigint := fnv1a_64(aggregate_id);
    n bigint := greatest(shard_count, 1);
BEGIN
    IF h >= 0 THEN
        RETURN h % n;
    END IF;
    RETURN ((h % n) + n + ((4294967296 % n) * (4294967296 % n)) % n) % n;
END
$$;

-- The deployment's relay.shard_count, or SQLSTATE 55000 while none is recorded.
CREATE FUNCTION outbox_shard_count() RETURNS integer
LANGUAGE plpgsql STABLE
SET search_path FROM CURRENT
AS $$
DECLARE
    n integer;
BEGIN
    SELECT s.shard_count INTO n FROM outbox_settings s;
    IF n IS NULL THEN
        RAISE EXCEPTION USING
            ERRCODE = '55000',
            MESSAGE = format('the shard count is not recorded in %I.outbox_settings', current_schema()),
            HINT = 'run the service''s migrate command or start its relay (either records relay.shard_count)';
    END IF;
    RETURN n;
END
$$;

-- Rust's `{:?}` of a string (event.rs quotes values that way in its messages).
CREATE FUNCTION outbox_quote(value text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '"' || replace(replace(replace(replace(replace(coalesce(value, ''),
        '\', '\\'), '"', '\"'), E'\n', '\n'), E'\r', '\r'), E'\t', '\t') || '"'
$$;

-- Refuses an event: SQLSTATE 22023, the field in the error's column name and in the message,
-- which reads as InvalidEvent's (`event field <field> is invalid: <reason>`).
CREATE FUNCTION outbox_refuse(field text, reason text, pos integer, total integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    RAISE EXCEPTION USING
        ERRCODE = '22023',
        MESSAGE = format('event field %s is invalid: %s', field, reason),
        COLUMN = field,
        DETAIL = format('event %s of %s in the call', pos, total);
END
$$;

-- Appends events, element i of each array making event i, in the caller's transaction:
-- validated all first (one invalid event writes none), the version ledger, the rows, then a
-- NOTIFY for each idle shard among theirs, delivered only if the caller commits. Returns the
-- event ids in order. attributes: the optional attributes (correlation_id, causation_id,
-- user_id, source_service, source_version, trace_id, span_id, traceparent) as a JSON object of
-- strings; a null value is an unset one. NULL arrays of the optional columns, or NULL
-- elements, take the defaults: no attributes, schema version 1, a fresh UUIDv7, now.
CREATE FUNCTION append_events(
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
-- The generic plans of its statements: a custom plan for a one-element array is costed below
-- the generic one (PostgreSQL guesses ten elements for an array parameter), so each call
-- would plan the insert anew, twice the time of the rest of a one-event call.
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    total integer := coalesce(cardinality(topics), 0);
    optional constant text[] := ARRAY['correlation_id', 'causation_id', 'user_id',
        'source_service', 'source_version', 'trace_id', 'span_id', 'traceparent'];
    -- The attributes whose values vary, in the byte order event.rs checks them in.
    sized constant text[] := ARRAY['aggregate_id', 'aggregate_type', 'causation_id',
        'correlation_id', 'event_type', 'source_service', 'source_version', 'span_id',
        'trace_id', 'traceparent', 'user_id'];
    shard_count integer;
    ids uuid[] := '{}';
    shards integer[] := '{}';
    svs integer[] := '{}';
    attrs jsonb[] := '{}';
    occurred timestamptz[] := '{}';
    earlier integer[];
    v_topic text;
    v_id text;
    v_type text;
    v_event_type text;
    v_version bigint;
    v_sv integer;
    v_payload bytea;
    v_attrs jsonb;
    v_all jsonb;
    v_event_id uuid;
    v_at timestamptz;
    v_key text;
    v_value jsonb;
    v_text text;
    v_bad text;
    attribute_bytes bigint;
    message_bytes bigint;
    longest integer;
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
    shard_count := outbox_shard_count();
    -- For each event, the earlier one of the same (aggregate_id, version), if any.
    IF total > 1 THEN
        SELECT array_agg(e.prior ORDER BY e.i) INTO earlier
        FROM (SELECT i, lag(i) OVER (PARTITION BY a, v ORDER BY i) AS prior
              FROM unnest(aggregate_ids, versions) WITH ORDINALITY AS u(a, v, i)) e;
    END IF;
    FOR i IN 1 .. total LOOP
        v_topic := coalesce(topics[i], '');
        v_type := coalesce(aggregate_types[i], '');
        v_id := coalesce(aggregate_ids[i], '');
        v_event_type := coalesce(event_types[i], '');
        v_version := versions[i];
        v_sv := coalesce(schema_versions[i], 1);
        v_payload := payloads[i];
        v_attrs := coalesce(attributes[i], '{}');
        v_event_id := coalesce(event_ids[i], new_event_id());
        v_at := coalesce(occurred_ats[i], clock_timestamp());
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
        IF btrim(v_type, E' \t\n\r\x0B\f\u0085\u00A0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200A\u2028\u2029\u202F\u205F\u3000') = '' THEN
            PERFORM outbox_refuse('aggregate_type', 'must not be empty', i, total);
        END IF;
        IF btrim(v_id, E' \t\n\r\x0B\f\u0085\u00A0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200A\u2028\u2029\u202F\u205F\u3000') = '' THEN
            PERFORM outbox_refuse('aggregate_id', 'must not be empty', i, total);
        END IF;
        IF btrim(v_event_type, E' \t\n\r\x0B\f\u0085\u00A0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200A\u2028\u2029\u202F\u205F\u3000') = '' THEN
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
        IF v_attrs <> '{}' THEN
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
            v_attrs := jsonb_strip_nulls(v_attrs);
        END IF;
        IF longest > 1024 THEN
            -- The first too long in the attributes' byte order, as event.rs reports it.
            v_all := v_attrs || jsonb_build_object('aggregate_id', v_id, 'aggregate_type', v_type,
                'event_type', v_event_type);
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
        -- AppendError::DuplicateVersion.
        IF earlier[i] IS NOT NULL THEN
            RAISE EXCEPTION USING
                ERRCODE = '22023',
                MESSAGE = format('events %s and %s are both version %s of aggregate %s',
                    ids[earlier[i]], v_event_id, v_version, v_id),
                COLUMN = 'version';
        END IF;
        ids := ids || v_event_id;
        shards := shards || shard_of(v_id, shard_count);
        svs := svs || v_sv;
        attrs := attrs || v_attrs;
        occurred := occurred || v_at;
    END LOOP;
    -- One statement, as Outbox::append's: the ledger first (record_versions.sql: the
    -- transaction has its id before a row takes a seq, insert_events.sql says why), the rows,
    -- and the NOTIFY of each idle shard (wake_idle_shards.sql).
    WITH recorded AS (
        INSERT INTO outbox_versions (aggregate_id, version)
        SELECT * FROM unnest(aggregate_ids, versions)
        RETURNING 1
    ), inserted AS (
        INSERT INTO outbox (id, shard, topic, aggregate_type, aggregate_id, event_type,
                            version, schema_version, payload, attributes, occurred_at)
        SELECT * FROM unnest(ids, shards, topics, aggregate_types, aggregate_ids, event_types,
                             versions, svs, payloads, attrs, occurred)
        WHERE EXISTS (SELECT 1 FROM recorded)
    )
    SELECT count(pg_notify(current_schema() || '_outbox_wake', s.shard::text)) INTO woken
    FROM (SELECT DISTINCT unnest(shards) AS shard) s
    WHERE (SELECT f.idle
           FROM outbox_idle_flags f
           WHERE f.shard = s.shard
           ORDER BY f.flag_seq DESC
           LIMIT 1);
    RETURN ids;
END
$$;

-- A time-ordered UUIDv7 (PostgreSQL 15 has no uuidv7()): the millisecond clock over a random
-- UUIDv4's first 48 bits, version nibble 4 → 7.
CREATE FUNCTION new_event_id() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
    SELECT encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
        FROM 1 FOR 6), 52, 1), 53, 1), 'hex')::uuid
$$;

-- Appends one event (append_events with one element); returns its id.
CREATE FUNCTION append_event(
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
BEGIN
    RETURN (append_events(ARRAY[topic], ARRAY[aggregate_type], ARRAY[aggregate_id],
        ARRAY[event_type], ARRAY[version], ARRAY[payload], ARRAY[attributes],
        ARRAY[schema_version], ARRAY[event_id], ARRAY[occurred_at]))[1];
END
$$;

-- Only a producer's role calls the appends (they run with the schema owner's rights).
REVOKE ALL ON FUNCTION append_events(text[], text[], text[], text[], bigint[], bytea[], jsonb[],
    integer[], uuid[], timestamptz[]) FROM PUBLIC;
REVOKE ALL ON FUNCTION append_event(text, text, text, text, bigint, bytea, jsonb, integer, uuid,
    timestamptz) FROM PUBLIC;

-- <schema>_producer: the role a producer's own login role is made a member of
-- (GRANT catalog_producer TO orders_go). `<service> migrate` creates it before the migrations
-- (migrate.rs); a migrator allowed to create roles creates it here otherwise. It gets the
-- schema's USAGE and EXECUTE on the appends and the shard functions, nothing on the tables.
DO $$
DECLARE
    producer text := current_schema() || '_producer';
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = producer) THEN
        BEGIN
            EXECUTE format('CREATE ROLE %I NOLOGIN', producer);
        EXCEPTION
            WHEN duplicate_object OR unique_violation THEN NULL;
            WHEN insufficient_privilege THEN
                RAISE WARNING 'role % is missing and cannot be created here: grant EXECUTE on %.append_event and %.append_events to producers by hand',
                    producer, current_schema(), current_schema();
                RETURN;
        END;
    END IF;
    EXECUTE format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), producer);
    EXECUTE format('GRANT EXECUTE ON FUNCTION
        append_events(text[], text[], text[], text[], bigint[], bytea[], jsonb[], integer[], uuid[], timestamptz[]),
        append_event(text, text, text, text, bigint, bytea, jsonb, integer, uuid, timestamptz),
        fnv1a_64(text), shard_of(text, integer) TO %I', producer);
END
$$;
