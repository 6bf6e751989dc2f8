-- The engagement service's write model: one row per (video, user) — the aggregate
-- `<video_id>:<user_id>` — with its version bumped by every event it emits.
CREATE TABLE engagements (
    video_id uuid NOT NULL,
    user_id uuid NOT NULL,
    views bigint NOT NULL DEFAULT 0 CHECK (views >= 0),
    liked boolean NOT NULL DEFAULT false,
    position_secs bigint NOT NULL DEFAULT 0 CHECK (position_secs >= 0),
    completed boolean NOT NULL DEFAULT false,
    version bigint NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (video_id, user_id)
);
