-- Replica of the catalog's videos, fed by catalog.video.events; used to refuse engagement
-- with unknown or deleted videos. Written only by the projector, through versioned upserts.
CREATE TABLE videos_replica (
    video_id uuid PRIMARY KEY,
    uploader_id uuid,
    title text NOT NULL DEFAULT '',
    duration_secs bigint NOT NULL DEFAULT 0,
    status text NOT NULL DEFAULT 'published',
    deleted_at timestamptz,
    version bigint NOT NULL,
    replicated_at timestamptz NOT NULL DEFAULT now()
);
