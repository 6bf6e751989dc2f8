-- Read model fed by engagement.video.events: one row per (video, user), at the version of the
-- engagement aggregate `<video_id>:<user_id>` it reflects. Written only by the projector,
-- through versioned upserts, so a replay or a late duplicate never moves a row backwards.
CREATE TABLE video_user_engagements_projection (
    video_id uuid NOT NULL,
    user_id uuid NOT NULL,
    views bigint NOT NULL DEFAULT 0,
    liked boolean NOT NULL DEFAULT false,
    position_secs bigint NOT NULL DEFAULT 0,
    completed boolean NOT NULL DEFAULT false,
    version bigint NOT NULL,
    projected_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (video_id, user_id)
);
