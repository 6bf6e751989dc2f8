-- An update (absent fields, $2–$4 NULL, keep their value) or a delete (status 'deleted'),
-- over an older version of the document. Returns the document as written; no row when there
-- is no document or it holds this version or newer.
UPDATE search_documents
SET title = COALESCE($2, title),
    description = COALESCE($3, description),
    status = COALESCE($4, status),
    version = $5,
    indexed_at = now()
WHERE video_id = $1 AND version < $5
RETURNING title, status
