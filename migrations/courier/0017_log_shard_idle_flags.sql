-- Idle flags become an insert-only log (P9: a long transaction pinning the xmin horizon).
--
-- outbox_shard_state.idle was rewritten at every idle transition of a shard's claimer, and
-- read by every append (wake_idle_shards.sql) and every claim (the same row holds the claim
-- token). While a snapshot pins the horizon no old version of that row can be pruned, so each
-- read walked a chain as long as the transitions since the pin. A flag is now a new row; a
-- read takes the shard's newest entry (`ORDER BY flag_seq DESC LIMIT 1`), which is live, and
-- never reaches the dead ones below it. The janitor deletes all but the newest per shard.
-- outbox_shard_state keeps the claim token, which changes only on takeovers and restarts.
CREATE TABLE outbox_idle_flags (
    shard      integer     NOT NULL CHECK (shard >= 0),
    flag_seq   bigint      GENERATED ALWAYS AS IDENTITY,
    idle       boolean     NOT NULL,
    flagged_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (shard, flag_seq)
);
INSERT INTO outbox_idle_flags (shard, idle, flagged_at)
SELECT shard, idle, updated_at FROM outbox_shard_state ORDER BY shard;
ALTER TABLE outbox_shard_state DROP COLUMN idle, DROP COLUMN updated_at;
