-- Above every transaction id handed out before snapshot `s` was taken, unlike the snapshot's
-- xmax (the newest id completed plus one: a transaction with a higher id may be running,
-- unlisted). age() measures from this transaction's id or, before it has one, from the next
-- id to be handed out, read after the snapshot was taken. Written into claim.sql and
-- claim_floor.sql.
pg_snapshot_xmin(s)::text::bigint + age((pg_snapshot_xmin(s)::text::bigint % 4294967296)::text::xid)
