SELECT EXISTS (SELECT 1 FROM {schema}.parked_keys WHERE consumer_group = $1 AND routing_key = $2)
