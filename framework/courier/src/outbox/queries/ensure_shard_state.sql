-- Makes sure shard $1 has its state row, which the claim records its token in. A new row says
-- "not idle", as a missing one did: the claimer writes `idle` at its first idle transition.
INSERT INTO {schema}.outbox_shard_state (shard, idle) VALUES ($1, false)
ON CONFLICT (shard) DO NOTHING
