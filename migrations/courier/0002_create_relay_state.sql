-- Relay coordination state.

-- One row per shard: whether its claimer is idle (polling backed off). Writers send the wake-up
-- NOTIFY only for idle shards, because NOTIFY takes a global lock at commit that costs 30-50 %
-- of write throughput; a busy claimer does not need waking.
CREATE TABLE outbox_shard_state (
    shard      integer PRIMARY KEY CHECK (shard >= 0),
    idle       boolean     NOT NULL DEFAULT true,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- Live relay processes, so each can compute its fair share of the shards.
CREATE TABLE relay_instances (
    instance_id  uuid PRIMARY KEY,
    started_at   timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    owned_shards integer[]   NOT NULL DEFAULT '{}'
);
