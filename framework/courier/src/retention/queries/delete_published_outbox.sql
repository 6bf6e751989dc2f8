-- Deletes up to $2 outbox rows published (or skipped) more than $1 hours ago, oldest first,
-- from published_at $3 on (where the janitor's previous batch stopped; NULL: from the
-- oldest); returns how many it deleted and the newest published_at among them. Dead and
-- pending rows have no published_at and are never touched. By ctid: the candidates come from
-- the partial index on published_at, the delete needs no second lookup.
--
-- Starting at $3 rather than at the index's oldest entry is what keeps a batch's cost flat
-- while a long transaction pins the xmin horizon: the rows earlier batches deleted keep their
-- index entries until vacuum may remove them, and a scan from the oldest entry would visit
-- each of them again (see retention/mod.rs).
WITH deleted AS (
    DELETE FROM {schema}.outbox
    WHERE ctid = ANY(ARRAY(
        SELECT ctid FROM {schema}.outbox
        WHERE published_at >= COALESCE($3::timestamptz, '-infinity')
          AND published_at < now() - make_interval(hours => $1)
        ORDER BY published_at
        LIMIT $2))
    RETURNING published_at)
SELECT count(*), max(published_at) FROM deleted
