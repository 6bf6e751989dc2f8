-- Videos after $1 in keyset order (all when $1 is NULL): what a backfill has left to do.
SELECT count(*) FROM videos WHERE $1::uuid IS NULL OR video_id > $1::uuid
