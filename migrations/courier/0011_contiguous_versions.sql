-- Projections of delta events ("contiguous versions"): version n+1 of a key applies only on
-- top of n. The version each key of a consumer group stands at is written in the projection's
-- transaction. A key whose next version does not come within consumer.gap_wait_secs is parked:
-- its waiting events are kept here (and acked in Pub/Sub, so its dead-lettering does not
-- cascade) until an operator releases it (`courier parked release`), which republishes them.
CREATE TABLE projection_versions (
    consumer_group     text        NOT NULL,
    routing_key        text        NOT NULL,
    version            bigint      NOT NULL,
    -- Publish time of the key's first applied event: an offset reset to before it forgets the
    -- row, so the replay applies the key from its start.
    first_publish_time timestamptz NOT NULL,
    PRIMARY KEY (consumer_group, routing_key)
);

CREATE TABLE parked_keys (
    consumer_group   text        NOT NULL,
    routing_key      text        NOT NULL,
    subscription     text        NOT NULL,
    -- The version the key waits for.
    expected_version bigint      NOT NULL,
    reason           text        NOT NULL,
    parked_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, routing_key)
);

CREATE TABLE parked_events (
    consumer_group text        NOT NULL,
    routing_key    text        NOT NULL,
    event_id       uuid        NOT NULL,
    version        bigint      NOT NULL,
    message_id     text        NOT NULL,
    ordering_key   text        NOT NULL,
    attributes     jsonb       NOT NULL,
    data           bytea       NOT NULL,
    publish_time   timestamptz NOT NULL,
    parked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer_group, routing_key, event_id)
);

-- Who released a parked key, how (skipping to a version, or after the missing event was
-- republished), and how many held events went back to the topic.
CREATE TABLE parked_key_releases (
    id                 bigserial   PRIMARY KEY,
    consumer_group     text        NOT NULL,
    routing_key        text        NOT NULL,
    expected_version   bigint      NOT NULL,
    skipped_to         bigint,
    events_republished integer     NOT NULL,
    released_by        text        NOT NULL,
    reason             text        NOT NULL,
    released_at        timestamptz NOT NULL DEFAULT now()
);
