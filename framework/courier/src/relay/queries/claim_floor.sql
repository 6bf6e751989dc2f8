-- What a full scan of shard $1 looks for first (relay/scan_from.rs): the lowest seq from $2 on of
-- a never-failed unpublished row that is not in flight with token $3 and not waiting behind a
-- parked row of its key (the same probe as claim.sql's), NULL if it sees none; the seq the next
-- row will get; and which of this database's transactions may have been running. Walks
-- outbox_ready from $2, the floor or where rows may still appear above it (relay/floor.rs,
-- Floor::look_from), so while a long transaction pins the xmin horizon it passes the entries of
-- the rows published since the last look, not of every row published since the pin (P9). The next
-- seq is read after the snapshot was taken: a transaction may have taken its id after the snapshot
-- and seqs before the read, so its rows lie below that seq unseen and not counted as running.
-- ScanFrom therefore uses it only as the bound of a later look.
WITH locks AS MATERIALIZED (
    SELECT locktype, virtualtransaction, transactionid, database, relation FROM pg_locks
), writers AS (
    -- Transactions holding a lock on this outbox (every insert holds one until it ends).
    SELECT virtualtransaction
    FROM locks
    WHERE locktype = 'relation'
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND relation = '{schema}.outbox'::regclass
)
SELECT (SELECT o.seq
        FROM {schema}.outbox o
        WHERE o.shard = $1
          AND o.seq >= $2
          AND o.published_at IS NULL
          AND o.dead_at IS NULL
          AND o.next_retry_at IS NULL
          AND o.lock_token IS DISTINCT FROM $3
          -- In an OR, as in claim.sql: a probe per row, made only while the shard has a
          -- parked row (a plain NOT EXISTS may become an anti join reading every
          -- unpublished version of the shard, the dead ones a pin keeps included).
          AND (NOT EXISTS (SELECT 1
                           FROM {schema}.outbox p
                           WHERE p.shard = $1
                             AND p.published_at IS NULL
                             AND (p.dead_at IS NOT NULL OR p.next_retry_at IS NOT NULL))
               OR {not_behind_a_parked_row})
        ORDER BY o.seq
        LIMIT 1) AS lowest,
       coalesce(pg_sequence_last_value(pg_get_serial_sequence('{schema}.outbox', 'seq')::regclass), 0) + 1
           AS next_seq,
       -- The lowest id of a transaction that may have been writing this outbox at the
       -- snapshot. A transaction seen running with no lock on the outbox has taken no seq (an
       -- insert locks the table before it takes one) and takes later ones only above every
       -- seq a look found so far, so a long one that writes other tables or other databases
       -- (a batch job, a report, a migration) does not hold this shard's floor (P9). Never
       -- above the snapshot's xmax. One read of the lock table: a transaction's id and its
       -- table locks are matched by its virtual id, in the same read.
       coalesce((SELECT min(x::text::bigint)
                 FROM pg_snapshot_xip(s) x
                 WHERE x::text::bigint % 4294967296 NOT IN (
                     SELECT t.transactionid::text::bigint
                     FROM locks t
                     WHERE t.locktype = 'transactionid'
                       AND t.virtualtransaction NOT IN (SELECT virtualtransaction FROM writers))),
                pg_snapshot_xmax(s)::text::bigint) AS xmin,
       {next_xid} AS next_xid
FROM pg_current_snapshot() s
