-- Open (not republished) dead letters per consumer group.
SELECT consumer_group, max(subscription) AS subscription, count(*) AS open
FROM {schema}.dead_letter_log
WHERE republished_at IS NULL
GROUP BY consumer_group
ORDER BY consumer_group
