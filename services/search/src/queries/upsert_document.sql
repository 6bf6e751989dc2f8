-- A create or a snapshot: the video's whole state over an older version of its document, or a
-- new document. Returns the document as written; no row when it holds this version or newer.
INSERT INTO search_documents (video_id, title, description, status, version)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (video_id) DO UPDATE
SET title = EXCLUDED.title,
    description = EXCLUDED.description,
    status = EXCLUDED.status,
    version = EXCLUDED.version,
    indexed_at = now()
WHERE search_documents.version < EXCLUDED.version
RETURNING title, status
