-- The body of `WITH newest AS (…)` in save_offset.sql and prune_offsets.sql: lane $2 of group
-- $1's newest entry, (reset_id, publish time). Looked for from ({reset}, {time}) first, where
-- this store last saw the lane's newest: an entry under a later reset, else one from that
-- position up, else (seen nowhere yet, or seen in a transaction that rolled back) the whole
-- lane. A backward index scan returns the newest entry first but reads every entry of the lane
-- on the index page it starts on, and a pinned horizon fills that page with the dead entries of
-- earlier saves and prunes; bounded, the scan stops at the position seen. Whichever look
-- answers, its entry is the lane's newest: the position decides how far a scan goes, never
-- the answer. A NULL position ends the first two looks before they read anything.
(SELECT reset_id, publish_time FROM {schema}.consumer_offset_log
 WHERE consumer_group = $1 AND lane = $2 AND reset_id > {reset}
 ORDER BY reset_id DESC, publish_time DESC
 LIMIT 1)
UNION ALL
(SELECT reset_id, publish_time FROM {schema}.consumer_offset_log
 WHERE consumer_group = $1 AND lane = $2 AND reset_id = {reset} AND publish_time >= {time}
 ORDER BY reset_id DESC, publish_time DESC
 LIMIT 1)
UNION ALL
(SELECT reset_id, publish_time FROM {schema}.consumer_offset_log
 WHERE consumer_group = $1 AND lane = $2
 ORDER BY reset_id DESC, publish_time DESC
 LIMIT 1)
LIMIT 1
