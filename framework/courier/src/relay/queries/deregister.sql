-- A relay shutting down gracefully forgets itself, so the others' next heartbeat counts one
-- instance less and their fair share grows at once.
DELETE FROM {schema}.relay_instances WHERE instance_id = $1
