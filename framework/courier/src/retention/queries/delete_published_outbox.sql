-- Deletes up to $2 outbox rows published (or skipped) more than $1 hours ago. Dead and
-- pending rows have no published_at and are never touched. By ctid: the candidates come from
-- the partial index on published_at, the delete needs no second lookup.
DELETE FROM {schema}.outbox
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM {schema}.outbox
    WHERE published_at < now() - make_interval(hours => $1)
    LIMIT $2))
