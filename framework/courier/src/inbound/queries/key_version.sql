-- The version key $2 of group $1 stands at (contiguous projections), locked for the
-- transaction; no row: the key has seen nothing yet.
SELECT version FROM {schema}.projection_versions
WHERE consumer_group = $1 AND routing_key = $2
FOR UPDATE
