-- Each claimed row comes with its key's closest earlier unpublished version (claim.sql,
-- `prev_version`): the row its key publisher must already have out before handing this one
-- to the client (outbox/publisher/frontier.rs). One probe of this index per claimed row.
CREATE INDEX outbox_unpublished_versions ON outbox (shard, aggregate_id, version)
    WHERE published_at IS NULL;
