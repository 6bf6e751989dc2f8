-- The version each key of a delta projection stands at is appended, no longer rewritten in
-- place (P9).
--
-- Every projection transaction of a key read its row in projection_versions FOR UPDATE and
-- moved it to the new version. While a long transaction pins the xmin horizon no version of
-- that row can be removed: each read followed the key's chain of dead versions to its end, and
-- once the row's page filled, each move left an index entry more to walk too. Now:
--
-- * projection_keys: a row per key seen, written once (with the publish time of the key's
--   first applied event, which an offset reset to before it compares) and never updated.
--   Transactions of a key lock its row (FOR UPDATE writes no new row version) so they run one
--   at a time. Not an advisory lock: a transaction of 500 keys would take 500 of the server's
--   shared lock slots (max_locks_per_transaction).
-- * projection_version_log: a key's versions. A move appends the new entry and deletes the one
--   it replaces, by its address: a key's newest entry is the first one a backward index scan
--   meets, and the dead ones a pin keeps below it are never walked.
-- * projection_versions: a view with the table's old columns.
--
-- Names compare byte-wise (COLLATE "C"): every read and move compares them, and their order
-- means only the order rows are locked in.
CREATE TABLE projection_keys (
    consumer_group     text        COLLATE "C" NOT NULL,
    routing_key        text        COLLATE "C" NOT NULL,
    first_publish_time timestamptz NOT NULL,
    PRIMARY KEY (consumer_group, routing_key)
);

CREATE TABLE projection_version_log (
    consumer_group text   COLLATE "C" NOT NULL,
    routing_key    text   COLLATE "C" NOT NULL,
    version        bigint NOT NULL,
    PRIMARY KEY (consumer_group, routing_key, version)
);

INSERT INTO projection_keys (consumer_group, routing_key, first_publish_time)
SELECT consumer_group, routing_key, first_publish_time FROM projection_versions;

INSERT INTO projection_version_log (consumer_group, routing_key, version)
SELECT consumer_group, routing_key, version FROM projection_versions;

DROP TABLE projection_versions;

CREATE VIEW projection_versions AS
SELECT k.consumer_group, k.routing_key, v.version, k.first_publish_time
FROM projection_keys k
CROSS JOIN LATERAL (
    SELECT l.version FROM projection_version_log l
    WHERE l.consumer_group = k.consumer_group AND l.routing_key = k.routing_key
    ORDER BY l.version DESC
    LIMIT 1
) AS v;
