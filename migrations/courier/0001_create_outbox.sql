-- The transactional outbox. Rows are appended in the caller's transaction and drained by the
-- relay. Every statement here runs with search_path set to the owning schema.
CREATE TABLE outbox (
    -- Stable order of appends; used for claim order and as the row's compact handle. Not a
    -- btree key on purpose: the only ordered index on seq must be the per-shard partial one
    -- below, so the claim plan never walks published history (see outbox_seq).
    seq              bigint GENERATED ALWAYS AS IDENTITY,
    id               uuid        PRIMARY KEY,
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

-- Claim order within a shard, over unpublished rows only: stays small as history grows.
CREATE INDEX outbox_unpublished_by_shard ON outbox (shard, seq) WHERE published_at IS NULL;
-- Rows by handle (marking, joins). A hash index gives no order, so no plan can scan history
-- in seq order instead of using outbox_unpublished_by_shard (stale statistics on a queue table
-- made PostgreSQL pick a btree on seq and walk every published row).
CREATE INDEX outbox_seq ON outbox USING hash (seq);
-- Head-of-line check: the few rows that block their key's later versions (claimed, waiting
-- for a retry, dead).
CREATE INDEX outbox_blocking ON outbox (shard, aggregate_id, version)
    WHERE published_at IS NULL
      AND (lock_token IS NOT NULL OR dead_at IS NOT NULL OR next_retry_at IS NOT NULL);
-- Retention deletes published rows by age.
CREATE INDEX outbox_published_at ON outbox (published_at) WHERE published_at IS NOT NULL;

-- A queue table: rows turn over fast, so vacuum and analyze it far more often than the
-- defaults (20 % / 10 % of the table) would.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_analyze_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_analyze_threshold = 1000
);
