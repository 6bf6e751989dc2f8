-- wake_idle_shards.sql for an append whose events all go to one shard ({shard}), as most do: one
-- probe of the shard's newest flag. The many-shard form's generic plan is costed for ten shards
-- (PostgreSQL's guess for an array parameter), ten times this one's, so PostgreSQL planned that
-- statement anew at every append (127 µs, as much as running it); this one's generic plan costs
-- what a custom one does, and PostgreSQL keeps it.
SELECT pg_notify({channel}, {shard}::integer::text)
WHERE (SELECT f.idle
       FROM {schema}.outbox_idle_flags f
       WHERE f.shard = {shard}
       ORDER BY f.flag_seq DESC
       LIMIT 1)
