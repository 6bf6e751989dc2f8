-- Marking a row published is a non-HOT update (every partial index names published_at), so the
-- marked row version gets an entry in each index whose predicate it meets: the primary key on
-- id, UNIQUE (aggregate_id, version) and outbox_published_at. Each unique index also checks
-- the new entry against the old one, fetching the old row version from the heap to see it is
-- our own update. The primary key's entry was 6–7 µs of a mark's 18–19 µs a row (load-tests:
-- drain with a key per row; a SQL loop of the relay's claim and mark statements over 200,000
-- rows: 18.2–19.0 µs a row with it, 11.6–12.2 without).
--
-- Nothing looks a row up by id once it is published: ids are looked up only by operators
-- retrying or skipping dead rows, which are unpublished. Event ids are UUIDv7, made by
-- NewEvent for each event. So ids are kept unique among unpublished rows (a partial index,
-- which a mark leaves alone), and (aggregate_id, version), unique over the whole history,
-- becomes the table's identity: a row is one version of one aggregate.
CREATE UNIQUE INDEX outbox_unpublished_id ON outbox (id) WHERE published_at IS NULL;
ALTER TABLE outbox DROP CONSTRAINT outbox_pkey;
ALTER TABLE outbox REPLICA IDENTITY USING INDEX outbox_aggregate_id_version_key;
