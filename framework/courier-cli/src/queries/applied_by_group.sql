-- Events each consumer group applied over the last minute (its inbox rows).
SELECT consumer_group, count(*) AS applied
FROM {schema}.inbox
WHERE processed_at > now() - interval '1 minute'
GROUP BY consumer_group
