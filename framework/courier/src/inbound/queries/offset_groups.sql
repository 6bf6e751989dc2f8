-- Every consumer group with a saved offset: one backward index probe per group (a skip scan
-- that meets each group's newest entry first, never the older, possibly dead, ones).
WITH RECURSIVE groups AS (
    (SELECT consumer_group FROM {schema}.consumer_offset_log
     ORDER BY consumer_group DESC, lane DESC, reset_id DESC, publish_time DESC
     LIMIT 1)
    UNION ALL
    SELECT (SELECT o.consumer_group FROM {schema}.consumer_offset_log o
            WHERE o.consumer_group < g.consumer_group
            ORDER BY o.consumer_group DESC, o.lane DESC, o.reset_id DESC, o.publish_time DESC
            LIMIT 1)
    FROM groups g
    WHERE g.consumer_group IS NOT NULL
)
SELECT consumer_group FROM groups WHERE consumer_group IS NOT NULL ORDER BY 1
