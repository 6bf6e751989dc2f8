-- Marks rows published by deleting them (`retention.outbox_hours = 0`: no published history
-- is kept), found at the addresses their claim left them at (relay/row_address.rs), with
-- the same guard as mark_published.sql (and, as there, no `published_at IS NULL`). A delete
-- writes no new row version and no index entry, where marking by update writes both (the
-- marked version cannot be a HOT update: `published_at` is in every partial index's
-- predicate): in a SQL loop of the relay's statements, 0.7 µs a row against 8–9 while the
-- update also wrote the (aggregate_id, version) key, which moved to the version ledger in 0015.
DELETE FROM {schema}.outbox
WHERE ctid = ANY($1::tid[]) AND lock_token = $2
