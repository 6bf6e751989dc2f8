-- The floors of each relay's backlog gauge (relay/backlog.rs), recorded with its heartbeat:
-- element i is shard i's. `courier outbox stats`, `courier status` and the console count the
-- backlog from them, as the relay's gauges do, instead of walking every unpublished-looking
-- index entry, which a pinned xmin horizon makes one per row published since the pin (P9). A
-- settled floor stays a floor, so a dead relay's last ones still serve. The row is rewritten by
-- every heartbeat already; the array adds a few bytes to it.
ALTER TABLE relay_instances ADD COLUMN backlog_floors bigint[] NOT NULL DEFAULT '{}';
