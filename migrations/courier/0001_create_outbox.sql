-- The transactional outbox. Rows are appended in the caller's transaction and drained by the
-- relay. Every statement here runs with search_path set to the owning schema.
CREATE TABLE outbox (
    -- Stable order of appends; used for claim order and as the row's compact handle.
    seq              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id               uuid        NOT NULL UNIQUE,
    -- stable_hash(aggregate_id) % shard_count, computed by the writer.
    shard            integer     NOT NULL CHECK (shard >= 0),
    topic            text        NOT NULL,
    aggregate_type   text        NOT NULL,
    aggregate_id     text        NOT NULL,
    event_type       text        NOT NULL,
    version          bigint      NOT NULL CHECK (version >= 1),
    schema_version   integer     NOT NULL CHECK (schema_version >= 1),
    payload          bytea       NOT NULL,
    -- Optional attributes (correlation_id, causation_id, trace_id, source_service).
    attributes       jsonb       NOT NULL DEFAULT '{}'::jsonb,
    occurred_at      timestamptz NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    published_at     timestamptz,
    publish_attempts integer     NOT NULL DEFAULT 0,
    next_retry_at    timestamptz,
    last_error       text,
    -- Claim of the shard owner that is publishing the row; guards marking.
    lock_token       uuid,
    locked_at        timestamptz,
    -- Set when the row exhausted its attempts or failed permanently; blocks its key.
    dead_at          timestamptz,
    -- One version of an aggregate is one event: a second append of it is a caller bug.
    UNIQUE (aggregate_id, version)
);

-- The relay only ever looks at unpublished rows; keep that index small as history grows.
CREATE INDEX outbox_unpublished_by_shard ON outbox (shard, seq) WHERE published_at IS NULL;
-- Head-of-line check: "has this key an earlier unpublished version?"
CREATE INDEX outbox_unpublished_by_key ON outbox (aggregate_id, version) WHERE published_at IS NULL;
-- Retention deletes published rows by age.
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;
