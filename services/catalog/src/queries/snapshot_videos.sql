-- The next $2 videos after $1 in keyset order (from the start when $1 is NULL), each moved to
-- its next version, returned whole at that version. Locking them in id order and bumping the
-- version in the same statement serialises with live writes: a write committed before is in
-- the snapshot, a write waiting for the lock takes the version after it. updated_at stays:
-- the video did not change.
UPDATE videos v
SET version = v.version + 1
FROM (SELECT video_id FROM videos
      WHERE $1::uuid IS NULL OR video_id > $1::uuid
      ORDER BY video_id
      LIMIT $2
      FOR UPDATE) next
WHERE v.video_id = next.video_id
RETURNING v.video_id, v.uploader_id, v.title, v.description, v.duration_secs, v.published_at,
          v.status, v.version, v.created_at, v.updated_at, v.deleted_at, v.deleted_reason
