-- Records whether shard $1's claimer is idle ($2; writers NOTIFY only idle shards) as a new
-- entry of the insert-only log whose newest entry per shard is the flag
-- (0017_log_shard_idle_flags.sql), and deletes the entry it supersedes ($3, the flag_seq the
-- claimer wrote last, NULL after a start): a delete by its exact key, which no pin slows.
WITH flagged AS (
    INSERT INTO {schema}.outbox_idle_flags (shard, idle) VALUES ($1, $2)
    RETURNING flag_seq
), superseded AS (
    DELETE FROM {schema}.outbox_idle_flags WHERE shard = $1 AND flag_seq = $3
)
SELECT flag_seq FROM flagged
