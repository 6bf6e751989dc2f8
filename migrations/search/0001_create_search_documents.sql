-- The search index: a document per catalog video, found by its title (weight A) and its
-- description (B). A deleted video keeps its row as a tombstone (status 'deleted', texts
-- emptied) so the row's version still orders what comes after it; only published videos are
-- found.
CREATE TABLE search_documents (
    video_id    uuid        PRIMARY KEY,
    title       text        NOT NULL,
    description text        NOT NULL,
    status      text        NOT NULL CHECK (status IN ('draft', 'published', 'deleted')),
    document    tsvector    GENERATED ALWAYS AS (
                    setweight(to_tsvector('english', title), 'A') ||
                    setweight(to_tsvector('english', description), 'B')) STORED,
    version     bigint      NOT NULL,
    indexed_at  timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX search_documents_found ON search_documents USING gin (document)
    WHERE status = 'published';
