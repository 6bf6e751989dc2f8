-- Claims up to $4 rows of shard $1 for the owner whose lock token is $2, in append order.
-- A row is claimable when it is unpublished, not dead, due, and either unclaimed or claimed by
-- another (earlier) owner whose lease of $3 seconds has expired.
--
-- Scan start: the owner's rows in flight stay in outbox_ready until marked, and each costs the
-- scan a heap fetch to see its lock token (thousands with a slow broker or unique keys: most
-- of a claim's cost). So the owner passes $6, the lowest seq where a row may have appeared
-- since it last looked, and the never-failed rows are looked for from there; for a full scan,
-- when rows may have been left behind below it, it passes the shard's floor (claim_floor.sql,
-- relay/scan_from.rs), not 0, which would walk every row a pinned horizon keeps. Each row
-- returns the statement's snapshot bounds, with which the owner tells when the transactions
-- that were running as it looked have all ended.
--
-- Candidates: the shard's first $5 claimable rows in seq order, taken from two indexes that
-- hold no parked row, so a claim reads no row that is dead or waiting for its retry, however
-- many there are (0009_index_ready_and_retrying_rows.sql): outbox_ready (never failed, in seq
-- order) and outbox_retrying (failed, by retry time; the due ones are sorted by seq). The first
-- $5 of each, merged, are the first $5 of both: the rows one walk in seq order would find.
--
-- Head of line: no version may overtake an earlier unpublished one of its key.
-- * Rows behind a parked row (dead, or waiting for its retry) are skipped while choosing
--   candidates, so a parked key never stalls the shard (outbox_parked holds only those rows).
--   The probe sits in an OR, like the contested check below, so PostgreSQL runs it per
--   candidate, and only while the shard has a row in outbox_parked (`parked`). As a plain
--   NOT EXISTS it may become a join that reads every parked row: with statistics taken before
--   50,000 rows were parked, each candidate was compared with all of them (1.3 s a claim).
-- * Rows behind a row held by another owner's live claim are left for later. Such claims exist
--   only while the shard is contested: after its claim token changed (takeover, restart, or
--   two owners at once), until the other tokens' claims expire. `owner` records this token and
--   says whether the shard is contested; only then is the (costlier) check made. Rows behind this owner's own claims are
--   taken: each comes with `prev_version`, its key's closest earlier version unpublished now,
--   and its key publisher hands it to Pub/Sub only right behind that version, giving it back
--   untried otherwise (publisher/frontier.rs).
-- Candidates are locked and updated by ctid, the address they were read at, not looked up
-- again by seq in outbox_unpublished_seq (two hash probes a row, ~1.2 µs together in a SQL
-- loop of the relay's statements). A candidate updated after it was read is followed to its
-- newest version by the lock (`published_at IS NULL` rechecked there); the UPDATE then claims
-- that version, or, where its snapshot cannot see it, leaves the row for a later claim. As
-- with the lookups by seq before, the lock does not recheck the candidates' lease condition.
-- No index names lock_token or locked_at, so the claim's UPDATE is a HOT update
-- (0008_hot_claims.sql).
--
-- prev_version is the key's previous version, if that is unpublished. It is found without
-- walking the key's history (P9): the previous version appended comes from the version ledger
-- (insert-only: its newest entry below this version is live), and only that one version is
-- looked up among unpublished rows. A probe for the greatest unpublished version below this
-- one walked, while a long transaction pinned the xmin horizon, an index entry of every
-- version of the key published since the pin. If the previous version is published, so is
-- every one before it: a row goes out only right behind its previous version (or once it is
-- published). That makes the rule hold across topics too: a key's versions go out in order
-- even when they go to different topics. It is NULL without a probe for version 1, which no
-- version can precede (versions start at 1): the first event of every new aggregate (a fresh
-- UUID per entity) costs no index lookup. The version just below is looked up first, among
-- unpublished rows: in a backlog of a key's consecutive versions that one probe finds it, and
-- the ledger is read only when it is not there (published, or a gap in the versions); a drain
-- of 1,000 keys spent 29 µs of PostgreSQL's CPU per event on the relay's statements before the
-- ledger, 36 with it read for every row.
WITH changed AS (
    -- When the shard's claim token changes, the shard is contested until the last live claim
    -- of any other token ends (found by one scan of the shard's unpublished rows, only then).
    UPDATE {schema}.outbox_shard_state s
    SET claim_token = $2,
        contested_until = (SELECT max(f.locked_at) + make_interval(secs => $3)
                           FROM {schema}.outbox f
                           WHERE f.shard = $1 AND f.published_at IS NULL AND f.lock_token <> $2)
    WHERE s.shard = $1 AND s.claim_token IS DISTINCT FROM $2
    RETURNING s.contested_until
), owner AS (
    -- NULL without a state row (never ensured, see OutboxStore::claim): the check then runs.
    SELECT CASE WHEN EXISTS (SELECT 1 FROM changed)
                THEN coalesce((SELECT contested_until FROM changed) > now(), false)
                ELSE (SELECT coalesce(st.contested_until > now(), false)
                      FROM {schema}.outbox_shard_state st WHERE st.shard = $1)
           END AS contested
), parked AS (
    -- Whether the shard has any row in outbox_parked (one index entry read): if not, no
    -- candidate can be behind a parked row, and the per-candidate probe is skipped.
    SELECT EXISTS (SELECT 1
                   FROM {schema}.outbox p
                   WHERE p.shard = $1
                     AND p.published_at IS NULL
                     AND (p.dead_at IS NOT NULL OR p.next_retry_at IS NOT NULL)) AS present
), candidates AS (
    SELECT c.ctid, c.seq, c.aggregate_id, c.version
    FROM ((
        -- Never failed (or given a fresh start by an operator), from seq $6 on.
        SELECT o.ctid, o.seq, o.aggregate_id, o.version
        FROM {schema}.outbox o
        WHERE o.shard = $1
          AND o.seq >= $6
          AND o.published_at IS NULL
          AND o.dead_at IS NULL
          AND o.next_retry_at IS NULL
          AND (o.lock_token IS NULL
               OR (o.lock_token <> $2 AND o.locked_at < now() - make_interval(secs => $3)))
          AND (NOT (SELECT present FROM parked)
               OR {not_behind_a_parked_row})
        ORDER BY o.seq
        LIMIT $5
    ) UNION ALL (
        -- Failed, and its retry is due.
        SELECT o.ctid, o.seq, o.aggregate_id, o.version
        FROM {schema}.outbox o
        WHERE o.shard = $1
          AND o.published_at IS NULL
          AND o.dead_at IS NULL
          AND o.next_retry_at <= now()
          AND (o.lock_token IS NULL
               OR (o.lock_token <> $2 AND o.locked_at < now() - make_interval(secs => $3)))
          AND (NOT (SELECT present FROM parked)
               OR {not_behind_a_parked_row})
        ORDER BY o.seq
        LIMIT $5
    )) c
    ORDER BY c.seq
    LIMIT $5
), claimable AS (
    SELECT o.ctid
    FROM {schema}.outbox o
    JOIN candidates c ON c.ctid = o.ctid AND o.published_at IS NULL
    -- An OR, not a plain NOT EXISTS: PostgreSQL then runs the probe per candidate only when
    -- the shard is contested (an anti join would scan for it every time). A key's rows all
    -- have its shard: naming it lets the probe seek outbox_unpublished_versions (the only
    -- index on aggregate_id since 0015) instead of reading all of it.
    WHERE NOT (SELECT contested FROM owner)
       OR NOT EXISTS (
          SELECT 1
          FROM {schema}.outbox e
          WHERE e.shard = $1
            AND e.aggregate_id = c.aggregate_id
            AND e.version < c.version
            AND e.published_at IS NULL
            AND e.lock_token <> $2
            AND e.locked_at >= now() - make_interval(secs => $3))
    ORDER BY c.seq
    LIMIT $4
    FOR UPDATE OF o SKIP LOCKED
)
UPDATE {schema}.outbox o
SET lock_token = $2, locked_at = now()
FROM claimable c,
     -- Which transactions may still have been running when the claim looked: ids from the
     -- snapshot's xmin up to (not including) next_xid (relay/scan_from.rs uses them to know
     -- when rows it passed over have committed).
     (SELECT pg_snapshot_xmin(s)::text::bigint AS xmin,
             {next_xid} AS next_xid
      FROM pg_current_snapshot() s) snapshot
WHERE o.ctid = c.ctid AND o.published_at IS NULL
RETURNING o.seq, o.id, o.topic, o.aggregate_type, o.aggregate_id, o.event_type, o.version,
          o.schema_version, o.payload, o.attributes, o.occurred_at, o.publish_attempts,
          CASE WHEN o.version = 1 THEN NULL
               ELSE coalesce(
                    (SELECT e.version
                     FROM {schema}.outbox e
                     WHERE e.shard = o.shard
                       AND e.aggregate_id = o.aggregate_id
                       AND e.version = o.version - 1
                       AND e.published_at IS NULL),
                    (SELECT CASE
                            WHEN appended.version IS NULL THEN
                                -- Not in the ledger (appended before retention.version_hours):
                                -- the key has been quiet that long, so few versions to walk.
                                (SELECT max(e.version)
                                 FROM {schema}.outbox e
                                 WHERE e.shard = o.shard
                                   AND e.aggregate_id = o.aggregate_id
                                   AND e.version < o.version
                                   AND e.published_at IS NULL)
                            WHEN appended.version = o.version - 1 THEN
                                -- Looked up above: published.
                                NULL
                            ELSE
                                (SELECT e.version
                                 FROM {schema}.outbox e
                                 WHERE e.shard = o.shard
                                   AND e.aggregate_id = o.aggregate_id
                                   AND e.version = appended.version
                                   AND e.published_at IS NULL)
                            END
                     FROM (SELECT max(l.version) AS version
                           FROM {schema}.outbox_versions l
                           WHERE l.aggregate_id = o.aggregate_id
                             AND l.version < o.version) appended))
          END AS prev_version,
          snapshot.xmin, snapshot.next_xid,
          -- Where this UPDATE left the row: its mark finds it there (relay/row_address.rs).
          o.ctid,
          -- It waited for a retry: its key's later versions waited behind it.
          o.next_retry_at IS NOT NULL AS retried
