-- Makes sure shard $1 has its state row, which the claim records its token in, and clears the
-- idle flags an earlier claimer left (all but the newest; run when a claimer first claims).
-- A shard without an idle flag counts as not idle: the claimer writes one at its first idle
-- transition.
WITH state AS (
    INSERT INTO {schema}.outbox_shard_state (shard) VALUES ($1)
    ON CONFLICT (shard) DO NOTHING
)
DELETE FROM {schema}.outbox_idle_flags f
WHERE f.shard = $1
  AND f.flag_seq < (SELECT g.flag_seq FROM {schema}.outbox_idle_flags g
                    WHERE g.shard = $1 ORDER BY g.flag_seq DESC LIMIT 1)
