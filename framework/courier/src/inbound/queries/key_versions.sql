-- The versions keys $2 of group $1 stand at (contiguous projections), locked for the
-- transaction (in key order, so concurrent transactions cannot deadlock here); a key without a
-- row has seen nothing yet.
SELECT routing_key, version FROM {schema}.projection_versions
WHERE consumer_group = $1 AND routing_key = ANY($2)
ORDER BY routing_key
FOR UPDATE
