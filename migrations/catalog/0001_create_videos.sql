-- The catalog's write model: one row per video, its version bumped by every change.
-- A deleted video keeps its row (status 'deleted') so its id is never reused.
CREATE TABLE videos (
    video_id uuid PRIMARY KEY,
    uploader_id uuid NOT NULL,
    title text NOT NULL,
    description text NOT NULL DEFAULT '',
    duration_secs bigint NOT NULL CHECK (duration_secs >= 0),
    published_at timestamptz,
    status text NOT NULL CHECK (status IN ('draft', 'published', 'deleted')),
    version bigint NOT NULL CHECK (version >= 1),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz,
    deleted_reason text
);
